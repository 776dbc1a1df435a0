"""results.json (a superset of Gradescope's schema) and the score table printed to students."""

from __future__ import annotations

import json
import platform
from pathlib import Path

from autograder.checks import SEED
from autograder.runner import Result

_SYMBOL = {"passed": "ok", "failed": "FAIL", "error": "ERROR", "timeout": "TIMEOUT",
           "not_run": "not run", "flagged": "FLAGGED"}


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    try:
        import torch
        versions["torch"] = torch.__version__
    except Exception:  # noqa: BLE001 - the record must be written even if torch is broken
        versions["torch"] = "unavailable"
    return versions


def to_gradescope(results: list[Result], *, device: str, elapsed: float, harness_error: str = "") -> dict:
    tests = []
    for i, r in enumerate(results, 1):
        tests.append({
            "name": f"{r.assignment} task {r.check.task}: {r.check.name}",
            "number": f"{r.check.task}.{i}",
            "score": r.score,
            "max_score": r.check.points,
            "status": "passed" if r.outcome == "passed" else "failed",
            "output": r.reason,
            "visibility": r.check.visibility,
            "extra_data": {"outcome": r.outcome, "duration_s": r.duration},
        })
    not_run = sum(r.outcome == "not_run" for r in results)
    summary = summarize(results)
    output = summary if not harness_error else f"{summary}\nGRADER ERROR: {harness_error}"
    return {
        "score": round(sum(r.score for r in results), 4),
        "max_score": sum(r.check.points for r in results),
        "execution_time": round(elapsed, 2),
        "output": output,
        "tests": tests,
        "extra_data": {"device": device, "versions": _versions(), "seed": SEED,
                       "incomplete": bool(not_run) or bool(harness_error),
                       "not_run": not_run, "harness_error": harness_error},
    }


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def summarize(results: list[Result]) -> str:
    score = sum(r.score for r in results)
    gradable = sum(r.check.points for r in results if r.outcome != "not_run")
    total = sum(r.check.points for r in results)
    counts = {o: sum(r.outcome == o for r in results) for o in _SYMBOL}
    parts = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
    line = f"score {score:g} / {total:g} ({parts})"
    if gradable < total:
        line += f"; {total - gradable:g} points need a GPU and were not run here"
    return line


def table(results: list[Result]) -> str:
    rows = [("task", "check", "result", "points", "reason")]
    for r in results:
        rows.append((f"{r.assignment} {r.check.task}", r.check.name, _SYMBOL[r.outcome],
                     f"{r.score:g}/{r.check.points:g}", r.reason if r.outcome != "passed" else ""))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for j, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) +
                     (f"  {row[4]}" if row[4] else ""))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
