"""Run one test group in its own subprocess, so a hang, crash or `os._exit` costs that group only.

Parent side (`run_group`): start `python -m autograder.runner <group spec> ...` in a new session, wait up to the
group's timeout, then kill the whole process group (ranks spawned by the student's code
included). Child side (`main`): import the suite, call the group function with a GroupContext.
Checks the child never reported become `timeout` (killed), or `error` naming the exit code.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from autograder.checks import SUBMISSION_ENV
from autograder.context import GroupContext, classify
from autograder.manifest import Check, Group, Manifest


@dataclass(frozen=True)
class Result:
    assignment: str
    check: Check
    outcome: str
    reason: str
    duration: float = 0.0

    @property
    def score(self) -> float:
        return self.check.points if self.outcome == "passed" else 0.0


def run_group(manifest: Manifest, group: Group, submission: Path, device: str) -> list[Result]:
    if group.needs_gpu and device != "cuda":
        return [Result(manifest.assignment, c, "not_run", "needs a CUDA GPU; none on this machine")
                for c in group.checks]
    with tempfile.TemporaryDirectory(prefix=f"grade-{manifest.assignment}-") as tmp:
        report = Path(tmp) / "report.jsonl"
        report.touch()
        log = Path(tmp) / "output.log"
        start = time.monotonic()
        timed_out, code = _run_child(group, submission, device, report, log, tmp)
        elapsed = time.monotonic() - start
        reported = {r["name"]: r for r in map(json.loads, report.read_text().splitlines())}
        tail = _last_line(log.read_text(errors="replace"))
    results = []
    for c in group.checks:
        if c.name in reported:
            r = reported[c.name]
            results.append(Result(manifest.assignment, c, r["outcome"], r["reason"], r["duration"]))
        elif timed_out:
            results.append(Result(manifest.assignment, c, "timeout",
                                  f"group '{group.name}' did not finish within {group.timeout_s:.0f} s "
                                  "(an infinite loop or a deadlock?)", elapsed))
        else:
            why = (f"the test process exited with code {code} before this check ({tail})" if code
                   else "not reached (the group ended before this check)")
            results.append(Result(manifest.assignment, c, "error", why))
    return results


def _run_child(group, submission, device, report, log, cwd) -> tuple[bool, int | None]:
    env = dict(os.environ, **{SUBMISSION_ENV: str(submission), "PYTHONUNBUFFERED": "1"})
    spec = json.dumps({"group": group.name, "fn": group.fn, "checks": [c.name for c in group.checks]})
    cmd = [sys.executable, "-m", "autograder.runner", spec, str(submission), device, str(report)]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=group.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            code, timed_out = None, True
        finally:
            _kill_session(proc)
    return timed_out, code


def _kill_session(proc: subprocess.Popen) -> None:
    """Kill everything the group started (spawned ranks too), then reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def main(argv: list[str]) -> int:
    spec, submission, device, report = argv
    spec = json.loads(spec)
    ctx = GroupContext(spec["group"], spec["checks"], Path(submission), device, Path(report))
    module_name, fn_name = spec["fn"].split(":")
    try:
        getattr(importlib.import_module(module_name), fn_name)(ctx)
    except Exception as exc:  # noqa: BLE001 - outside any check: e.g. the student's import failed
        outcome, reason = classify(exc, Path(submission))
        for name in spec["checks"]:
            if not ctx.recorded(name):
                ctx.record(name, outcome, reason)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
