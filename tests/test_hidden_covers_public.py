"""A submission that fails a public test does not get that task's full hidden marks (issue 27).

The hidden a3 suite once gave 18/18 to a bucket boundary off by one that the public docstring test
caught: the hidden suite had never run the public case. Each hidden suite now runs its public
tests' inputs too, and this test keeps it so. For each assignment, its manifest's `public_boundary`
names planted submissions that break a boundary a public test exercises (a parameter that exactly
fills a cap, m = p - 1, the last partial chunk, ...). Here the public tests of the plant's
tasks run on it and must fail; every task whose public tests fail must lose hidden points in the
plant's `expect`; and `selftest` (tests/test_assignments.py) proves those expected outcomes.

The hidden suites copy the public inputs rather than import them: the Gradescope package ships
neither `assignments/` nor anything else the public tests could share with it (a probe module
ships, but holds no cases by design), and a public test module imports the student's files.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.manifest import all_manifests

MANIFESTS = all_manifests()
HELPER = Path(__file__).with_name("public_failures.py")

# assignment -> names of its planted submissions that a public test catches (each manifest's own)
BOUNDARY = {a: m.public_boundary for a, m in MANIFESTS.items()}


def test_every_assignment_plants_a_boundary_the_public_tests_catch():
    missing = sorted(a for a, names in BOUNDARY.items() if not names)
    assert not missing, f"add a boundary plant to the manifest's public_boundary of {missing}"


def _public_failures(assignment: str, name: str, tmp_path: Path) -> dict[str, list[str]]:
    """{task: failed public tests} of the plant's file's tasks, run on the planted solution."""
    m = MANIFESTS[assignment]
    planted = next(p for p in m.planted if p.name == name)
    folder = tmp_path / m.folder
    shutil.copytree(m.solution_dir(), folder)
    (folder / planted.file).write_text(planted.apply((folder / planted.file).read_text()))
    tasks = [t.id for t in m.tasks if t.file == planted.file]
    out = subprocess.run([sys.executable, str(HELPER), str(m.stub_dir() / "tests"), str(folder), *tasks],
                         capture_output=True, text=True, timeout=600, cwd=HELPER.parent.parent)
    line = next((x for x in out.stdout.splitlines() if x.startswith("PUBLIC-FAILURES ")), None)
    assert line is not None, f"the public tests did not run:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return json.loads(line.removeprefix("PUBLIC-FAILURES "))


@pytest.mark.slow
@pytest.mark.parametrize("assignment,name", [(a, n) for a, names in BOUNDARY.items() for n in names])
def test_a_public_failure_costs_hidden_marks(assignment, name, tmp_path):
    m = MANIFESTS[assignment]
    planted = next(p for p in m.planted if p.name == name)
    failed = _public_failures(assignment, name, tmp_path)
    assert failed, f"{assignment} '{name}': no public test fails on it; plant a boundary the public tests exercise"
    task_of = {c.name: c.task for c in m.checks}
    losing = {task_of[check] for check, outcome in planted.expect.items() if outcome != "passed"}
    spared = sorted(set(failed) - losing)
    assert not spared, (f"{assignment} '{name}': public tests of task(s) {spared} fail ({failed}), but the plant "
                        "expects no hidden check of those tasks to fail: add the public case to the hidden suite "
                        "and the failing check to the plant's expect")
