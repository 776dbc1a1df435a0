"""Assignment a4: pipeline schedules, their validator and the executor (`assignments/a4_pipeline/`).

Each task is graded against an independent reference: the student's generators through the
library's `validate` and `simulate` (closed-form bubbles, in-flight counts, Megatron's order),
the student's dry run against the library's verdict on hidden broken schedules, the student's
executor against one process computing the whole model, and against the schedule it was given.

Every group is *trusted* (`Group.trusted`): this module runs in a process that never imports the
submission. The probes (`autograder/probes/a4_pipeline.py`) run the student's code in the
sandboxed worker and send back data: schedules as (stage, kind, microbatch) tuples, the dry
run's verdict, the executor's gradients, losses and a trace of what it ran. The reference, the
hidden inputs, the expected values and the verdicts stay here:

- 4.1 / 4.2: the returned schedules are rebuilt with the library's `Action` and judged by the
  library's `validate` and `simulate`; each student call has its own time limit, so an infinite
  loop costs that check only (`timeout`).
- 4.3: valid schedules, hidden deadlocks and hidden receives out of channel order are generated
  here from the seed (the public examples decide nothing: a dry run that recognises them fails).
- 4.4: the executor runs hidden models and schedules (one of them a random valid schedule) on 3
  ranks. Beyond the gradients, the trace says in which order the stages' forwards and backwards
  ran and how many stage outputs were alive at once: an executor that runs every schedule as
  GPipe, or that keeps activations longer than its schedule, fails the schedule's check.

What stays best effort: the trace is recorded in the process that runs the student's code (by
wrappers around the stage modules), so code that finds and rewrites it in memory could forge an
order; the gradients, losses and hidden schedules are judged here and cannot be, and the activations
freed (memory evidence) are granted only with GPipe's and 1F1B's gradients (`Check.needs`). The probe also
replaces the executor's call to `validate` (the student's own dry run, under the library's name
in the worker) by nothing: the schedules are the library's, and task 4.4 must not depend on 4.3.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field

from autograder import checks
from autograder.manifest import Check, Group, Manifest, Planted, Task

S, V, E = "pp_schedules.py", "pp_validate.py", "pp_executor.py"
_NO_TRICKS = ("importlib", "__import__", "exec", "eval", "subprocess")
GPIPE_1F1B = "GPipe and 1F1B gradients equal a single process (hidden transformer blocks)"
INTERLEAVED = "interleaved gradients equal a single process (6 stages on 3 ranks)"
ZB_H1 = "ZB-H1 (I/W split) gradients equal a single process"
LOSSES = "microbatch losses returned and activations freed after the step"

PROBE = "autograder.probes.a4_pipeline:"
CALL_LIMIT_S = 5.0     # one call of the student's generator or dry run
LOAD_LIMIT_S = 30.0    # starting the worker and importing the student's file (a loaded machine)
SPAWN_LIMIT_S = 40.0   # the executor's ranks, once started: a deadlock ends here
PREPARE_LIMIT_S = 60.0  # the executor's worker: importing torch, starting the ranks' fork server
EXECUTOR_GROUP_S = 150.0

# the public examples of pp_validate (tests/test_a4_public.py), as a dry run that knows only them
# would special-case them
_SPECIAL_CASED = '''rows = {r: " ".join(f"{a.kind}{a.microbatch}" for a in acts) for r, acts in schedule.items()}
    if rows == {0: "F0 B0 F1 F2 B1 F3 B2 B3", 1: "F0 F1 B0 F2 B1 F3 B2 B3", 2: "F0 B0 F1 B1 F2 B2 F3 B3"}:
        raise ScheduleError("schedule deadlocks:\\n  rank 0 stalls at B0@s0 (action #1)\\n"
                            "  rank 1 stalls at F1@s1 (action #1)", rank=0, action=schedule[0][1])
    if rows == {0: "F0 F1 B0 F2 B1 B2", 1: "F1 B1 F0 B0 F2 B2"}:
        raise ScheduleError("schedule deadlocks:\\n  rank 0 stalls at B0@s0 (action #2)\\n"
                            "  rank 1 stalls at F1@s1 (action #0)", rank=0, action=schedule[0][2])
    return
    p = len(schedule)'''

# reads the grader's expected verdict out of its caller's frames, as it could when the checks ran
# in the student's process
_FRAME_PEEK = '''import sys
    frame = sys._getframe(1)
    while frame is not None:
        seen = frame.f_locals
        if "rank" in seen and "action" in seen and seen["action"] is not None:
            raise ScheduleError(f"schedule deadlocks:\\n  rank {seen['rank']} stalls at {seen['action']}",
                                rank=seen["rank"], action=seen["action"])
        frame = frame.f_back
    return
    p = len(schedule)'''

# stub-level 1F1B that tries to turn its own failure into "passed" from inside the process that
# runs it: the classifier patched, forged lines appended to its group's report (found in the
# command line of the process that started it), an atexit hook doing it again
_FORGER = '''import atexit, json, os
    def forge():
        names = ["1F1B is valid with bubble (p-1)/(m+p-1) and peak in-flight p-r on hidden (p, m)",
                 "1F1B follows the warm-up / steady / cool-down order", "1F1B rejects m < p with a ValueError"]
        try:  # the group's report is the last argument of the process that started this one
            with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
                report = f.read().split(b"\\0")[-2].decode()
            with open(report, "a") as f:
                for name in names:
                    f.write(json.dumps({"name": name, "outcome": "passed", "reason": "", "duration": 0.1}) + "\\n")
        except (OSError, IndexError, UnicodeDecodeError):
            pass
    try:
        import autograder.context as context
        context.classify = lambda exc, submission: ("passed", "")
    except ImportError:
        pass
    forge()
    atexit.register(forge)
    raise NotImplementedError("a4 task 4.1")
    _check_sizes("one_f_one_b", p, m, needs_m_ge_p=True)'''

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
        Group("pure", "autograder.suites.a4_pipeline:group_pure", timeout_s=90, trusted=True, checks=(
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
        Group("executor", "autograder.suites.a4_pipeline:group_executor", timeout_s=EXECUTOR_GROUP_S, trusted=True,
              checks=(
            Check("4.4", GPIPE_1F1B, 3),
            Check("4.4", INTERLEAVED, 2),
            Check("4.4", ZB_H1, 1),
            Check("4.4", LOSSES, 1, needs=(GPIPE_1F1B,)),
        )),
    ),
    planted=(
        Planted("1F1B pair swapped: backward before its forward", S,
                ("actions += [Action(r, F, warmup + i), Action(r, B, i)]",
                 "actions += [Action(r, B, i), Action(r, F, warmup + i)]"), groups=("pure",),
                expect={"1F1B is valid with bubble (p-1)/(m+p-1) and peak in-flight p-r on hidden (p, m)": "failed",
                        "interleaved is valid with bubble (p-1)/(vm+p-1) on hidden (p, m, v)": "passed"}),
        # issue 27: m = p - 1, the public test's boundary, passed the hidden m = p - 2 before
        Planted("1F1B accepts m = p - 1 (checks m < p - 1)", S,
                ('    _check_sizes("one_f_one_b", p, m, needs_m_ge_p=True)\n',
                 '    _check_sizes("one_f_one_b", p, m)\n    if m < p - 1:\n'
                 '        raise ValueError(f"one_f_one_b: needs m >= p microbatches, got m={m} < p={p}")\n'),
                groups=("pure",),
                expect={"1F1B rejects m < p with a ValueError": "failed",
                        "1F1B is valid with bubble (p-1)/(m+p-1) and peak in-flight p-r on hidden (p, m)": "passed"}),
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
        Planted("dry run special-cases the public examples (accepts everything else)", V,
                ("p = len(schedule)\n    channels", _SPECIAL_CASED + "\n    channels"), groups=("pure",),
                expect={"dry run accepts every valid schedule": "passed",
                        "dry run reports hidden deadlocks with the stalled rank and action": "failed",
                        "dry run enforces the order of messages on a channel": "failed",
                        "1F1B is valid with bubble (p-1)/(m+p-1) and peak in-flight p-r on hidden (p, m)": "passed"}),
        Planted("dry run reads the expected verdict from the grader's frames", V,
                ("p = len(schedule)\n    channels", _FRAME_PEEK + "\n    channels"), groups=("pure",),
                expect={"dry run accepts every valid schedule": "passed",
                        "dry run reports hidden deadlocks with the stalled rank and action": "failed",
                        "dry run enforces the order of messages on a channel": "failed"}),
        Planted("unimplemented 1F1B patches the classifier, forges report lines, registers atexit", S,
                ('    _check_sizes("one_f_one_b", p, m, needs_m_ge_p=True)', "    " + _FORGER), groups=("pure",),
                expect={"1F1B is valid with bubble (p-1)/(m+p-1) and peak in-flight p-r on hidden (p, m)": "failed",
                        "1F1B follows the warm-up / steady / cool-down order": "failed",
                        "1F1B rejects m < p with a ValueError": "failed",
                        "interleaved is valid with bubble (p-1)/(vm+p-1) on hidden (p, m, v)": "passed"}),
        Planted("loss not divided by m", E, ("y = loss / self.m", "y = loss"), groups=("executor",),
                expect={GPIPE_1F1B: "failed", LOSSES: "failed"}),
        Planted("executor runs every schedule as GPipe (all forwards, then all backwards)", E,
                ("self.actions: list[Action] = list(schedule[self.pp_rank])",
                 "self.actions: list[Action] = sorted(schedule[self.pp_rank], key=lambda a: (\n"
                 "            a.kind != F, a.stage if a.kind == F else -a.stage, a.microbatch, a.kind == W))"),
                groups=("executor",),
                expect={GPIPE_1F1B: "failed", INTERLEAVED: "failed", ZB_H1: "failed", LOSSES: "failed"}),
    ),
)



class _Student:
    """The student's pure functions in the worker: one call each, under CALL_LIMIT_S. The
    worker is started (and the file imported) by a first untimed call, so the limit measures
    the student's function, not the start of a process."""

    def __init__(self, ctx):
        self.ctx, self.loaded, self.cache = ctx, set(), {}
        self.load_failure: Exception | None = None

    def call(self, probe: str, stem: str, *args):
        from autograder.untrusted import StudentCrash

        worker = self.ctx.untrusted()
        if stem not in self.loaded:
            if self.load_failure is not None:  # an import that hangs costs one limit, not one per check
                raise self.load_failure
            try:
                worker.call(PROBE + "load", stem, timeout_s=LOAD_LIMIT_S)
            except TimeoutError as exc:
                self.load_failure = exc
                raise
            self.loaded.add(stem)
        try:
            return worker.call(PROBE + probe, stem, *args, timeout_s=CALL_LIMIT_S)
        except (TimeoutError, StudentCrash):
            self.loaded.clear()  # the worker may be gone: the next call starts (and imports) again
            raise

    def generated(self, function: str, *args):
        """The probe's answer for `function(*args)`: {"schedule": data} or {"value_error": msg}.
        A generator is a pure function: each (function, args) is asked once per group."""
        key = (function, args)
        if key not in self.cache:
            self.cache[key] = self.call("generate", "pp_schedules", function, *args)
        return self.cache[key]


# ---------------------------------------------------------------- tasks 4.1 - 4.3 (pure functions)

# the public tests' sizes (assignments/a4_pipeline/tests/): every one runs here too (issue 27)
PUBLIC_1F1B = [(3, 4), (2, 2), (3, 7), (4, 8), (5, 5)]
PUBLIC_INTERLEAVED = [(2, 4, 2), (3, 6, 3), (4, 4, 2)]
PUBLIC_DEADLOCK = {0: "F0 B0 F1 F2 B1 F3 B2 B3", 1: "F0 F1 B0 F2 B1 F3 B2 B3", 2: "F0 B0 F1 B1 F2 B2 F3 B3"}
PUBLIC_OUT_OF_ORDER = {0: "F0 F1 B0 F2 B1 B2", 1: "F1 B1 F0 B0 F2 B2"}


def _table(rows: dict[int, str]) -> dict:
    """{rank: "F0 F1 B0"} -> a schedule of library Actions on each rank's own stage."""
    from scaletrain.pipeline import Action
    return {r: [Action(r, t[0], int(t[1:])) for t in text.split()] for r, text in rows.items()}


def _hidden_sizes(rng: random.Random) -> list[tuple[int, int]]:
    sizes = list(dict.fromkeys([(1, 1), (2, 2), (3, 3), (2, 5), (4, 9), (5, 6), (6, 13)] + PUBLIC_1F1B))
    return sizes + [(p, p + rng.randrange(0, 3 * p)) for p in (rng.randint(3, 8) for _ in range(4))]


def _hidden_interleaved(rng: random.Random) -> list[tuple[int, int, int]]:
    cases = [(1, 2, 2), (2, 2, 2), (2, 6, 3), (3, 3, 2), (4, 8, 2), (3, 9, 4)] + PUBLIC_INTERLEAVED
    return cases + [(p, p * rng.randint(1, 3), rng.randint(2, 4)) for p in (rng.randint(2, 6) for _ in range(3))]


def _call_text(function: str, args: tuple) -> str:
    return f"{function}({', '.join(map(repr, args))})"


def _as_library(data, name: str) -> dict:
    """The probe's schedule data rebuilt with the library's Action (never the student's class)."""
    from scaletrain.pipeline import Action
    if isinstance(data, dict) and "not_a_dict" in data:
        raise AssertionError(f"{name} returned {data['not_a_dict']}, expected dict[rank, list[Action]]")
    schedule = {}
    try:
        for rank, rows in data:
            if type(rank) is not int:
                raise AssertionError(f"{name}: rank key {rank!r} is not an int")
            actions = []
            for row in rows:
                if isinstance(row, dict):
                    raise AssertionError(f"{name}: {row.get('not_action')} is not an Action(stage, kind, microbatch)")
                try:
                    actions.append(Action(*row))
                except (TypeError, ValueError) as exc:
                    raise AssertionError(f"{name}: rank {rank} holds an invalid action {row!r}: {exc}") from None
            schedule[rank] = actions
    except (TypeError, ValueError) as exc:  # not what the probe sends
        raise AssertionError(f"{name}: malformed answer from the worker ({exc})") from None
    return schedule


def _generated(student: _Student, function: str, *args) -> dict:
    """The student's schedule for `function(*args)` (valid sizes), as library Actions."""
    out = student.generated(function, *args)
    name = _call_text(function, args)
    if "value_error" in out:
        raise AssertionError(f"{name} raised {out['value_error']} for valid sizes")
    return _as_library(out["schedule"], name)


def _assert_valid(schedule: dict, name: str, p: int, m: int, v: int = 1) -> dict:
    from scaletrain.pipeline import validate
    try:
        validate(schedule, p, m, v)
    except ValueError as exc:
        raise AssertionError(f"{name} is not a valid schedule: {exc}") from None
    return schedule


def _check_generator(student, function, cases, closed_form, per_rank_peak=None):
    from scaletrain.pipeline import simulate
    for case in cases:
        label = _call_text(function, case)
        schedule = _assert_valid(_generated(student, function, *case), label, case[0], case[1],
                                 case[2] if len(case) > 2 else 1)
        sim = simulate(schedule, t_f=1.0, t_b=2.0)
        expected = closed_form(*case)
        assert abs(sim.bubble_fraction - expected) < 1e-9, (
            f"{label}: bubble fraction {sim.bubble_fraction:.4f}, expected {expected:.4f} (simulated, t_b = 2 t_f)")
        if per_rank_peak is not None:
            want = per_rank_peak(*case)
            got = list(sim.peak_in_flight)
            assert got == want, f"{label}: peak in-flight per rank {got}, expected {want}"


def _assert_same_order(student: dict, reference: dict, label: str):
    for r in reference:
        mine = [str(a) for a in student.get(r, [])]
        ref = [str(a) for a in reference[r]]
        if mine != ref:
            k = next((k for k, (x, y) in enumerate(zip(mine, ref)) if x != y), min(len(mine), len(ref)))
            raise AssertionError(f"{label}, rank {r}, position {k}: got {mine[k:k + 3]}, "
                                 f"the specified order has {ref[k:k + 3]}")


def _expect_value_error(student: _Student, function: str, *args):
    if "value_error" not in student.generated(function, *args):
        raise AssertionError(f"{_call_text(function, args)}: expected a ValueError with a clear message, "
                             "nothing was raised")


def group_pure(ctx):
    from scaletrain.pipeline import interleaved_1f1b, one_f_one_b, simulate
    rng = random.Random(checks.trial_seeds(1, salt=4)[0])
    student = _Student(ctx)
    sizes, inter = _hidden_sizes(rng), _hidden_interleaved(rng)
    with ctx.check("1F1B is valid with bubble (p-1)/(m+p-1) and peak in-flight p-r on hidden (p, m)"):
        _check_generator(student, "one_f_one_b", sizes, lambda p, m: (p - 1) / (m + p - 1),
                         lambda p, m: [p - r for r in range(p)])
    with ctx.check("1F1B follows the warm-up / steady / cool-down order"):
        for p, m in sizes:
            _assert_same_order(_generated(student, "one_f_one_b", p, m), one_f_one_b(p, m), f"one_f_one_b({p}, {m})")
    with ctx.check("1F1B rejects m < p with a ValueError"):
        for p, m in ((5, 3), (4, 3)):  # m = p - 1: the public test's boundary
            _expect_value_error(student, "one_f_one_b", p, m)
    with ctx.check("interleaved is valid with bubble (p-1)/(vm+p-1) on hidden (p, m, v)"):
        _check_generator(student, "interleaved_1f1b", inter, lambda p, m, v: (p - 1) / (v * m + p - 1))
    with ctx.check("interleaved holds no more in flight than Megatron's order"):
        for p, m, v in inter:
            label = _call_text("interleaved_1f1b", (p, m, v))
            mine = _assert_valid(_generated(student, "interleaved_1f1b", p, m, v), label, p, m, v)
            got, ref = simulate(mine).peak_in_flight, simulate(interleaved_1f1b(p, m, v)).peak_in_flight
            worse = [r for r in range(p) if got[r] > ref[r]]
            assert not worse, (f"{label}: rank {worse[0]} holds {got[worse[0]]} chunk activations "
                               f"at once, the warm-up of 2(p-r-1) + (v-1)p forwards needs only {ref[worse[0]]}")
    with ctx.check("interleaved rejects m not a multiple of p with a ValueError"):
        _expect_value_error(student, "interleaved_1f1b", 3, 4, 2)
    _group_validate(ctx, student, rng)


def _moved(schedule: dict, rng: random.Random) -> dict:
    """`schedule` with one action of one rank moved to another position."""
    r = rng.randrange(len(schedule))
    acts = schedule[r]
    acts.insert(rng.randrange(len(acts)), acts.pop(rng.randrange(len(acts))))
    return schedule


def _sizes_of(schedule: dict) -> tuple[int, int, int]:
    p = len(schedule)
    actions = [a for acts in schedule.values() for a in acts]
    m = 1 + max(a.microbatch for a in actions)
    return p, m, -(-(1 + max(a.stage for a in actions)) // p)


def _hidden_deadlocks(rng: random.Random, count: int = 12):
    """Valid schedules with one action moved, kept when the library says they deadlock in the dry run."""
    from scaletrain.pipeline import ScheduleError, gpipe, interleaved_1f1b, one_f_one_b, validate, zb_h1
    makers = [lambda: one_f_one_b(3, 5), lambda: gpipe(4, 4), lambda: zb_h1(3, 4), lambda: interleaved_1f1b(2, 4, 2),
              lambda: one_f_one_b(4, 7)]
    found = []
    for _ in range(100 * count):  # about half of the random moves deadlock; the rest break local order
        if len(found) == count:
            break
        schedule = _moved(rng.choice(makers)(), rng)
        p, m, v = _sizes_of(schedule)
        try:
            validate(schedule, p, m, v)
        except ScheduleError as exc:
            if "deadlocks" in str(exc):
                found.append((schedule, p, m, v, exc.rank, exc.action))
    if len(found) < count:
        raise RuntimeError(f"suite bug: found only {len(found)} hidden deadlocks")
    return found


def _runs_by_name(schedule: dict, num_stages: int) -> bool:
    """Whether a dry run that takes any sent message, whatever its place on the channel, finishes:
    then the only fault of the schedule is the order of its receives."""
    from scaletrain.pipeline import receives, sends
    sent, cursor, progress = set(), {r: 0 for r in schedule}, True
    while progress:
        progress = False
        for r, actions in schedule.items():
            while cursor[r] < len(actions):
                need = receives(actions[cursor[r]], num_stages)
                if need is not None and need not in sent:
                    break
                out = sends(actions[cursor[r]], num_stages)
                if out is not None:
                    sent.add(out)
                cursor[r] += 1
                progress = True
    return all(cursor[r] == len(actions) for r, actions in schedule.items())


def _hidden_channel_swaps(rng: random.Random, count: int = 6):
    """Valid schedules in which one rank swaps two adjacent receives from the same rank: every
    message arrives (a dry run matching by name finishes), but not in the order it is asked for."""
    from scaletrain.pipeline import (ScheduleError, gpipe, interleaved_1f1b, one_f_one_b, receives, stage_rank,
                                     validate, zb_h1)
    makers = [lambda: gpipe(3, 4), lambda: one_f_one_b(3, 5), lambda: one_f_one_b(4, 6), lambda: zb_h1(3, 4),
              lambda: interleaved_1f1b(2, 4, 2), lambda: interleaved_1f1b(3, 6, 2)]
    found = []
    for _ in range(200 * count):
        if len(found) == count:
            break
        schedule = rng.choice(makers)()
        p, m, v = _sizes_of(schedule)
        r = rng.randrange(p)
        acts = schedule[r]
        src = [None if (msg := receives(a, p * v)) is None else stage_rank(msg.src_stage, p) for a in acts]
        pairs = [k for k in range(len(acts) - 1) if src[k] is not None and src[k] == src[k + 1]]
        if not pairs:
            continue
        k = rng.choice(pairs)
        acts[k], acts[k + 1] = acts[k + 1], acts[k]
        try:
            validate(schedule, p, m, v)
        except ScheduleError as exc:
            if "in the order the sender sends" in str(exc) and _runs_by_name(schedule, p * v):
                found.append((schedule, p, m, v, exc))
    if len(found) < count:
        raise RuntimeError(f"suite bug: found only {len(found)} hidden receives out of channel order")
    return found


def _as_data(schedule: dict) -> list:
    return [(r, [(a.stage, a.kind, a.microbatch) for a in acts]) for r, acts in schedule.items()]


def _assert_reported(out: dict, p: int, m: int, v: int, rank: int, action, line: str | None = None) -> None:
    """The student's dry run rejected the schedule with the reference's stalled rank and action
    (`exc.rank`, `exc.action`) and, in its message, `line` (default: that rank stalling there)."""
    if "accepted" in out:
        raise AssertionError(f"a schedule that deadlocks (p={p}, m={m}, v={v}) was accepted")
    got = (out.get("rank"), out.get("action"))
    assert got[0] == rank and got[1] == str(action), (
        f"a deadlock (p={p}, m={m}, v={v}) reported rank={got[0]}, action={got[1]}; the lowest stalled "
        f"rank is {rank}, at {action}")
    line = line or f"rank {rank} stalls at {action}"
    assert line in str(out.get("message")), f"the message must say that {line}: {out.get('message')}"


def _out_of_order_line(exc) -> str:
    """'rank R stalls at A' for the rank of the reference's error that waits for a message while
    another one is first on its channel."""
    line = next(x for x in str(exc).splitlines() if "in the order the sender sends" in x)
    return line.strip().split(" (action #")[0]


def _public_deadlock(student: _Student) -> None:
    """The public test's deadlock (p = 3, m = 4): the lowest stalled rank and action, and the
    lines of ranks 0 and 1 (the two waiting on each other), as the reference words them."""
    from scaletrain.pipeline import ScheduleError, validate
    schedule = _table(PUBLIC_DEADLOCK)
    try:
        validate(schedule, 3, 4, 1)
    except ScheduleError as exc:
        ref = exc
    else:
        raise RuntimeError("suite bug: the public test's deadlock validates")
    lines = [x.strip().split(" (action #")[0] for x in str(ref).splitlines() if " stalls at " in x]
    out = student.call("validate", "pp_validate", _as_data(schedule), 3, 4, 1)
    for line in lines[:2]:
        _assert_reported(out, 3, 4, 1, ref.rank, ref.action, line)


def _group_validate(ctx, student: _Student, rng: random.Random):
    from scaletrain.pipeline import ScheduleError, gpipe, interleaved_1f1b, one_f_one_b, validate, zb_h1
    deadlocks, swaps = _hidden_deadlocks(rng), _hidden_channel_swaps(rng)
    with ctx.check("dry run accepts every valid schedule"):
        valid = [(gpipe(3, 5), 3, 5, 1), (gpipe(3, 4), 3, 4, 1), (one_f_one_b(4, 6), 4, 6, 1),
                 (zb_h1(5, 7), 5, 7, 1),
                 (interleaved_1f1b(2, 6, 3), 2, 6, 3), (interleaved_1f1b(4, 4, 2), 4, 4, 2),
                 ({r: acts[:3] + acts[3:][::-1] for r, acts in gpipe(2, 3).items()}, 2, 3, 1),
                 (_hidden_valid(rng, one_f_one_b(3, 5)), 3, 5, 1), (_hidden_valid(rng, zb_h1(3, 4)), 3, 4, 1)]
        for schedule, p, m, v in valid:
            out = student.call("validate", "pp_validate", _as_data(schedule), p, m, v)
            if "accepted" not in out:
                raise AssertionError(f"a valid schedule (p={p}, m={m}, v={v}) was rejected: {out.get('message')}")
    with ctx.check("dry run reports hidden deadlocks with the stalled rank and action"):
        for schedule, p, m, v, rank, action in deadlocks:
            out = student.call("validate", "pp_validate", _as_data(schedule), p, m, v)
            _assert_reported(out, p, m, v, rank, action)
        _public_deadlock(student)
    with ctx.check("dry run enforces the order of messages on a channel"):
        # rank 1 runs microbatch 1 first while rank 0 sends microbatch 0 first (cf. torch's printable 1F1B),
        # then hidden ones: two adjacent receives from one rank swapped
        public = _table(PUBLIC_OUT_OF_ORDER)
        try:
            validate(public, 2, 3, 1)
        except ScheduleError as exc:
            swaps.insert(0, (public, 2, 3, 1, exc))
        for schedule, p, m, v, exc in swaps:
            line = _out_of_order_line(exc)
            out = student.call("validate", "pp_validate", _as_data(schedule), p, m, v)
            if "accepted" in out:
                raise AssertionError(f"{line}, waiting for a message while another one is first on its channel "
                                     f"(p={p}, m={m}, v={v}): the schedule must be rejected")
            _assert_reported(out, p, m, v, exc.rank, exc.action, line)


# ---------------------------------------------------------------- task 4.4 (executor, 3 ranks)

@dataclass
class _Case:
    """One step of the executor: what the ranks get (specs, states, x, y, schedule) and what
    only this side knows (the single process's gradients, losses and stage inputs)."""
    check: str
    label: str
    specs: list
    states: list
    x: object
    y: object
    schedule: dict
    grads: list = field(default_factory=list)     # per stage: [(name, grad)]
    losses: list = field(default_factory=list)    # per microbatch
    inputs: list = field(default_factory=list)    # per stage, per microbatch: the stage's input
    n_params: list = field(default_factory=list)  # per stage

    def wire(self) -> dict:
        return {"specs": self.specs, "states": self.states, "x": self.x, "y": self.y,
                "schedule": _as_data(self.schedule)}


def _case(check: str, label: str, specs: list, modules: list, x, y, schedule: dict) -> _Case:
    """The case with its reference: one process computing the whole model on the whole batch."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as Fn
    from scaletrain.pipeline import schedule_sizes

    stages = [copy.deepcopy(module) for module in modules]
    states = [{k: t.detach().clone() for k, t in stage.state_dict().items()} for stage in stages]
    _, m, _ = schedule_sizes(schedule)
    out = nn.Sequential(*stages)(x)
    Fn.mse_loss(out, y).backward()
    case = _Case(check, label, specs, states, x, y, schedule)
    case.grads = [[(name, q.grad.detach().clone()) for name, q in stage.named_parameters()] for stage in stages]
    case.n_params = [len(g) for g in case.grads]
    case.losses = [Fn.mse_loss(o, t).item() for o, t in zip(out.split(len(x) // m), y.split(len(y) // m))]
    with torch.no_grad():
        case.inputs = [[] for _ in stages]
        for h in x.split(len(x) // m):
            for s, stage in enumerate(stages):
                case.inputs[s].append(h)
                h = stage(h)
    return case


def _hidden_valid(rng: random.Random, schedule: dict, moves: int = 4) -> dict:
    """`schedule` changed by random moves that keep it valid: no executor can know its order."""
    from scaletrain.pipeline import ScheduleError, validate
    p, m, v = _sizes_of(schedule)
    done = 0
    for _ in range(200):
        if done == moves:
            break
        candidate = _moved(copy.deepcopy(schedule), rng)
        try:
            validate(candidate, p, m, v)
        except ScheduleError:
            continue
        schedule, done = candidate, done + (candidate != schedule)
    return schedule


def _mlp_stages(rng: random.Random, n: int):
    """(modules, specs the probe builds, widths): n stages Linear -> LayerNorm -> GELU of hidden widths."""
    import torch.nn as nn
    widths = [rng.randint(5, 13) for _ in range(n + 1)]
    modules = [nn.Sequential(nn.Linear(widths[s], widths[s + 1]), nn.LayerNorm(widths[s + 1]), nn.GELU())
               for s in range(n)]
    return modules, [{"kind": "mlp", "widths": widths[s:s + 2]} for s in range(n)], widths


def _public_executor_cases(seed: int) -> list[_Case]:
    """The public test's runs on 2 ranks, gpipe(2, 3) and one_f_one_b(2, 3), on hidden MLP stages
    (issue 27: the hidden suite runs every public case; its other cases run on 3 ranks)."""
    import torch
    from scaletrain.pipeline import gpipe, one_f_one_b

    rng = random.Random(seed + 1)
    torch.manual_seed(seed + 1)
    cases = []
    for label, schedule in (("gpipe(2, 3)", gpipe(2, 3)), ("one_f_one_b(2, 3)", one_f_one_b(2, 3))):
        modules, specs, widths = _mlp_stages(rng, 2)
        cases.append(_case(GPIPE_1F1B, f"{label} (the public test's, 2 ranks)", specs, modules,
                           torch.randn(6, widths[0]), torch.randn(6, widths[-1]), schedule))
    return cases


def _executor_cases(seed: int, p: int = 3) -> list[_Case]:
    import torch
    import torch.nn as nn
    from scaletrain.models import Block, GPTConfig
    from scaletrain.pipeline import gpipe, interleaved_1f1b, one_f_one_b, zb_h1

    rng = random.Random(seed)
    torch.manual_seed(seed)
    config = dict(n_embd=12, n_head=3, n_layer=1, block_size=5)
    blocks = [Block(GPTConfig(**config)) for _ in range(p)]
    block_specs = [{"kind": "block", "config": config}] * p

    def mlp(n):
        return _mlp_stages(rng, n)

    cases = []
    m_gpipe, m_1f1b, m_hidden = rng.randint(2, 4), rng.randint(p + 1, 8), rng.randint(p + 1, 6)
    for label, schedule in [(f"gpipe({p}, {m_gpipe})", gpipe(p, m_gpipe)),
                            (f"one_f_one_b({p}, {m_1f1b})", one_f_one_b(p, m_1f1b)),
                            ("a hidden valid schedule", _hidden_valid(rng, one_f_one_b(p, m_hidden)))]:
        m = _sizes_of(schedule)[1]
        x, y = torch.randn(2 * m, 5, 12), torch.randn(2 * m, 5, 12)
        cases.append(_case(GPIPE_1F1B, label, block_specs, blocks, x, y, schedule))
    modules, specs, widths = mlp(2 * p)
    m, rows = p * rng.randint(1, 2), rng.randint(1, 3)
    cases.append(_case(INTERLEAVED, f"interleaved_1f1b({p}, {m}, 2)", specs, modules,
                       torch.randn(m * rows, widths[0]), torch.randn(m * rows, widths[-1]),
                       interleaved_1f1b(p, m, 2)))
    modules, specs, widths = mlp(p)
    m, rows = rng.randint(p, 5), rng.randint(1, 3)
    cases.append(_case(ZB_H1, f"zb_h1({p}, {m})", specs, modules,
                       torch.randn(m * rows, widths[0]), torch.randn(m * rows, widths[-1]), zb_h1(p, m)))
    return cases


def _microbatch_of(case: _Case, stage: int, x) -> int | None:
    """Which microbatch's input `x` is, for `stage` (the trace holds inputs, not indices)."""
    import torch
    if not isinstance(x, torch.Tensor) or not 0 <= stage < len(case.inputs):
        return None
    for i, ref in enumerate(case.inputs[stage]):
        if x.shape == ref.shape and x.dtype == ref.dtype and torch.allclose(x, ref, rtol=1e-4, atol=1e-5):
            return i
    return None


def _tokens(case: _Case, events: list) -> list[tuple]:
    """The trace as (kind, stage, microbatch): F a forward, G a gradient reaching a stage's
    output (B or I), A one weight-gradient accumulation (B or W; microbatch unknown)."""
    tokens, forward_of = [], {}
    for n, event in enumerate(events):
        kind, stage = event[0], event[1]
        if kind == "F":
            forward_of[n] = _microbatch_of(case, stage, event[2])
            tokens.append(("F", stage, forward_of[n]))
        elif kind == "G":
            tokens.append(("G", stage, forward_of.get(event[2])))
        elif kind == "A":
            tokens.append(("A", stage, None))
        else:
            raise ValueError(f"unknown event {kind!r}")
    return tokens


def _shown(case: _Case, tokens: list[tuple], split: bool) -> list[str]:
    """The trace as actions, for a reason: G + its accumulations = B (I, then W, when the step
    splits the backward; a W's microbatch is not in the trace)."""
    shown, k = [], 0

    def accumulations(stage, k):  # one action's weight gradients: one per parameter of the stage
        for _ in range(case.n_params[stage] if isinstance(stage, int) and 0 <= stage < len(case.n_params) else 1):
            if k < len(tokens) and tokens[k][:2] == ("A", stage):
                k += 1
        return k

    while k < len(tokens):
        kind, stage, i = tokens[k]
        mb = "?" if i is None else i
        k += 1
        if kind == "A":
            k = accumulations(stage, k - 1)
            shown.append(f"W?@s{stage}" if split else f"(weight gradients of s{stage})")
        elif kind == "G":
            if not split:
                k = accumulations(stage, k)
            shown.append(f"{'I' if split else 'B'}{mb}@s{stage}")
        else:
            shown.append(f"F{mb}@s{stage}")
    return shown


def _order_problem(case: _Case, rank: int, events: list) -> str | None:
    """Whether rank `rank` ran its schedule's actions in the schedule's order, read from the trace."""
    from scaletrain.pipeline import B, F, I
    tokens = _tokens(case, events)
    actions = case.schedule[rank]
    split = any(a.kind == I for a in actions)
    k = 0
    for pos, a in enumerate(actions):
        want = ("F" if a.kind == F else "G" if a.kind in (B, I) else "A", a.stage,
                None if a.kind not in (F, B, I) else a.microbatch)
        ok = k < len(tokens) and tokens[k] == want
        if ok:
            k += 1
            if a.kind not in (F, I):  # B and W: this stage's weight gradients (one per parameter)
                for _ in range(case.n_params[a.stage] - (a.kind != B)):
                    if k < len(tokens) and tokens[k][:2] == ("A", a.stage):
                        k += 1
            continue
        ran = _shown(case, tokens, split)
        done = len(_shown(case, tokens[:k], split))
        return (f"{case.label}, rank {rank}, action #{pos}: the schedule has {[str(b) for b in actions[pos:pos + 4]]}, "
                f"the executor ran {ran[done:done + 4] or 'nothing more'} (it must run the actions of the "
                f"schedule it is given, in its order)")
    if k < len(tokens):
        extra = _shown(case, tokens[k:], split)
        return f"{case.label}, rank {rank}: after its last action the executor still ran {extra[:4]}"
    return None


def _judge(case: _Case, rank: int, out: dict) -> tuple[list[str], list[str]]:
    """(problems of the schedule's check, problems of the losses/activations check) on one rank."""
    from scaletrain.pipeline import peak_in_flight
    schedule_problems, loss_problems = [], []
    p = len(case.schedule)
    mine = [s for s in range(len(case.specs)) if s % p == rank]
    for s in mine:
        got = out["grads"].get(str(s))
        if not isinstance(got, list) or [n for n, _ in got] != [n for n, _ in case.grads[s]]:
            schedule_problems.append(f"{case.label}, rank {rank}: stage {s}'s parameters came back as "
                                     f"{[n for n, _ in got] if isinstance(got, list) else got!r:.200}")
            continue
        for (name, grad), (_, ref) in zip(got, case.grads[s], strict=True):
            if grad is None:
                schedule_problems.append(f"{case.label}, rank {rank}, stage {s}: {name}.grad is None after step()")
                continue
            try:
                checks.assert_close(grad, ref, rtol=1e-5, atol=4e-5, what=f"stage {s} {name}.grad")
            except AssertionError as exc:
                schedule_problems.append(f"{case.label}, rank {rank}: {exc}")
    order = _order_problem(case, rank, out["events"])
    if order:
        schedule_problems.append(order)
    alive = [e[3] for e in out["events"] if e[0] == "F"]
    allowed = peak_in_flight(case.schedule[rank])
    if alive and max(alive) > allowed:
        schedule_problems.append(f"{case.label}, rank {rank}: {max(alive)} stage outputs (activations) were alive "
                                 f"at once; its schedule holds at most {allowed}")
    if len(case.specs) - 1 in mine:
        losses, m = out["losses"], len(case.losses)
        values = [float(v) if hasattr(v, "item") or type(v) in (int, float) else None
                  for v in losses] if isinstance(losses, list) else None
        if values is None or len(values) != m or any(a is None or not abs(a - b) <= 1e-5 * max(1.0, abs(b))
                                                     for a, b in zip(values, case.losses, strict=True)):
            loss_problems.append(f"{case.label}, rank {rank}: step() returned {losses!r:.200}, expected the {m} "
                                 f"microbatch losses {[round(v, 6) for v in case.losses]}")
    if out["in_flight_after"] != 0:
        loss_problems.append(f"{case.label}, rank {rank}: {out['in_flight_after']} (stage, microbatch) pairs still "
                             "held (stashed activations or pending W) after the step")
    if out["alive_after"] != 0:
        loss_problems.append(f"{case.label}, rank {rank}: {out['alive_after']} stage outputs (activations) still "
                             "alive after step() returned")
    return schedule_problems, loss_problems


def _judged(case: _Case, rank: int, out) -> tuple[list[str], list[str]]:
    try:
        return _judge(case, rank, out)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:  # not what the probe sends
        problem = f"{case.label}, rank {rank}: the executor's outputs are malformed ({type(exc).__name__}: {exc})"
        return [problem], [problem]


def _failure_of(call, *args, **kwargs) -> Exception | None:
    try:
        call(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the caller decides what the failure costs
        return exc
    return None


def _run_batches(worker, batches: list[list[_Case]], start: float) -> tuple[list, Exception | None]:
    """Each batch (cases of one world size) in one spawn of its ranks: ([(cases, per_rank)], the
    failure that stopped them or None)."""
    import time

    done = []
    for cases in batches:
        limit = max(30.0, EXECUTOR_GROUP_S - (time.monotonic() - start) - 10.0)
        try:
            done.append((cases, worker.call(PROBE + "run_executor", "pp_executor", [c.wire() for c in cases],
                                            SPAWN_LIMIT_S, timeout_s=limit)))
        except Exception as exc:  # noqa: BLE001 - reported inside every check
            return done, exc
    return done, None


def _problems(done: list) -> dict[str, list[str]]:
    problems: dict[str, list[str]] = {name: [] for name in (GPIPE_1F1B, INTERLEAVED, ZB_H1, LOSSES)}
    for cases, per_rank in done:
        for k, case in enumerate(cases):
            for rank in range(len(case.schedule)):
                try:
                    out = per_rank[rank][k]
                except (TypeError, IndexError, KeyError):
                    out = None
                mine, losses = _judged(case, rank, out)
                problems[case.check] += mine
                problems[LOSSES] += losses
    return problems


def group_executor(ctx):
    import threading
    import time

    start = time.monotonic()
    worker = ctx.untrusted()
    # the worker is started from this thread (forking while another thread imports is unsafe), then
    # loads torch and the student's executor and starts its fork server while the reference is
    # computed here
    failure = _failure_of(worker.call, PROBE + "load", timeout_s=LOAD_LIMIT_S)
    prepared: list = []
    thread = threading.Thread(daemon=True, target=lambda: prepared.append(_failure_of(
        worker.call, PROBE + "prepare_executor", "pp_executor", timeout_s=PREPARE_LIMIT_S)))
    if failure is None:
        thread.start()
    seed = checks.trial_seeds(1, salt=44)[0]
    batches = [_executor_cases(seed), _public_executor_cases(seed)]  # 3 ranks, then the public test's 2
    if failure is None:
        thread.join()
        failure = prepared[0]
    done = []
    if not isinstance(failure, TimeoutError):  # any other failure, the run meets again and reports
        done, failure = _run_batches(worker, batches, start)
    problems = _problems(done) if failure is None else {}
    for name in (GPIPE_1F1B, INTERLEAVED, ZB_H1, LOSSES):
        with ctx.check(name):
            if failure is not None:
                raise failure
            found = problems[name]
            more = f" (+{len(found) - 3} more)" if len(found) > 3 else ""
            assert not found, "; ".join(found[:3]) + more
