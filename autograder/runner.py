"""Run one test group in its own subprocess, so a hang, crash or `os._exit` costs that group only.

Parent side (`run_group`): start `python -m autograder.runner <group spec> ...` in a sandbox
(autograder/sandbox.py: a warden that enforces the group's timeout and limits, runs it as an
unprivileged user, and kills every process it left, ranks and detached ones included), then read
the group's report (a trusted group's runner is forked from the zygote instead, when one is
active: autograder/zygote.py). Child side (`main`): import the suite, call the group function with a
GroupContext. Checks the child never reported become `timeout` (killed), or `error` naming the
exit code. The report is written by a process that runs student code, so it is read as untrusted
input: a line that is malformed, too long, names an unknown outcome or repeats a check never
crashes the grader; it becomes an `error` of the check it names (nothing, if it names none).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from autograder import sandbox, untrusted, zygote
from autograder.checks import SUBMISSION_ENV
from autograder.context import GroupContext, classify, clip
from autograder.manifest import OUTCOMES, Check, Group, Manifest

MAX_LINE = 16 << 10       # bytes; an honest line is a name, an outcome and a reason of <= 2000 characters
VAULT_UID = 65534         # owner of a trusted group's report when its worker is a capability-less root
LOG_TAIL = 64 << 10       # bytes at the end of the group's output searched for its last line


@dataclass(frozen=True)
class Result:
    assignment: str
    check: Check
    outcome: str
    reason: str
    duration: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "reason", clip(self.reason))  # whichever way it was made

    @property
    def score(self) -> float:
        return self.check.points if self.outcome == "passed" else 0.0


def run_group(manifest: Manifest, group: Group, submission: Path, device: str, *,
              build: Path | None = None) -> list[Result]:
    """`build`: the grading build a trusted group's worker imports (grade.py makes it)."""
    if group.needs_gpu and device != "cuda":
        return [Result(manifest.assignment, c, "not_run", "needs a CUDA GPU; none on this machine")
                for c in group.checks]
    if group.needs_gpu and group.gpus > 1 and (found := gpu_count()) < group.gpus:
        return [Result(manifest.assignment, c, "not_run", f"needs {group.gpus} GPUs, found {found}")
                for c in group.checks]
    with tempfile.TemporaryDirectory(prefix=f"grade-{manifest.assignment}-", ignore_cleanup_errors=True) as tmp:
        report = Path(tmp) / "report.jsonl"
        report.touch()
        log = Path(tmp) / "output.log"
        box = sandbox.prepare(Path(tmp), timeout_s=group.timeout_s, device=device, writable=(report,),
                              switch=not group.trusted)
        start = time.monotonic()
        if group.trusted:
            _vault(Path(tmp), report)
        timed_out, code = _run_child(group, submission, device, report, log, box, build)
        elapsed = time.monotonic() - start
        reported = read_report(report, [c.name for c in group.checks])
        tail = _last_line(log)
    results = []
    for c in group.checks:
        if c.name in reported:
            results.append(Result(manifest.assignment, c, *reported[c.name]))
        elif timed_out:
            results.append(Result(manifest.assignment, c, "timeout",
                                  f"group '{group.name}' did not finish within {group.timeout_s:.0f} s "
                                  "(an infinite loop or a deadlock?)", elapsed))
        else:
            why = (f"the test process exited with code {code} before this check ({tail})" if code
                   else "not reached (the group ended before this check)")
            results.append(Result(manifest.assignment, c, "error", why))
    return results


def gpu_count() -> int:
    """CUDA GPUs this grader sees (its workers see the same)."""
    import torch

    return torch.cuda.device_count()


def _vault(folder: Path, report: Path) -> None:
    """A trusted group's worker may be root without capabilities (when the sandbox account can't
    run Python): as the owner of root's files it could still rewrite the report. Files of another
    owner, mode 0600/0700, are out of its reach and not of the grader's, which keeps its
    capabilities (CAP_DAC_OVERRIDE)."""
    if os.geteuid() == 0 and untrusted.worker_runs_as_root():
        os.chown(report, VAULT_UID, VAULT_UID)
        report.chmod(0o600)
        os.chown(folder, VAULT_UID, VAULT_UID)
        folder.chmod(0o700)


def _run_child(group, submission, device, report, log, box, build) -> tuple[bool, int | None]:
    env = dict(os.environ, **{SUBMISSION_ENV: str(submission), "PYTHONUNBUFFERED": "1"})
    if build is not None:
        env[untrusted.BUILD_ENV] = str(build)
    spec = json.dumps({"group": group.name, "fn": group.fn, "checks": [c.name for c in group.checks],
                       "trusted": group.trusted, "timeout_s": group.timeout_s})
    cmd = [sys.executable, "-m", "autograder.runner", spec, str(submission), device, str(report)]
    return zygote.run(cmd, box, env=env, log=log, trusted=group.trusted)


def read_report(path: Path, names: list[str]) -> dict[str, tuple[str, str, float]]:
    """check name -> (outcome, reason, duration) from a group's report. A check named by a bad line
    (malformed, too long, unknown outcome) or by more than one line gets `error`; a line naming no
    check of the group is ignored. No regular file there (the group removed it): nothing reported."""
    first: dict[str, tuple[str, str, float]] = {}
    count: Counter[str] = Counter()
    for head, size in _report_lines(path):
        name, verdict = _parse_line(head, size, names)
        if name is not None:
            count[name] += 1
            first.setdefault(name, verdict)
    return {name: verdict if count[name] == 1 else
            ("error", f"reported {count[name]} times (a second writer of the report?); "
                      f"first: {verdict[0]}: {verdict[1]}", 0.0)
            for name, verdict in first.items()}


def _report_lines(path: Path) -> Iterator[tuple[bytes, int]]:
    """(its first MAX_LINE + 1 bytes, its length) for each line of a report, holding no more than
    that in memory: the report can be as large as the group's RLIMIT_FSIZE."""
    if not path.is_file():  # not a FIFO either: reading one would block the grader
        return
    with open(path, "rb") as f:
        while head := f.readline(MAX_LINE + 1):
            size, tail = len(head), head
            while not tail.endswith(b"\n") and (tail := f.readline(1 << 20)):
                size += len(tail)
            yield head.rstrip(b"\n"), size - 1 if tail.endswith(b"\n") else size


def _parse_line(head: bytes, size: int, names: list[str]) -> tuple[str | None, tuple[str, str, float] | None]:
    """(the check a report line names, its verdict: `error` when the line is bad); (None, None)
    when it names no check of the group."""
    if size > MAX_LINE:
        return _name_in(head, names), ("error", f"report line of {size} bytes: too long", 0.0)
    try:
        entry = json.loads(head)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested thousands deep
        return _name_in(head, names), ("error", f"malformed report line: {clip(head.decode(errors='replace'), 200)}", 0.0)
    if not isinstance(entry, dict) or entry.get("name") not in names:
        return None, None
    outcome, reason, duration = entry.get("outcome"), entry.get("reason"), entry.get("duration")
    if outcome not in OUTCOMES:
        return entry["name"], ("error", f"report line with an unknown outcome: {clip(repr(outcome), 200)}", 0.0)
    if not isinstance(reason, str) or not isinstance(duration, (int, float)) or not 0 <= duration < 1e6:
        return entry["name"], ("error", "report line without a reason or a plausible duration", 0.0)
    return entry["name"], (outcome, reason, float(duration))


def _name_in(raw: bytes, names: list[str]) -> str | None:
    """The check a damaged line starts with, `{"name": "<name>", ...` as GroupContext writes it."""
    text = raw.decode(errors="replace")
    return next((n for n in names if text.startswith(json.dumps({"name": n})[:-1] + ",")), None)


def _last_line(log: Path) -> str:
    """The group's last line of output (its error, usually), from the end of the log only."""
    if not log.is_file():
        return "no output"
    with open(log, "rb") as f:
        f.seek(max(f.seek(0, os.SEEK_END) - LOG_TAIL, 0))
        text = f.read().decode(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def main(argv: list[str]) -> int:
    spec, submission, device, report = argv
    spec = json.loads(spec)
    ctx = GroupContext(spec["group"], spec["checks"], Path(submission), device, Path(report),
                       trusted=spec["trusted"], timeout_s=spec["timeout_s"])
    module_name, fn_name = spec["fn"].split(":")
    try:
        getattr(importlib.import_module(module_name), fn_name)(ctx)
    except Exception as exc:  # noqa: BLE001 - outside any check: e.g. the student's import failed
        outcome, reason = classify(exc, Path(submission))
        for name in spec["checks"]:
            if not ctx.recorded(name):
                ctx.record(name, outcome, reason)
    finally:
        ctx.close()
    return 0


if __name__ == "__main__":
    sandbox.exit_now(main(sys.argv[1:]))
