"""The object a group function receives: it turns each `with ctx.check(name):` into one outcome.

Outcomes are appended to a JSON-lines report as soon as each check ends, so a crash or a kill
later in the group keeps every result already earned.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import traceback
from pathlib import Path
from typing import Iterator

from autograder.checks import Flagged, student_module


class _Skip(Exception):
    pass


def _student_line(tb_text: str, submission: Path) -> str:
    """' (at ring.py:42)' for the deepest frame in the submission folder, else ''."""
    hits = re.findall(r'File "([^"]+)", line (\d+)', tb_text)
    for filename, line in reversed(hits):
        if Path(filename).resolve().parent == submission:
            return f" (at {Path(filename).name}:{line})"
    return ""


def classify(exc: BaseException, submission: Path) -> tuple[str, str]:
    """(outcome, one-line reason) for an exception raised inside a check."""
    from scaletrain.launch import RankError, SpawnTimeout

    if isinstance(exc, _Skip):
        return "failed", str(exc)
    if isinstance(exc, (SpawnTimeout, TimeoutError)):
        return "timeout", str(exc).splitlines()[0]
    if isinstance(exc, RankError):
        where = _student_line(exc.remote_traceback, submission)
        kind = {"AssertionError": "failed", "NotImplementedError": "failed", "Flagged": "flagged"}
        outcome = kind.get(exc.exc_type, "error")
        prefix = "not implemented yet: " if exc.exc_type == "NotImplementedError" else ""
        return outcome, f"rank {exc.rank}: {prefix}{exc.exc_type}: {exc.message.splitlines()[0] if exc.message else ''}{where}"
    where = _student_line("".join(traceback.format_exception(exc)), submission)
    first = str(exc).splitlines()[0] if str(exc) else ""
    if isinstance(exc, Flagged):
        return "flagged", f"{first}{where}"
    if isinstance(exc, NotImplementedError):
        return "failed", f"not implemented yet: {first}{where}"
    if isinstance(exc, AssertionError):
        return "failed", f"{first or 'assertion failed'}{where}"
    return "error", f"{type(exc).__name__}: {first}{where}"


class GroupContext:
    def __init__(self, group: str, checks: list[str], submission: Path, device: str, report: Path):
        self.group, self.device, self.submission = group, device, submission
        self._report = report
        self._outcomes: dict[str, str] = {}
        self._names = set(checks)

    def student(self, stem: str):
        """The submission's module `stem` (e.g. "ring" for ring.py)."""
        return student_module(stem, self.submission)

    def recorded(self, name: str) -> bool:
        return name in self._outcomes

    def passed(self, name: str) -> bool:
        return self._outcomes.get(name) == "passed"

    def skip(self, reason: str) -> None:
        """End the current check as `failed` with `reason` (e.g. "graded after correctness passes")."""
        raise _Skip(reason)

    @contextlib.contextmanager
    def check(self, name: str) -> Iterator[None]:
        if name not in self._names:
            raise KeyError(f"suite bug: check {name!r} is not declared in group {self.group!r}")
        start = time.monotonic()
        outcome, reason = "passed", ""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - a student's failure is an outcome, not a crash
            outcome, reason = classify(exc, self.submission)
        self.record(name, outcome, reason, time.monotonic() - start)

    def report_ranks(self, names, per_rank, failure: BaseException | None = None) -> None:
        """Give each check in `names` the outcome the ranks found. `per_rank`: one dict per rank,
        check name -> None (passed) or (exception type name, message). `failure`: what ended the
        spawn itself, if anything, which becomes every check's outcome. Otherwise a timeout on any
        rank is the cause (its peers only saw a broken ring); else the lowest rank's failure. The
        reason names the rank."""
        for name in names:
            with self.check(name):
                if failure is not None:
                    raise failure
                problems = [(rank, outcomes[name]) for rank, outcomes in enumerate(per_rank)
                            if outcomes[name] is not None]
                if problems:
                    rank, (kind, message) = next((p for p in problems if p[1][0] == "TimeoutError"), problems[0])
                    raise _rank_exception(kind, message if message.startswith("rank") else f"rank {rank}: {message}")

    def record(self, name: str, outcome: str, reason: str, duration: float = 0.0) -> None:
        self._outcomes[name] = outcome
        with open(self._report, "a") as f:
            f.write(json.dumps({"name": name, "outcome": outcome, "reason": reason,
                                "duration": round(duration, 3)}) + "\n")
            f.flush()


def _rank_exception(kind: str, message: str) -> Exception:
    """The exception a rank reported as (type name, message), rebuilt for `classify`."""
    if kind == "TimeoutError" or "timed out" in message.lower():
        return TimeoutError(message)
    known = {"AssertionError": AssertionError, "NotImplementedError": NotImplementedError, "Flagged": Flagged}
    return known[kind](message) if kind in known else RuntimeError(f"{kind}: {message}")
