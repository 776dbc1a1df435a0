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

# Reasons are read by people, in a table and in results.json: a 50 MB exception message must not
# become a 50 MB report line, nor a results.json that Gradescope refuses.
MAX_REASON = 2000


def clip(text: str, limit: int = MAX_REASON) -> str:
    """`text` cut to at most `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    note = f" [... {len(text) - limit} more characters cut]"
    return text[:limit - len(note)] + note


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
    def __init__(self, group: str, checks: list[str], submission: Path, device: str, report: Path, *,
                 trusted: bool = False, timeout_s: float = 60.0):
        self.group, self.device, self.submission = group, device, submission
        self.trusted, self.timeout_s, self._worker = trusted, timeout_s, None
        self._report = report
        self._outcomes: dict[str, str] = {}
        self._names = set(checks)
        self._last_verdict = time.monotonic()  # the group's start, then each record's time
        self._note = ""

    def student(self, stem: str):
        """The submission's module `stem` (e.g. "ring" for ring.py), imported here: only in groups
        that are not `trusted` (a trusted group reaches it through `remote`)."""
        if self.trusted:
            raise RuntimeError(f"suite bug: trusted group {self.group!r} may not import {stem!r}; use ctx.remote")
        return student_module(stem, self.submission)

    def untrusted(self):
        """The sandboxed worker that runs the student's code for this trusted group (started on
        first use, killed by `close`)."""
        from autograder.untrusted import Untrusted

        if not self.trusted:
            raise RuntimeError(f"suite bug: group {self.group!r} is not marked trusted=True")
        if self._worker is None:
            self._worker = Untrusted(self.submission, timeout_s=self.timeout_s, device=self.device)
        return self._worker

    def remote(self, stem: str, probe: str = "autograder.probes.common:call"):
        """The student's module `stem` as data in, data out: `ctx.remote("memory").mfu(**kw)`."""
        from autograder.untrusted import RemoteModule

        return RemoteModule(self.untrusted(), stem, probe)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()

    def recorded(self, name: str) -> bool:
        return name in self._outcomes

    def passed(self, name: str) -> bool:
        return self._outcomes.get(name) == "passed"

    def note(self, text: str) -> None:
        """The reason shown if the current check passes (a speed check's margin, say)."""
        self._note = text

    def skip(self, reason: str) -> None:
        """End the current check as `failed` with `reason` (e.g. "graded after correctness passes")."""
        raise _Skip(reason)

    def check(self, name: str) -> contextlib.AbstractContextManager[None]:
        """The outcome of the block (see classify); its duration is the block's."""
        return self._verdict(name, since=time.monotonic())

    @contextlib.contextmanager
    def _verdict(self, name: str, since: float) -> Iterator[None]:
        if name not in self._names:
            raise KeyError(f"suite bug: check {name!r} is not declared in group {self.group!r}")
        outcome, self._note = "passed", ""
        try:
            yield
            reason = self._note
        except Exception as exc:  # noqa: BLE001 - a student's failure is an outcome, not a crash
            outcome, reason = classify(exc, self.submission)
        self.record(name, outcome, reason, time.monotonic() - since)

    def report_ranks(self, names, per_rank, failure: BaseException | None = None) -> None:
        """Give each check in `names` the outcome the ranks found. `per_rank`: one dict per rank,
        check name -> None (passed) or (exception type name, message). `failure`: what ended the
        spawn itself, if anything, which becomes every check's outcome. Otherwise a timeout on any
        rank is the cause (its peers only saw a broken ring); else the lowest rank's failure. The
        reason names the rank.

        Duration: the checks were decided together by the spawn that ran since the group's
        previous verdict (or its start), so each of them gets that whole time, not a share."""
        since = self._last_verdict
        for name in names:
            with self._verdict(name, since):
                if failure is not None:
                    raise failure
                problems = [(rank, outcomes[name]) for rank, outcomes in enumerate(per_rank)
                            if outcomes[name] is not None]
                if problems:
                    rank, (kind, message) = next((p for p in problems if p[1][0] == "TimeoutError"), problems[0])
                    raise _rank_exception(kind, message if message.startswith("rank") else f"rank {rank}: {message}")

    def record(self, name: str, outcome: str, reason: str, duration: float = 0.0) -> None:
        self._outcomes[name] = outcome
        self._last_verdict = time.monotonic()
        with open(self._report, "a") as f:
            f.write(json.dumps({"name": name, "outcome": outcome, "reason": clip(reason),
                                "duration": round(duration, 3)}) + "\n")
            f.flush()


def _rank_exception(kind: str, message: str) -> Exception:
    """The exception a rank reported as (type name, message), rebuilt for `classify`."""
    if kind == "TimeoutError" or "timed out" in message.lower():
        return TimeoutError(message)
    known = {"AssertionError": AssertionError, "NotImplementedError": NotImplementedError, "Flagged": Flagged}
    return known[kind](message) if kind in known else RuntimeError(f"{kind}: {message}")
