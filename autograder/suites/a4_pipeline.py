"""Assignment a4: pipeline schedules, their validator and the executor (`assignments/a4_pipeline/`).

Each task is graded against an independent reference: the student's generators through the
library's `validate` and `simulate` (closed-form bubbles, in-flight counts, Megatron's order),
the student's dry run against the library's verdict on hidden broken schedules, the student's
executor against one process computing the whole model. Every student call in the pure group
runs under a per-call time limit, so an infinite loop costs that check only (`timeout`); the
executor runs in one spawn of 3 ranks, where a deadlock ends as `timeout` when the process
group's timeout expires.
"""

from __future__ import annotations

import contextlib
import copy
import random
import signal

from autograder import checks
from autograder.manifest import Check, Group, Manifest, Planted, Task

S, V, E = "pp_schedules.py", "pp_validate.py", "pp_executor.py"
_NO_TRICKS = ("importlib", "__import__", "exec", "eval", "subprocess")

MANIFEST = Manifest(
    assignment="a4", folder="a4_pipeline", title="Pipeline parallelism: schedules, validation, execution",
    files={S: "lib/scaletrain/pipeline/schedules.py", V: "lib/scaletrain/pipeline/validate.py",
           E: "lib/scaletrain/pipeline/executor.py"},
    tasks=(
        Task("4.1", "1F1B schedule generator", file=S, functions=("one_f_one_b",)),
        Task("4.2", "Interleaved 1F1B schedule generator", file=S, functions=("interleaved_1f1b",)),
        Task("4.3", "The validator's dry run: deadlock detection", file=V, functions=("_dry_run",)),
        Task("4.4", "The executor's action step", file=E, functions=("_run", "_forward", "_backward")),
    ),
    # generators are pure Python: no torch (torch.distributed.pipelining has generators) and no
    # copy of the reference; the executor must do its own send/recv, not torch's pipelining
    forbidden={S: ("scaletrain", "torch", *_NO_TRICKS),
               V: ("scaletrain.pipeline.validate", "scaletrain.pipeline.simulate", "scaletrain.pipeline.executor",
                   "torch", *_NO_TRICKS),
               E: ("scaletrain.pipeline.executor", "torch.distributed.pipelining",
                   "torch.distributed.batch_isend_irecv", *_NO_TRICKS)},
    groups=(
        Group("pure", "autograder.suites.a4_pipeline:group_pure", timeout_s=90, checks=(
            Check("4.1", "1F1B is valid with bubble (p-1)/(m+p-1) and peak in-flight p-r on hidden (p, m)", 3),
            Check("4.1", "1F1B follows the warm-up / steady / cool-down order", 1),
            Check("4.1", "1F1B rejects m < p with a ValueError", 1),
            Check("4.2", "interleaved is valid with bubble (p-1)/(vm+p-1) on hidden (p, m, v)", 3),
            Check("4.2", "interleaved holds no more in flight than Megatron's order", 1),
            Check("4.2", "interleaved rejects m not a multiple of p with a ValueError", 1),
            Check("4.3", "dry run accepts every valid schedule", 1),
            Check("4.3", "dry run reports hidden deadlocks with the stalled rank and action", 2),
            Check("4.3", "dry run enforces the order of messages on a channel", 1),
        )),
        Group("executor", "autograder.suites.a4_pipeline:group_executor", timeout_s=150, checks=(
            Check("4.4", "GPipe and 1F1B gradients equal a single process (hidden transformer blocks)", 3),
            Check("4.4", "interleaved gradients equal a single process (6 stages on 3 ranks)", 2),
            Check("4.4", "ZB-H1 (I/W split) gradients equal a single process", 1),
            Check("4.4", "microbatch losses returned and activations freed after the step", 1),
        )),
    ),
    planted=(
        Planted("1F1B pair swapped: backward before its forward", S,
                ("actions += [Action(r, F, warmup + i), Action(r, B, i)]",
                 "actions += [Action(r, B, i), Action(r, F, warmup + i)]"), groups=("pure",),
                expect={"1F1B is valid with bubble (p-1)/(m+p-1) and peak in-flight p-r on hidden (p, m)": "failed",
                        "interleaved is valid with bubble (p-1)/(vm+p-1) on hidden (p, m, v)": "passed"}),
        Planted("1F1B forgets its cool-down backwards", S,
                ("actions += [Action(r, B, i) for i in range(m - warmup, m)]", "actions += []"), groups=("pure",),
                expect={"1F1B is valid with bubble (p-1)/(m+p-1) and peak in-flight p-r on hidden (p, m)": "failed",
                        "1F1B rejects m < p with a ValueError": "passed"}),
        Planted("infinite loop in interleaved", S,
                ("warmup = min(2 * (p - r - 1) + (v - 1) * p, total)",
                 "warmup = min(2 * (p - r - 1) + (v - 1) * p, total)\n        while True:\n            pass"),
                groups=("pure",),
                expect={"interleaved is valid with bubble (p-1)/(vm+p-1) on hidden (p, m, v)": "timeout",
                        "1F1B is valid with bubble (p-1)/(m+p-1) and peak in-flight p-r on hidden (p, m)": "passed",
                        "dry run reports hidden deadlocks with the stalled rank and action": "passed"}),
        Planted("dry run matches messages by name, ignoring the channel order", V,
                ("if not queue or queue[0] != need:\n"
                 "                        break  # blocked: the message it needs is not next on its channel\n"
                 "                    queue.popleft()",
                 "if need not in (queue or ()):\n                        break\n"
                 "                    queue.remove(need)"),
                groups=("pure",),
                expect={"dry run enforces the order of messages on a channel": "failed",
                        "dry run accepts every valid schedule": "passed"}),
        Planted("loss not divided by m", E, ("y = loss / self.m", "y = loss"), groups=("executor",),
                expect={"GPipe and 1F1B gradients equal a single process (hidden transformer blocks)": "failed",
                        "microbatch losses returned and activations freed after the step": "passed"}),
    ),
)

CALL_LIMIT_S = 5.0
GPIPE_1F1B = "GPipe and 1F1B gradients equal a single process (hidden transformer blocks)"


@contextlib.contextmanager
def _time_limit(seconds: float = CALL_LIMIT_S):
    """End a student call that runs longer than `seconds` with TimeoutError (outcome `timeout`)."""
    def expire(signum, frame):
        raise TimeoutError(f"the call did not return within {seconds:g} s (an infinite loop?)")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------- tasks 4.1 - 4.3 (pure functions)

def _hidden_sizes(rng: random.Random) -> list[tuple[int, int]]:
    sizes = [(1, 1), (2, 2), (3, 3), (2, 5), (4, 9), (5, 6), (6, 13)]
    return sizes + [(p, p + rng.randrange(0, 3 * p)) for p in (rng.randint(3, 8) for _ in range(4))]


def _hidden_interleaved(rng: random.Random) -> list[tuple[int, int, int]]:
    cases = [(1, 2, 2), (2, 2, 2), (2, 6, 3), (3, 3, 2), (4, 8, 2), (3, 9, 4)]
    return cases + [(p, p * rng.randint(1, 3), rng.randint(2, 4)) for p in (rng.randint(2, 6) for _ in range(3))]


def _generated(fn, *args):
    try:
        with _time_limit():
            schedule = fn(*args)
    except ValueError as exc:
        raise AssertionError(f"{fn.__name__}{args} raised ValueError for valid sizes: {exc}") from None
    if not isinstance(schedule, dict):
        raise AssertionError(f"{fn.__name__}{args} returned {type(schedule).__name__}, "
                             "expected dict[rank, list[Action]]")
    return schedule


def _assert_valid(schedule, name: str, p: int, m: int, v: int = 1) -> dict:
    """The schedule rebuilt with the library's Action (the student's is a copy), once validated."""
    from scaletrain.pipeline import Action, validate
    bad = [a for acts in schedule.values() for a in acts if type(a).__name__ != "Action"]
    if bad:
        raise AssertionError(f"{name}: {bad[0]!r} is not an Action(stage, kind, microbatch)")
    try:
        rebuilt = {r: [Action(a.stage, a.kind, a.microbatch) for a in acts] for r, acts in schedule.items()}
        validate(rebuilt, p, m, v)
    except ValueError as exc:
        raise AssertionError(f"{name} is not a valid schedule: {exc}") from None
    return rebuilt


def _check_generator(name, make, cases, closed_form, per_rank_peak=None):
    from scaletrain.pipeline import simulate
    for case in cases:
        label = f"{name}{case}"
        schedule = _assert_valid(_generated(make, *case), label, case[0], case[1], case[2] if len(case) > 2 else 1)
        sim = simulate(schedule, t_f=1.0, t_b=2.0)
        expected = closed_form(*case)
        assert abs(sim.bubble_fraction - expected) < 1e-9, (
            f"{label}: bubble fraction {sim.bubble_fraction:.4f}, expected {expected:.4f} (simulated, t_b = 2 t_f)")
        if per_rank_peak is not None:
            want = per_rank_peak(*case)
            got = list(sim.peak_in_flight)
            assert got == want, f"{label}: peak in-flight per rank {got}, expected {want}"


def _assert_same_order(student, reference, label):
    for r in reference:
        mine = [f"{a.kind}{a.microbatch}@s{a.stage}" for a in student.get(r, [])]
        ref = [str(a) for a in reference[r]]
        if mine != ref:
            k = next((k for k, (x, y) in enumerate(zip(mine, ref)) if x != y), min(len(mine), len(ref)))
            raise AssertionError(f"{label}, rank {r}, position {k}: got {mine[k:k + 3]}, "
                                 f"the specified order has {ref[k:k + 3]}")


def _expect_value_error(call, what: str):
    try:
        with _time_limit():
            call()
    except ValueError:
        return
    raise AssertionError(f"{what}: expected a ValueError with a clear message, nothing was raised")


def group_pure(ctx):
    from scaletrain.pipeline import interleaved_1f1b, one_f_one_b, simulate
    rng = random.Random(checks.trial_seeds(1, salt=4)[0])
    sched = ctx.student("pp_schedules")
    sizes, inter = _hidden_sizes(rng), _hidden_interleaved(rng)
    with ctx.check("1F1B is valid with bubble (p-1)/(m+p-1) and peak in-flight p-r on hidden (p, m)"):
        _check_generator("one_f_one_b", sched.one_f_one_b, sizes, lambda p, m: (p - 1) / (m + p - 1),
                         lambda p, m: [p - r for r in range(p)])
    with ctx.check("1F1B follows the warm-up / steady / cool-down order"):
        for p, m in sizes:
            _assert_same_order(_generated(sched.one_f_one_b, p, m), one_f_one_b(p, m), f"one_f_one_b({p}, {m})")
    with ctx.check("1F1B rejects m < p with a ValueError"):
        _expect_value_error(lambda: sched.one_f_one_b(5, 3), "one_f_one_b(5, 3)")
    with ctx.check("interleaved is valid with bubble (p-1)/(vm+p-1) on hidden (p, m, v)"):
        _check_generator("interleaved_1f1b", sched.interleaved_1f1b, inter,
                         lambda p, m, v: (p - 1) / (v * m + p - 1))
    with ctx.check("interleaved holds no more in flight than Megatron's order"):
        for p, m, v in inter:
            mine = _assert_valid(_generated(sched.interleaved_1f1b, p, m, v), f"interleaved_1f1b{(p, m, v)}", p, m, v)
            got, ref = simulate(mine).peak_in_flight, simulate(interleaved_1f1b(p, m, v)).peak_in_flight
            worse = [r for r in range(p) if got[r] > ref[r]]
            assert not worse, (f"interleaved_1f1b{(p, m, v)}: rank {worse[0]} holds {got[worse[0]]} chunk activations "
                               f"at once, the warm-up of 2(p-r-1) + (v-1)p forwards needs only {ref[worse[0]]}")
    with ctx.check("interleaved rejects m not a multiple of p with a ValueError"):
        _expect_value_error(lambda: sched.interleaved_1f1b(3, 4, 2), "interleaved_1f1b(3, 4, 2)")
    _group_validate(ctx, rng)


def _hidden_deadlocks(rng: random.Random, count: int = 12):
    """Valid schedules with one action moved, kept when the library says they deadlock in the dry run."""
    from scaletrain.pipeline import ScheduleError, gpipe, interleaved_1f1b, one_f_one_b, validate, zb_h1
    makers = [lambda: one_f_one_b(3, 5), lambda: gpipe(4, 4), lambda: zb_h1(3, 4), lambda: interleaved_1f1b(2, 4, 2),
              lambda: one_f_one_b(4, 7)]
    found = []
    for _ in range(100 * count):  # about half of the random moves deadlock; the rest break local order
        if len(found) == count:
            break
        schedule = rng.choice(makers)()
        r = rng.randrange(len(schedule))
        acts = schedule[r]
        acts.insert(rng.randrange(len(acts)), acts.pop(rng.randrange(len(acts))))
        p = len(schedule)
        m = 1 + max(a.microbatch for a in acts)
        v = -(-(1 + max(a.stage for x in schedule.values() for a in x)) // p)
        try:
            validate(schedule, p, m, v)
        except ScheduleError as exc:
            if "deadlocks" in str(exc):
                found.append((schedule, p, m, v, exc.rank, exc.action))
    if len(found) < count:
        raise RuntimeError(f"suite bug: found only {len(found)} hidden deadlocks")
    return found


def _as_student(mod, schedule):
    return {r: [mod.Action(a.stage, a.kind, a.microbatch) for a in acts] for r, acts in schedule.items()}


def _group_validate(ctx, rng):
    from scaletrain.pipeline import Action, gpipe, interleaved_1f1b, one_f_one_b, zb_h1
    val = ctx.student("pp_validate")
    with ctx.check("dry run accepts every valid schedule"):
        valid = [(gpipe(3, 5), 3, 5, 1), (one_f_one_b(4, 6), 4, 6, 1), (zb_h1(5, 7), 5, 7, 1),
                 (interleaved_1f1b(2, 6, 3), 2, 6, 3), (interleaved_1f1b(4, 4, 2), 4, 4, 2),
                 ({r: acts[:3] + acts[3:][::-1] for r, acts in gpipe(2, 3).items()}, 2, 3, 1)]
        for schedule, p, m, v in valid:
            try:
                with _time_limit():
                    val.validate(_as_student(val, schedule), p, m, v)
            except ValueError as exc:
                raise AssertionError(f"a valid schedule (p={p}, m={m}, v={v}) was rejected: {exc}") from None
    with ctx.check("dry run reports hidden deadlocks with the stalled rank and action"):
        for schedule, p, m, v, rank, action in _hidden_deadlocks(rng):
            try:
                with _time_limit():
                    val.validate(_as_student(val, schedule), p, m, v)
            except ValueError as exc:
                got = (getattr(exc, "rank", None), getattr(exc, "action", None))
                assert got[0] == rank and str(got[1]) == str(action), (
                    f"a deadlock (p={p}, m={m}, v={v}) reported rank={got[0]}, action={got[1]}; the lowest stalled "
                    f"rank is {rank}, at {action}")
                assert f"rank {rank}" in str(exc) and str(action) in str(exc), (
                    f"the message must name rank {rank} and action {action}: {exc}")
                continue
            raise AssertionError(f"a schedule that deadlocks (p={p}, m={m}, v={v}) was accepted")
    with ctx.check("dry run enforces the order of messages on a channel"):
        # rank 1 runs microbatch 1 first while rank 0 sends microbatch 0 first (cf. torch's printable 1F1B)
        rows = {0: "F0 F1 B0 F2 B1 B2", 1: "F1 B1 F0 B0 F2 B2"}
        schedule = {r: [Action(r, t[0], int(t[1:])) for t in text.split()] for r, text in rows.items()}
        try:
            with _time_limit():
                val.validate(_as_student(val, schedule), 2, 3, 1)
        except ValueError as exc:
            assert "rank 1 stalls at F1@s1" in str(exc), f"the message must say that rank 1 stalls at F1@s1: {exc}"
            return
        raise AssertionError("rank 1 receives microbatch 1 while microbatch 0 is first on its channel: "
                             "the schedule must be rejected")


# ---------------------------------------------------------------- task 4.4 (executor, 3 ranks)

def _executor_rank(rank: int, world_size: int, seed: int) -> dict[str, list[str]]:
    """Every executor check of one rank: {check: [problems]} (empty lists = passed)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as Fn
    from scaletrain.models import Block, GPTConfig
    from scaletrain.pipeline import gpipe, interleaved_1f1b, one_f_one_b, zb_h1

    mod = checks.student_module("pp_executor")
    p = world_size
    torch.manual_seed(seed)
    cfg = GPTConfig(n_embd=12, n_head=3, n_layer=1, block_size=5)
    blocks = [Block(cfg) for _ in range(p)]

    def mlp(n):
        widths = [7 + (5 * s) % 6 for s in range(n + 1)]
        return [nn.Sequential(nn.Linear(widths[s], widths[s + 1]), nn.LayerNorm(widths[s + 1]), nn.GELU())
                for s in range(n)], widths

    runs = {GPIPE_1F1B: [],
            "interleaved gradients equal a single process (6 stages on 3 ranks)": [],
            "ZB-H1 (I/W split) gradients equal a single process": []}
    for m, schedule in [(3, gpipe(p, 3)), (7, one_f_one_b(p, 7))]:
        x, y = torch.randn(2 * m, 5, 12), torch.randn(2 * m, 5, 12)
        runs[GPIPE_1F1B].append((blocks, x, y, schedule))
    stages, widths = mlp(2 * p)
    runs["interleaved gradients equal a single process (6 stages on 3 ranks)"].append(
        (stages, torch.randn(9, widths[0]), torch.randn(9, widths[-1]), interleaved_1f1b(p, 3, 2)))
    stages, widths = mlp(p)
    runs["ZB-H1 (I/W split) gradients equal a single process"].append(
        (stages, torch.randn(8, widths[0]), torch.randn(8, widths[-1]), zb_h1(p, 4)))
    problems: dict[str, list[str]] = {name: [] for name in runs}
    problems["microbatch losses returned and activations freed after the step"] = []
    for name, cases in runs.items():
        for stages, x, y, schedule in cases:
            for s in stages:
                s.zero_grad(set_to_none=True)
            reference = nn.Sequential(*copy.deepcopy(stages))
            out = reference(x)
            Fn.mse_loss(out, y).backward()
            m = 1 + max(a.microbatch for a in schedule[0])
            ref_losses = [Fn.mse_loss(o, t).item() for o, t in zip(out.split(len(x) // m), y.split(len(y) // m))]
            mine = {s: stages[s] for s in range(rank, len(stages), p)}
            ex = mod.PipelineExecutor(mine, schedule, Fn.mse_loss)
            losses = ex.step(x if 0 in mine else None, y if len(stages) - 1 in mine else None)
            for s, module in mine.items():
                for (pname, q), q_ref in zip(module.named_parameters(), reference[s].parameters()):
                    if q.grad is None:
                        problems[name].append(f"rank {rank}, stage {s}: {pname}.grad is None after step()")
                        continue
                    try:
                        checks.assert_close(q.grad, q_ref.grad, rtol=1e-5, atol=4e-5, what=f"stage {s} {pname}.grad")
                    except AssertionError as exc:
                        problems[name].append(f"rank {rank}, m={m}: {exc}")
            lp = problems["microbatch losses returned and activations freed after the step"]
            if len(stages) - 1 in mine:
                if not isinstance(losses, list) or len(losses) != m or any(
                        abs(a - b) > 1e-5 * max(1.0, abs(b)) for a, b in zip(losses, ref_losses)):
                    lp.append(f"rank {rank}: step() returned {losses}, expected the {m} microbatch losses {ref_losses}")
            if ex._stash:
                lp.append(f"rank {rank}: {len(ex._stash)} (stage, microbatch) entries still stashed after the step")
    return problems


def group_executor(ctx):
    from scaletrain.launch import spawn
    try:
        per_rank, failure = spawn(_executor_rank, 3, checks.trial_seeds(1, salt=44)[0], timeout_s=40), None
    except Exception as exc:  # noqa: BLE001 - reported inside every check below
        per_rank, failure = None, exc
    for name in ("GPipe and 1F1B gradients equal a single process (hidden transformer blocks)",
                 "interleaved gradients equal a single process (6 stages on 3 ranks)",
                 "ZB-H1 (I/W split) gradients equal a single process",
                 "microbatch losses returned and activations freed after the step"):
        with ctx.check(name):
            if failure is not None:
                raise failure
            problems = [msg for rank in per_rank for msg in rank[name]]
            more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
            assert not problems, "; ".join(problems[:3]) + more
