"""results.json (a superset of Gradescope's schema) and the score table printed to students.

A `not_run` check (it needs a CUDA device this machine lacks) is pending, not failed, so in
results.json its test has `score` 0 and `max_score` 0: Gradescope adds nothing to either side and
the student loses no points. Gradescope knows only two statuses and marks a test whose score
reaches its max_score `passed` by default, so its `status` is "passed" (it sits under "passed
tests" with 0.0/0.0, never in red); its name ends in "(pending: GPU grading)", its `output` says
"pending: N points, graded on a GPU machine" and its `extra_data` keeps `outcome: not_run` and
`pending_points`. The top-level `max_score` counts only the checks that ran; the top-level
`extra_data` says `pending_points` and `incomplete: true`.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
import tempfile
from pathlib import Path

from autograder.checks import grading_seed
from autograder.manifest import OUTCOMES, Manifest
from autograder.runner import Result


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    try:
        import torch
        versions["torch"] = torch.__version__
    except Exception:  # noqa: BLE001 - the record must be written even if torch is broken
        versions["torch"] = "unavailable"
    return versions


def _pending_note(points: float) -> str:
    return f"pending: {points:g} points, graded on a GPU machine; "


def _test(r: Result, number: int, hidden_visibility: str) -> dict:
    pending = r.outcome == "not_run"
    extra = {"outcome": r.outcome, "duration_s": round(r.duration, 3),
             "assignment": r.assignment, "task": r.check.task, "check": r.check.name}
    if pending:
        extra["pending_points"] = r.check.points
    return {
        "name": f"{r.assignment} task {r.check.task}: {r.check.name}{' (pending: GPU grading)' if pending else ''}",
        "number": f"{r.check.task}.{number}",
        "score": r.score,
        "max_score": 0 if pending else r.check.points,
        "status": "passed" if r.outcome in ("passed", "not_run") else "failed",
        "output": (_pending_note(r.check.points) if pending else "") + r.reason,
        "visibility": r.check.visibility or hidden_visibility,
        "extra_data": extra,
    }


def to_gradescope(results: list[Result], *, device: str, elapsed: float, harness_error: str = "",
                  hidden_visibility: str = "visible") -> dict:
    """The results.json payload; `elapsed` is the wall time of the whole grading run;
    `hidden_visibility`: Gradescope's visibility of the checks the suite keeps hidden (a package
    chooses it; a local grade shows everything)."""
    pending = sum(r.check.points for r in results if r.outcome == "not_run")
    summary = summarize(results)
    output = summary if not harness_error else f"{summary}\nGRADER ERROR: {harness_error}"
    return {
        "score": round(sum(r.score for r in results), 4),
        "max_score": sum(r.check.points for r in results if r.outcome != "not_run"),
        "execution_time": round(elapsed, 2),
        "output": output,
        "tests": [_test(r, i, hidden_visibility) for i, r in enumerate(results, 1)],
        "extra_data": {"device": device, "versions": _versions(), "seed": grading_seed(),
                       "incomplete": bool(pending) or bool(harness_error), "pending_points": pending,
                       "not_run": sum(r.outcome == "not_run" for r in results), "harness_error": harness_error},
    }


def from_gradescope(payload: dict, manifest: Manifest) -> list[Result]:
    """The Results of `manifest`'s checks recorded in a results.json written by `to_gradescope`, in
    the file's order; tests of other assignments or of checks no longer in the manifest are left out
    (a class regrade reads earlier runs back to resume and to merge CPU and GPU runs)."""
    checks = {c.name: c for c in manifest.checks}
    results = []
    for t in payload.get("tests", []):
        extra = t.get("extra_data", {})
        check = checks.get(extra.get("check"))
        if extra.get("assignment") != manifest.assignment or check is None or extra.get("outcome") not in OUTCOMES:
            continue
        reason = t.get("output", "")
        if extra["outcome"] == "not_run":
            reason = reason.removeprefix(_pending_note(check.points))
        results.append(Result(manifest.assignment, check, extra["outcome"], reason, extra.get("duration_s", 0.0)))
    return results


class UnsafeDestination(OSError):
    """Something other than a regular file (a FIFO, a link, a folder) stands where results go."""


def write_json(path: Path, payload: dict) -> None:
    """Written whole or not at all, never through what someone planted at `path`: the file is created
    (O_EXCL | O_NOFOLLOW) in a new folder only this process can enter, next to `path`, then renamed
    over it. An interrupted run never leaves a truncated results.json that a resumed regrade would
    take for a finished one; a FIFO or a link at `path` is refused, not followed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        kind = stat.S_IFMT(os.lstat(path).st_mode)
    except FileNotFoundError:
        kind = stat.S_IFREG
    if kind != stat.S_IFREG:
        raise UnsafeDestination(f"{path} exists and is not a regular file: refusing to write results through it")
    private = Path(tempfile.mkdtemp(prefix=".results-", dir=path.parent))  # mode 0700
    try:
        tmp = private / path.name
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(payload, indent=2) + "\n")
        os.replace(tmp, path)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def summarize(results: list[Result]) -> str:
    score = sum(r.score for r in results)
    graded = sum(r.check.points for r in results if r.outcome != "not_run")
    pending = sum(r.check.points for r in results if r.outcome == "not_run")
    counts = {o: sum(r.outcome == o for r in results) for o in OUTCOMES}
    parts = ", ".join(f"{n} {o}" for o, n in counts.items() if n) or "nothing graded"
    if not pending:
        return f"score {score:g} / {graded:g} ({parts})"
    return f"score {score:g} / {graded:g} graded here ({parts}); {pending:g} points pending: need a GPU"


def _points(r: Result) -> str:
    return f"-/{r.check.points:g} pending" if r.outcome == "not_run" else f"{r.score:g}/{r.check.points:g}"


def table(results: list[Result]) -> str:
    rows = [("task", "check", "result", "points", "reason")]
    for r in results:
        rows.append((f"{r.assignment} {r.check.task}", r.check.name, r.outcome, _points(r),
                     r.reason if r.outcome != "passed" else ""))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for j, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) +
                     (f"  {row[4]}" if row[4] else ""))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
