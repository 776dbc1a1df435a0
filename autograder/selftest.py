"""The grader grades itself: solutions must get full marks, untouched stubs zero without a single
`error`, and every planted broken submission exactly the outcomes its manifest expects."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from autograder import zygote
from autograder.grade import grade_assignment, shared_build, static_outcomes
from autograder.manifest import Manifest, Planted, get_manifest
from autograder.runner import Result


@dataclass(frozen=True)
class CaseResult:
    case: str
    ok: bool
    detail: str
    seconds: float = 0.0  # the case's wall time (beside another case: the stub and plants run two at a time)


def _mismatches(results: list[Result], allowed: set[str]) -> list[str]:
    return [f"{r.check.name}: {r.outcome} ({r.reason})" for r in results if r.outcome not in allowed]


def check_solution(m: Manifest, device: str, progress, build: Path | None = None) -> CaseResult:
    results = grade_assignment(m, m.solution_dir(), device, build=build, progress=progress)
    bad = _mismatches(results, {"passed", "not_run"})
    return CaseResult(f"{m.assignment} solution gets full marks", not bad, "; ".join(bad))


def check_stub(m: Manifest, device: str, progress, build: Path | None = None) -> CaseResult:
    results = grade_assignment(m, m.stub_dir(), device, build=build, progress=progress)
    bad = _mismatches(results, {"failed", "not_run"})
    return CaseResult(f"{m.assignment} untouched stub scores zero cleanly", not bad, "; ".join(bad))


def check_planted(m: Manifest, planted: Planted, device: str, progress, build: Path | None = None) -> CaseResult:
    name = f"{m.assignment} planted '{planted.name}'"
    with tempfile.TemporaryDirectory(prefix=f"planted-{m.assignment}-") as tmp:
        folder = Path(tmp) / m.folder
        shutil.copytree(m.solution_dir(), folder)
        target = folder / planted.file
        try:
            target.write_text(planted.apply(target.read_text()))
        except ValueError as exc:
            return CaseResult(name, False, str(exc))
        results = grade_assignment(m, folder, device, groups=planted.groups,
                                   timeout_s=planted.timeout_s, build=build, progress=progress)
    got = {r.check.name: r for r in results}
    want = {check: " or ".join(planted.allowed(check)) for check in planted.expect}
    bad = [f"{check}: expected {want[check]}, got {got[check].outcome} ({got[check].reason})"
           if check in got else f"{check}: expected {want[check]}, but its group was not graded"
           for check in planted.expect
           if check not in got or got[check].outcome not in planted.allowed(check)]
    return CaseResult(name, not bad, "; ".join(bad))


def check_hostile_files(m: Manifest, device: str, progress, build: Path | None = None) -> CaseResult:
    """Planted for every assignment, decided before anything runs: each graded file in turn a link to
    the solution's (it would earn the reference's marks if followed), then, for Python, a 300,000-term
    expression (the parser's RecursionError): that file's checks are `error`, never a pass or a
    grader crash."""
    name = f"{m.assignment} planted links to the reference and files too deep to parse"
    bad = []
    with tempfile.TemporaryDirectory(prefix=f"hostile-{m.assignment}-") as tmp:
        for stub_name in m.files:
            for how in ("link", "deep") if stub_name.endswith(".py") else ("link",):
                folder = Path(tmp) / f"{how}-{stub_name}"
                shutil.copytree(m.solution_dir(), folder)
                target = folder / stub_name
                if how == "link":
                    target.unlink()
                    target.symlink_to(m.solution_dir() / stub_name)
                else:
                    target.write_text("x = " + "+".join(["1"] * 300_000) + "\n")
                decided = static_outcomes(m, folder)
                want = {c.name for c in m.checks if m.task(c.task).file == stub_name}
                bad += [f"{how} {stub_name}: {c}: {decided.get(c, ('not decided',))[0]}" for c in sorted(want)
                        if decided.get(c, ("",))[0] != "error"]
    return CaseResult(name, not bad, "; ".join(bad[:5]))


def run_selftest(assignment: str, *, device: str = "cpu",
                 progress: Callable[[str], None] = lambda s: None) -> list[CaseResult]:
    """The solution is graded alone (its speed checks need a quiet machine); the stub and the
    planted cases, two at a time: much of their time is spent waiting for a hang's time limit.
    All of them import one grading build of the library."""
    m = get_manifest(assignment)

    def timed(check, arg) -> CaseResult:
        start = time.perf_counter()
        case = check(arg, device, progress, build)
        return dataclasses.replace(case, seconds=time.perf_counter() - start)

    with zygote.preloaded(), shared_build(m) as build:
        cases = [timed(check_solution, m)]
        jobs = [(check_stub, m), (check_hostile_files, m)] + [(partial(check_planted, m), p) for p in m.planted]
        with ThreadPoolExecutor(max_workers=2) as pool:
            cases += pool.map(lambda job: timed(*job), jobs)
    return cases
