"""Assignment a0 end to end: manifest, release, public tests (its selftest: tests/test_assignments.py)."""

import os
import subprocess
import sys

import pytest

from autograder.manifest import REPO, get_manifest
from autograder.release import outputs
from autograder.static_check import check_source

A0 = get_manifest("a0")


def test_manifest_points_and_tasks():
    assert A0.max_score == 100
    graded = {c.task for c in A0.checks}
    assert graded == {t.id for t in A0.tasks}, "every task must have at least one check"


def test_stub_and_solution_are_released_from_the_reference():
    for path, text in outputs(A0).items():
        assert path.read_text() == text, f"{path.relative_to(REPO)} is stale: run `python -m autograder release`"


@pytest.mark.parametrize("line,flagged", [
    ("from scaletrain import memory as ref", True), ("import scaletrain.memory_measure", True),
    ("import torch", True), ("x = __import__('scaletrain.memory')", True), ("import sys", True),
    ("from dataclasses import dataclass, replace", False), ("import math", False)])
def test_forbidden_names_catch_copying_the_reference(line, flagged):
    findings = check_source(line + "\n", "memory.py", A0.forbidden["memory.py"])
    assert bool(findings) == flagged, findings


@pytest.mark.slow
def test_public_tests_pass_on_the_solution():
    env = dict(os.environ, AUTOGRADER_SUBMISSION=str(A0.solution_dir()))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "assignments/a0_memory"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
