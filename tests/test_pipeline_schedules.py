"""Schedules as pure functions: hand-written tables, the validator's rejections, the simulator's
closed forms (seminar notes "Large-scale DL optimizations" §1.2.3; ANCHORS.md, pipeline formulas)."""

import pytest

from scaletrain.pipeline import (Action, ScheduleError, costs_from_timeline, gpipe, interleaved_1f1b, one_f_one_b,
                                 sampled_bubble, simulate, validate, zb_h1)


def table(rows: dict[int, str], stage_of=None) -> dict[int, list[Action]]:
    """{rank: "F0 F1 B0"} -> schedule; "F2@3" names stage 3 (default: the rank's own stage)."""
    out = {}
    for r, text in rows.items():
        acts = []
        for tok in text.split():
            body, _, stage = tok.partition("@")
            acts.append(Action(int(stage) if stage else r, body[0], int(body[1:])))
        out[r] = acts
    return out


def test_gpipe_table():
    assert gpipe(2, 3) == table({0: "F0 F1 F2 B0 B1 B2", 1: "F0 F1 F2 B0 B1 B2"})


def test_one_f_one_b_table():
    assert one_f_one_b(3, 4) == table({
        0: "F0 F1 F2 B0 F3 B1 B2 B3",   # warm-up 2, steady 2 pairs, cool-down 2
        1: "F0 F1 B0 F2 B1 F3 B2 B3",   # warm-up 1
        2: "F0 B0 F1 B1 F2 B2 F3 B3",   # last stage: strictly alternating
    })


def test_interleaved_table():
    # p=2, v=2: rank 0 holds stages 0, 2; rank 1 holds 1, 3. Microbatches in groups of p per chunk.
    assert interleaved_1f1b(2, 4, 2) == table({
        0: "F0@0 F1@0 F0@2 F1@2 F2@0 B0@2 F3@0 B1@2 F2@2 B0@0 F3@2 B1@0 B2@2 B3@2 B2@0 B3@0",
        1: "F0@1 F1@1 F0@3 B0@3 F1@3 B1@3 F2@1 B0@1 F3@1 B1@1 F2@3 B2@3 F3@3 B3@3 B2@1 B3@1",
    })


def test_zb_h1_table():
    # rank r holds back its first r weight passes and runs them at the end
    assert zb_h1(3, 4) == table({
        0: "F0 F1 F2 I0 W0 F3 I1 W1 I2 W2 I3 W3",
        1: "F0 F1 I0 F2 I1 W0 F3 I2 W1 I3 W2 W3",
        2: "F0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3",
    })


GENERATED = [("gpipe", lambda p, m: gpipe(p, m), 1), ("1f1b", lambda p, m: one_f_one_b(p, m), 1),
             ("zb_h1", lambda p, m: zb_h1(p, m), 1), ("interleaved2", lambda p, m: interleaved_1f1b(p, m, 2), 2),
             ("interleaved3", lambda p, m: interleaved_1f1b(p, m, 3), 3)]


@pytest.mark.parametrize("name,make,v", GENERATED, ids=[g[0] for g in GENERATED])
def test_simulator_matches_closed_forms(name, make, v):
    checked = 0
    for p in range(1, 7):
        for m in sorted({p, p + 1, 2 * p, 2 * p + 1, 3 * p, 5 * p + 2}):
            if v > 1 and m % p:
                continue
            schedule = make(p, m)
            validate(schedule, p, m, v)
            sim = simulate(schedule, t_f=1.0, t_b=2.0)  # zb_h1: t_I = t_W = 1 = t_F
            expected = {"gpipe": (p - 1) / (m + p - 1), "1f1b": (p - 1) / (m + p - 1),
                        "zb_h1": (p - 1) / (3 * m + p - 1)}.get(name, (p - 1) / (v * m + p - 1))
            assert sim.bubble_fraction == pytest.approx(expected, abs=1e-12), (p, m)
            peak = {"gpipe": [m] * p, "1f1b": [p - r for r in range(p)], "zb_h1": [p] * p}.get(name)
            if peak is not None:
                assert list(sim.peak_in_flight) == peak, (p, m)
            checked += 1
    assert checked >= 20


def test_gpipe_makespan_with_communication():
    # forward fill and backward drain each cross p-1 links: (m+p-1)(t_f+t_b) + 2(p-1) t_comm
    for p, m in [(2, 3), (4, 8), (5, 2)]:
        sim = simulate(gpipe(p, m), t_f=1.0, t_b=3.0, t_comm=0.25)
        assert sim.makespan == pytest.approx((m + p - 1) * 4.0 + 2 * (p - 1) * 0.25)


def test_uneven_stages_are_limited_by_the_slowest():
    # forward-only GPipe (t_b = 0): the last forward ends at sum(c) + (m - 1) * max(c)
    cost = [1.0, 3.0, 2.0]
    for m in (1, 4, 7):
        sim = simulate(gpipe(3, m), t_f=lambda a: cost[a.stage], t_b=0.0)
        assert sim.makespan == pytest.approx(sum(cost) + (m - 1) * max(cost))


@pytest.mark.parametrize("schedule", [one_f_one_b(4, 6), zb_h1(3, 5), interleaved_1f1b(2, 4, 2)],
                         ids=["1f1b", "zb_h1", "interleaved"])
def test_costs_fitted_to_a_timeline_recover_the_simulated_costs(schedule):
    truth = dict(t_f=1.5, t_b=2.6, t_i=1.0, t_w=1.6, t_comm=0.3)
    fitted = costs_from_timeline(simulate(schedule, **truth).spans)
    kinds = {a.kind for acts in schedule.values() for a in acts}
    for key, kind in (("t_f", "F"), ("t_i", "I"), ("t_w", "W"), ("t_comm", None)):
        if kind is None or kind in kinds:
            assert fitted[key] == pytest.approx(truth[key]), key
    assert fitted["t_b"] == pytest.approx(truth["t_b"])  # B itself, or I + W for a split schedule


def test_simulator_spans_respect_dependencies():
    sim = simulate(interleaved_1f1b(3, 6, 2), t_comm=0.5)
    end = {s.action: s.end for s in sim.spans}
    for s in sim.spans:
        a = s.action
        if a.kind == "F" and a.stage > 0:
            assert s.start >= end[Action(a.stage - 1, "F", a.microbatch)] + 0.5
        if a.kind == "B" and a.stage < 5:
            assert s.start >= end[Action(a.stage + 1, "B", a.microbatch)] + 0.5


@pytest.mark.parametrize("call,needle", [
    (lambda: one_f_one_b(4, 3), "m >= p"),
    (lambda: zb_h1(3, 2), "m >= p"),
    (lambda: interleaved_1f1b(3, 4, 2), "multiple of p"),
    (lambda: interleaved_1f1b(2, 4, 1), "v >= 2"),
    (lambda: gpipe(0, 4), "p must be a positive int"),
    (lambda: Action(0, "X", 0), "kind must be one of"),
])
def test_bad_sizes_raise_clear_errors(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()


def test_validate_rejects_a_moved_action_with_the_stalled_ranks():
    schedule = one_f_one_b(3, 4)
    acts = schedule[0]
    acts.insert(1, acts.pop(acts.index(Action(0, "B", 0))))  # rank 0: F0 B0 F1 ... waits for itself
    with pytest.raises(ScheduleError) as err:
        validate(schedule, 3, 4)
    text = str(err.value)
    assert "rank 0 stalls at B0@s0" in text and "rank 1 stalls at F1@s1" in text
    assert err.value.rank == 0 and err.value.action == Action(0, "B", 0)


def test_validate_rejects_torch_printable_1f1b_order():
    # torch 2.13 Schedule1F1B._get_pipeline_order, p=2, m=3: the last rank starts at F1 (no F0, an F3)
    torch_order = table({0: "F0 F1 B0 F2 B1 B2", 1: "F1 B0 F2 B1 F3 B2"})
    with pytest.raises(ScheduleError, match=r"rank 1, action F3@s1: stage must be < p\*v = 2 and microbatch < m = 3"):
        validate(torch_order, 2, 3)
    # with the last rank's microbatches renumbered F1 first, every action exists once, yet
    # rank 1 waits for microbatch 1 while microbatch 0 is next on its channel
    reordered = table({0: "F0 F1 B0 F2 B1 B2", 1: "F1 B1 F0 B0 F2 B2"})
    with pytest.raises(ScheduleError, match="rank 1 stalls at F1@s1.*next message from rank 0 is the activation of mi"):
        validate(reordered, 2, 3)


@pytest.mark.parametrize("rows,p,m,v,needle", [
    ({0: "F0 B0", 1: "F0 B0"}, 2, 2, 1, "microbatch 1 has actions none"),
    ({0: "F0 B0 F1 B1 B1", 1: "F0 B0 F1 B1"}, 2, 2, 1, "appears twice"),
    ({0: "F0 F1 B0 B1", 1: "F0 F1 B0 B1 I1 W1"}, 2, 2, 1, "exactly one F and one backward"),
    ({0: "F0 F1 B0 B1", 1: "F0 F1 B0 W1 I1"}, 2, 2, 1, "runs before I1@s1"),
    ({0: "F0 F1 B0 B1", 1: "F0 F1 B0 B1@0"}, 2, 2, 1, "stage 0 lives on rank 0"),
    ({0: "F0 B0"}, 2, 1, 1, "schedule ranks are"),
])
def test_validate_rejects_bad_coverage_and_order(rows, p, m, v, needle):
    with pytest.raises(ScheduleError, match=needle):
        validate(table(rows), p, m, v)


def test_validate_accepts_a_reordered_but_consistent_schedule():
    # any order that respects dependencies and channel order is valid, e.g. backward in reverse (Varuna-style table)
    schedule = table({0: "F0 F1 F2 B2 B1 B0", 1: "F0 F1 F2 B2 B1 B0"})
    validate(schedule, 2, 3)
    assert simulate(schedule).bubble_fraction == pytest.approx(1 / 4)


def test_plot_schedule_draws_one_bar_per_action():
    import matplotlib
    matplotlib.use("Agg")
    from scaletrain.pipeline import plot_schedule
    sim = simulate(zb_h1(3, 4))
    ax = plot_schedule(sim)
    assert len(ax.patches) == len(sim.spans) == 3 * 4 * 3
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1", "rank 2"]


def test_costs_by_stage_and_by_action_recover_uneven_costs_and_replay_exactly():
    schedule = one_f_one_b(3, 5)
    cost = {0: 1.0, 1: 2.5, 2: 1.5}
    truth = simulate(schedule, t_f=lambda a: cost[a.stage], t_b=lambda a: 2 * cost[a.stage] + a.microbatch / 10,
                     t_comm=0.2)
    staged = costs_from_timeline(truth.spans, by="stage")
    assert [staged["t_f"](Action(s, "F", 0)) for s in range(3)] == pytest.approx([1.0, 2.5, 1.5])
    assert staged["t_comm"] == pytest.approx(0.2)
    replay = simulate(schedule, **costs_from_timeline(truth.spans, by="action"))
    assert replay.makespan == pytest.approx(truth.makespan) and replay.bubble_fraction == pytest.approx(
        truth.bubble_fraction)
    # one mean per kind misses the slow middle stage: the equal-stage prediction is too optimistic
    assert simulate(schedule, **costs_from_timeline(truth.spans)).bubble_fraction < truth.bubble_fraction
    with pytest.raises(ValueError, match="by must be"):
        costs_from_timeline(truth.spans, by="rank")


def test_sampled_bubble_without_jitter_is_the_deterministic_bubble():
    schedule = zb_h1(2, 4)
    run = simulate(schedule, t_f=1.0, t_i=1.0, t_w=1.0, t_b=2.0, t_comm=0.1)
    assert sampled_bubble(schedule, [run.spans, run.spans], samples=5) == pytest.approx(run.bubble_fraction)
    # jitter stretches the makespan (the mean of a max exceeds the max of the means)
    fast, slow = (simulate(schedule, t_f=t, t_i=t, t_w=t, t_b=2 * t, t_comm=0.1) for t in (0.5, 1.5))
    mixed = sampled_bubble(schedule, [fast.spans, slow.spans], samples=200)
    assert mixed > run.bubble_fraction
    with pytest.raises(ValueError, match="never ran"):
        sampled_bubble(one_f_one_b(2, 4), [run.spans])
    # by="action" on one timeline replays it: its own durations, its own (here constant) delays
    uneven = simulate(schedule, t_f=lambda a: 1 + a.stage, t_i=1.0, t_w=lambda a: a.microbatch / 4, t_comm=0.3)
    assert sampled_bubble(schedule, [uneven.spans], by="action", samples=3) == pytest.approx(uneven.bubble_fraction)
    with pytest.raises(ValueError, match="by must be"):
        sampled_bubble(schedule, [run.spans], by="kind")


def test_bubble_target_judges_only_ranks_with_a_core_each():
    from scaletrain.pipeline.benchmark import target_summary
    rows = [{"p": 2, "schedule": "1f1b", "meas/replay": 1.04}, {"p": 2, "schedule": "interleaved", "meas/replay": 1.13},
            {"p": 4, "schedule": "1f1b", "meas/replay": 0.85}]
    text = target_summary(rows, cores=2)
    assert "1/2 rows met; missed: p=2 interleaved 1.13" in text
    assert "Not judged: p = 4 time-shares 2 cores" in text and "0.85-0.85" in text
    assert target_summary(rows, cores=4).startswith("Bubble target (measured within 10% of the replay, p <= 4 cores): "
                                                    "1/3 rows met")
    assert "Not judged" not in target_summary(rows[:1], cores=2)


def test_benchmark_bubble_rows_of_an_ideal_run_all_equal_the_closed_form():
    """Timelines simulated with equal stages (t_b = 2 t_f, no messages delay) stand in for a
    measured run: every fitted column must then give the closed form, and meas/replay 1."""
    from scaletrain.pipeline.benchmark import CHUNKS, bubble_rows, make_schedule
    p, m = 2, 4
    per_rank = [{} for _ in range(p)]
    for name in CHUNKS:
        schedule, v = make_schedule(name, p, m)
        run = simulate(schedule, t_f=1.0 / v, t_b=2.0 / v, t_i=1.0, t_w=1.0)
        for r in range(p):
            per_rank[r][name] = [[s for s in run.spans if s.rank == r]] * 3  # three identical steps
    rows, examples = bubble_rows(p, m, per_rank)
    assert [r["schedule"] for r in rows] == list(CHUNKS) and set(examples) == set(CHUNKS)
    for row in rows:
        for column in ("measured", "equal stages", "per stage", "+ jitter", "replay"):
            assert row[column] == pytest.approx(row["closed form"]), (row["schedule"], column)
        assert row["meas/replay"] == pytest.approx(1.0)


def test_validate_compares_actions_by_their_fields_not_their_class():
    """The assignment's pp_schedules.py defines its own Action: its schedules validate as they are."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class OwnAction:
        stage: int
        kind: str
        microbatch: int

    own = {r: [OwnAction(a.stage, a.kind, a.microbatch) for a in acts] for r, acts in one_f_one_b(3, 4).items()}
    validate(own, 3, 4)
    with pytest.raises(ScheduleError, match="is not an Action"):
        validate({0: [("F", 0)]}, 1, 1)
