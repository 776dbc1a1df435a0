"""Grade one assignment's submission: static check first, then each group in its own subprocess,
on a fresh copy of the manifest's files only (nothing else the student put in the folder, such as
a helper module or a package that shadows `scaletrain`, can be imported while grading)."""

from __future__ import annotations

import importlib.util
import os
import shutil
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
        path = submission / stub_name
        if not path.is_file():
            verdict = ("error", f"{stub_name} is missing from {submission}")
        else:
            findings = check_source(path.read_text(errors="replace"), stub_name,
                                    manifest.forbidden.get(stub_name, ()))
            if not findings:
                continue
            f = findings[0]
            outcome = "error" if f.kind == "syntax" else "flagged"
            verdict = (outcome, f"{stub_name}:{f.line}: {f.message}")
        tasks = {t.id for t in manifest.tasks if t.file == stub_name}
        for c in manifest.checks:
            if c.task in tasks:
                decided[c.name] = verdict
    return decided


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
        if (submission / name).is_file():
            shutil.copyfile(submission / name, fresh / name)
            (fresh / name).chmod(0o644)
    for path in (folder, fresh):
        path.chmod(0o755)
    return fresh


def grade_assignment(manifest: Manifest, submission: Path, device: str, *,
                     groups: tuple[str, ...] = (), timeout_s: float | None = None,
                     progress: Callable[[str], None] = lambda s: None) -> list[Result]:
    """Results for every check of the chosen groups (all when `groups` is empty); `timeout_s`
    caps every group's limit (the selftest's hanging plants need not wait a full limit)."""
    if not submission.is_dir():
        raise UnusableSubmission(f"{manifest.assignment}: submission folder {submission} does not exist")
    submission = submission.resolve()
    ignored = ignored_files(manifest, submission)
    if ignored:
        progress(f"{manifest.assignment}: not graded (not a file of the assignment): {', '.join(ignored)}")
    decided = static_outcomes(manifest, submission)
    with tempfile.TemporaryDirectory(prefix=f"submission-{manifest.assignment}-") as tmp:
        fresh = _fresh_copy(manifest, submission, Path(tmp).resolve())
        build = _grading_build(manifest, Path(tmp).resolve() / "build")
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
    return results
