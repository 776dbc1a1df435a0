"""Grade one assignment's submission: static check first, then each group in its own subprocess,
on a fresh copy of the manifest's files only (nothing else the student put in the folder, such as
a helper module or a package that shadows `scaletrain`, can be imported while grading)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import stat
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable

from autograder.manifest import REPO, Manifest
from autograder.runner import Result, run_group
from autograder.untrusted import BUILD_ENV
from autograder.static_check import check_source


class UnusableSubmission(Exception):
    """The input can't be graded at all (missing folder); the grader exits with code 2."""


def check_library_origin() -> None:
    """The grader's `scaletrain` must be the one beside its own `autograder` (REPO/lib). Any other
    copy found first on sys.path (a `pip install` of the course into site-packages, a grading build
    whose graded modules run the submission) would run code the grader did not ship, the student's
    included, on its trusted side: a configuration error, not something to grade through."""
    spec = importlib.util.find_spec("scaletrain")
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if origin is None or not origin.is_relative_to(REPO / "lib"):
        raise UnusableSubmission(
            f"the grader imports scaletrain from {origin or 'nowhere'}, not from {REPO / 'lib'}: "
            f"run it with PYTHONPATH={REPO / 'lib'}:{REPO} (as run_autograder does) and do not pip-install the course")


def static_outcomes(manifest: Manifest, submission: Path) -> dict[str, tuple[str, str]]:
    """check name -> (outcome, reason) decided before anything runs: missing file, syntax error,
    forbidden name. Every check of every task written in that file gets it."""
    decided: dict[str, tuple[str, str]] = {}
    for stub_name in manifest.files:
        verdict = _file_verdict(manifest, submission, stub_name)
        if verdict is None:
            continue
        tasks = {t.id for t in manifest.tasks if t.file == stub_name}
        for c in manifest.checks:
            if c.task in tasks:
                decided[c.name] = verdict
    return decided


def _file_verdict(manifest: Manifest, submission: Path, stub_name: str) -> tuple[str, str] | None:
    """What a submitted file gets before anything runs, or None: missing, not a regular file (a link
    to someone else's file, a FIFO), a syntax error, a forbidden name, or a file the static check
    can't read (a 300,000-term expression: RecursionError), which is the file's fault, not the grader's."""
    path = submission / stub_name
    kind = _kind(path)
    if kind is None:
        return "error", f"{stub_name} is missing from {submission}"
    if kind != "file":
        return "error", f"{stub_name} is a {kind}, not a regular file: submit the file itself"
    try:
        findings = check_source(path.read_text(errors="replace"), stub_name, manifest.forbidden.get(stub_name, ()))
    except Exception as exc:  # noqa: BLE001 - RecursionError, MemoryError...: caused by the file's text
        return "error", f"{stub_name}: the grader could not parse this file ({type(exc).__name__}); simplify it"
    if not findings:
        return None
    f = findings[0]
    return ("error" if f.kind == "syntax" else "flagged"), f"{stub_name}:{f.line}: {f.message}"


def _kind(path: Path) -> str | None:
    """'file', or what else stands at `path` (never followed: a link is a 'symbolic link'); None if nothing."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return next((name for test, name in ((stat.S_ISREG, "file"), (stat.S_ISLNK, "symbolic link"),
                                         (stat.S_ISDIR, "folder"))
                 if test(mode)), "special file")


def ignored_files(manifest: Manifest, submission: Path) -> list[str]:
    """What the submission folder holds besides the manifest's files ("helper.py", "scaletrain/"):
    none of it is graded. Python's own __pycache__ is not listed."""
    return sorted(f"{p.name}/" if p.is_dir() else p.name for p in submission.iterdir()
                  if p.name not in manifest.files and p.name != "__pycache__")


def _fresh_copy(manifest: Manifest, submission: Path, folder: Path) -> Path:
    """`folder`/<assignment folder> holding a copy of each of the manifest's files that exists,
    readable by the sandbox user and not writable by it."""
    fresh = folder / manifest.folder
    fresh.mkdir()
    for name in manifest.files:
        if _kind(submission / name) == "file":  # a link is never followed: its check is an error
            with open(submission / name, "rb", opener=_no_follow) as src, open(fresh / name, "wb") as dst:
                shutil.copyfileobj(src, dst)
            (fresh / name).chmod(0o644)
    for path in (folder, fresh):
        path.chmod(0o755)
    return fresh


def _no_follow(path, flags):
    return os.open(path, flags | os.O_NOFOLLOW)


def grade_assignment(manifest: Manifest, submission: Path, device: str, *,
                     groups: tuple[str, ...] = (), timeout_s: float | None = None, build: Path | None = None,
                     progress: Callable[[str], None] = lambda s: None) -> list[Result]:
    """Results for every check of the chosen groups (all when `groups` is empty); `timeout_s`
    caps every group's limit (the selftest's hanging plants need not wait a full limit); `build`:
    a `shared_build` of this assignment (else one is made for this grading alone)."""
    if not submission.is_dir():
        raise UnusableSubmission(f"{manifest.assignment}: submission folder {submission} does not exist")
    submission = submission.resolve()
    ignored = ignored_files(manifest, submission)
    if ignored:
        progress(f"{manifest.assignment}: not graded (not a file of the assignment): {', '.join(ignored)}")
    decided = static_outcomes(manifest, submission)
    with tempfile.TemporaryDirectory(prefix=f"submission-{manifest.assignment}-") as tmp:
        fresh = _fresh_copy(manifest, submission, Path(tmp).resolve())
        build = build or _grading_build(manifest, Path(tmp).resolve() / "build")
        return _run_groups(manifest, fresh, device, decided, groups, timeout_s, progress, build)


def _grading_build(manifest: Manifest, out: Path) -> Path | None:
    """The library the untrusted worker of a trusted group imports: $AUTOGRADER_BUILD when set (the
    Gradescope package ships one, made where all manifests are known), else made here."""
    if not any(g.trusted for g in manifest.groups):
        return None
    if os.environ.get(BUILD_ENV):
        return Path(os.environ[BUILD_ENV])
    from autograder.student import grading_build  # instructor-side tooling, not in the student repo

    return grading_build(manifest.assignment, out)


@contextlib.contextmanager
def shared_build(manifest: Manifest):
    """One grading build for many gradings of one assignment (the selftest's plants, a class
    regrade): it is made from the course's files, never the submission's, and writing it costs
    about 0.8 s of CPU, as much as grading a small group."""
    with tempfile.TemporaryDirectory(prefix=f"build-{manifest.assignment}-") as tmp:
        Path(tmp).chmod(0o755)  # the worker may run as the sandbox account
        yield _grading_build(manifest, Path(tmp).resolve() / "build")


def _run_groups(manifest, submission, device, decided, groups, timeout_s, progress, build) -> list[Result]:
    results: list[Result] = []
    for group in manifest.groups:
        if groups and group.name not in groups:
            continue
        if all(c.name in decided for c in group.checks):
            ran = []
        else:
            progress(f"{manifest.assignment}: running group '{group.name}' "
                     f"({len(group.checks)} checks, limit {group.timeout_s:.0f} s)")
            if timeout_s is not None and timeout_s < group.timeout_s:
                group = replace(group, timeout_s=timeout_s)
            ran = run_group(manifest, group, submission, device, build=build)
        by_name = {r.check.name: r for r in ran}
        for c in group.checks:
            if c.name in decided:
                results.append(Result(manifest.assignment, c, *decided[c.name]))
            else:
                results.append(by_name[c.name])
    return with_values(results)


def with_values(results: list[Result]) -> list[Result]:
    """Evidence counts only with the values: a passed check whose `Check.needs` did not
    all pass in this same run becomes `failed`, naming the first that did not. Bytes, messages,
    memory and call counts are observed where the student's code runs, and a published example can
    be looked up; neither is worth a point beside wrong values. Decided here, on the grader's side,
    after every group: no order of checks inside a group and no report line can get around it."""
    outcome = {r.check.name: r.outcome for r in results}
    granted = []
    for r in results:
        missing = [n for n in r.check.needs if outcome.get(n) != "passed"]
        if r.outcome == "passed" and missing:
            why = f"granted only with '{missing[0]}', {outcome.get(missing[0], 'not graded')} in this run"
            r = Result(r.assignment, r.check, "failed", why + (f" ({r.reason})" if r.reason else ""), r.duration)
        granted.append(r)
    return granted
