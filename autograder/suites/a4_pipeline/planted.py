"""a4's planted submissions: each a text edit of the solution and the outcome it must get. Tasks
4.1 and 4.2 are graded by properties (scaletrain.pipeline.schedule_rules): another order earns
every point, and each small mistake costs the properties it breaks."""

from __future__ import annotations

from autograder.manifest import Planted

from .names import (C1_BUBBLE, C1_COOLDOWN, C1_PEAK, C1_REJECT, C1_STEADY, C1_VALID, C1_WARMUP, C2_BUBBLE, C2_PEAK,
                    C2_REJECT, C2_VALID, C3_ACCEPT, C3_CHANNEL, C3_DETECT, C3_REPORT, C4_1F1B, C4_GPIPE,
                    C4_INTERLEAVED, C4_LOSSES, C4_MEMORY, C4_ZB_H1, E, ONE_F_ONE_B_CHECKS, S, V)

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
        names = NAMES_HERE
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
    _check_sizes("one_f_one_b", p, m, needs_m_ge_p=True)'''.replace("NAMES_HERE", repr(list(ONE_F_ONE_B_CHECKS)))

_ONE_F_ONE_B_PASS = {c: "passed" for c in ONE_F_ONE_B_CHECKS}
_PAIR = "actions += [Action(r, F, warmup + i), Action(r, B, i)]"
_INTERLEAVED_WARMUP = "warmup = min(2 * (p - r - 1) + (v - 1) * p, total)"
_RETURN_1F1B = "        schedule[r] = actions\n    return schedule\n\n\ndef interleaved_1f1b"

PLANTED = (
    Planted("another design: 1F1B with the microbatches in reverse order", S,
            (_RETURN_1F1B, "        schedule[r] = [Action(a.stage, a.kind, m - 1 - a.microbatch) for a in actions]\n"
                           "    return schedule\n\n\ndef interleaved_1f1b"),
            groups=("pure",), expect=_ONE_F_ONE_B_PASS),
    Planted("1F1B pair swapped: backward before its forward", S, (_PAIR, _PAIR.replace(
        "Action(r, F, warmup + i), Action(r, B, i)", "Action(r, B, i), Action(r, F, warmup + i)")), groups=("pure",),
            expect={C1_VALID: "failed", C1_WARMUP: "failed", C1_REJECT: "passed", C2_VALID: "passed"}),
    # issue 27: m = p - 1, the public test's boundary, passed the hidden m = p - 2 before
    Planted("1F1B accepts m = p - 1 (checks m < p - 1)", S,
            ('    _check_sizes("one_f_one_b", p, m, needs_m_ge_p=True)\n',
             '    _check_sizes("one_f_one_b", p, m)\n    if m < p - 1:\n'
             '        raise ValueError(f"one_f_one_b: needs m >= p microbatches, got m={m} < p={p}")\n'),
            groups=("pure",), expect={**_ONE_F_ONE_B_PASS, C1_REJECT: "failed"}),
    Planted("1F1B forgets its cool-down backwards", S,
            ("actions += [Action(r, B, i) for i in range(m - warmup, m)]", "actions += []"), groups=("pure",),
            expect={C1_VALID: "failed", C1_COOLDOWN: "failed", C1_WARMUP: "passed", C1_STEADY: "passed",
                    C1_REJECT: "passed"}),
    Planted("1F1B's warm-up one forward short", S,
            ("        warmup = p - r - 1\n", "        warmup = max(p - r - 2, 0)\n"), groups=("pure",),
            expect={C1_WARMUP: "failed", C1_BUBBLE: "failed", C1_VALID: "passed", C1_PEAK: "passed",
                    C1_STEADY: "passed", C1_COOLDOWN: "passed", C1_REJECT: "passed"}),
    Planted("infinite loop in interleaved", S,
            (_INTERLEAVED_WARMUP, _INTERLEAVED_WARMUP + "\n        while True:\n            pass"), groups=("pure",),
            expect={C2_VALID: "timeout", C2_REJECT: "passed", C1_VALID: "passed", C3_DETECT: "passed"}),
    Planted("interleaved's warm-up one forward longer", S,
            (_INTERLEAVED_WARMUP, _INTERLEAVED_WARMUP.replace("* p, total", "* p + 1, total")), groups=("pure",),
            expect={C2_PEAK: "failed", C2_VALID: "passed", C2_BUBBLE: "passed", C2_REJECT: "passed"}),
    Planted("dry run matches messages by name, ignoring the channel order", V,
            ("if not queue or queue[0] != need:\n"
             "                        break  # blocked: the message it needs is not next on its channel\n"
             "                    queue.popleft()",
             "if need not in (queue or ()):\n                        break\n"
             "                    queue.remove(need)"),
            groups=("pure",),
            expect={C3_CHANNEL: "failed", C3_ACCEPT: "passed"}),  # some hidden deadlocks are out-of-order receives
    Planted("dry run names the highest stalled rank, not the lowest", V,
            ("        r = stalled[0]\n", "        r = stalled[-1]\n"), groups=("pure",),
            expect={C3_REPORT: "failed", C3_ACCEPT: "passed", C3_DETECT: "passed"}),
    Planted("dry run special-cases the public examples (accepts everything else)", V,
            ("p = len(schedule)\n    channels", _SPECIAL_CASED + "\n    channels"), groups=("pure",),
            expect={C3_ACCEPT: "passed", C3_DETECT: "failed", C3_REPORT: "failed", C3_CHANNEL: "failed",
                    C1_VALID: "passed"}),
    Planted("dry run reads the expected verdict from the grader's frames", V,
            ("p = len(schedule)\n    channels", _FRAME_PEEK + "\n    channels"), groups=("pure",),
            expect={C3_ACCEPT: "passed", C3_DETECT: "failed", C3_REPORT: "failed", C3_CHANNEL: "failed"}),
    Planted("unimplemented 1F1B patches the classifier, forges report lines, registers atexit", S,
            ('    _check_sizes("one_f_one_b", p, m, needs_m_ge_p=True)', "    " + _FORGER), groups=("pure",),
            expect={**{c: "failed" for c in ONE_F_ONE_B_CHECKS}, C2_VALID: "passed"}),
    Planted("loss not divided by m", E, ("y = loss / self.m", "y = loss"), groups=("executor",),
            expect={C4_GPIPE: "failed", C4_1F1B: "failed", C4_LOSSES: "passed", C4_MEMORY: "failed"}),
    Planted("the loss recorded after dividing by m", E,
            ("self.losses[i] = loss.item()", "self.losses[i] = loss.item() / self.m"), groups=("executor",),
            expect={C4_LOSSES: "failed", C4_GPIPE: "passed", C4_1F1B: "passed", C4_MEMORY: "passed"}),
    Planted("a backward keeps its stash entry (activations never freed)", E,
            ("x, y = self._stash.pop((s, i))", "x, y = self._stash[(s, i)]"), groups=("executor",),
            expect={C4_MEMORY: "failed", C4_GPIPE: "passed", C4_1F1B: "passed", C4_LOSSES: "passed"}),
    Planted("executor runs every schedule as GPipe (all forwards, then all backwards)", E,
            ("self.actions: list[Action] = list(schedule[self.pp_rank])",
             "self.actions: list[Action] = sorted(schedule[self.pp_rank], key=lambda a: (\n"
             "            a.kind != F, a.stage if a.kind == F else -a.stage, a.microbatch, a.kind == W))"),
            groups=("executor",),
            expect={C4_GPIPE: "passed", C4_LOSSES: "passed", C4_1F1B: "failed", C4_INTERLEAVED: "failed",
                    C4_ZB_H1: "failed", C4_MEMORY: "failed"}),
)
