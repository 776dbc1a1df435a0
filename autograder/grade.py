"""Grade one assignment's submission: static check first, then each group in its own subprocess."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from autograder.manifest import Manifest
from autograder.runner import Result, run_group
from autograder.static_check import check_source


class UnusableSubmission(Exception):
    """The input can't be graded at all (missing folder); the grader exits with code 2."""


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


def grade_assignment(manifest: Manifest, submission: Path, device: str, *,
                     groups: tuple[str, ...] = (), timeout_s: float | None = None,
                     progress: Callable[[str], None] = lambda s: None) -> list[Result]:
    """Results for every check of the chosen groups (all when `groups` is empty); `timeout_s`
    caps every group's limit (the selftest's hanging plants need not wait a full limit)."""
    if not submission.is_dir():
        raise UnusableSubmission(f"{manifest.assignment}: submission folder {submission} does not exist")
    submission = submission.resolve()
    decided = static_outcomes(manifest, submission)
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
            ran = run_group(manifest, group, submission, device)
        by_name = {r.check.name: r for r in ran}
        for c in group.checks:
            if c.name in decided:
                results.append(Result(manifest.assignment, c, *decided[c.name]))
            else:
                results.append(by_name[c.name])
    return results
