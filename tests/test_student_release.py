"""`release --student`: a repository a class can clone, with no solution text in it, whose public
tests, local grading, `submit` and notebooks work on the student's own files (issue: ship the course).

The student repository is run with this checkout's virtualenv and PYTHONPATH pointing at the
built `lib/` and root, which shadow the editable install: the code under test is the built one.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from autograder import student
from autograder.manifest import REPO
from autograder.release import ReleaseError

pytestmark = pytest.mark.slow


def _run(repo: Path, *args, timeout=600):
    env = dict(os.environ, PYTHONPATH=f"{repo / 'lib'}{os.pathsep}{repo}")
    env.pop("AUTOGRADER_SUBMISSION", None)
    return subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def a3_repo(tmp_path_factory):
    """Released through a3, the solutions of a0-a2 included (the default)."""
    out = tmp_path_factory.mktemp("student") / "course"
    plan = student.make_plan("a3")
    student.build(out, plan)
    return out, plan


def test_no_line_of_an_unreleased_solution_is_anywhere_in_it(a3_repo):
    out, plan = a3_repo
    assert len(student.solution_lines(plan)) > 50  # the check has something to look for
    assert student.find_leaks(out, plan) == []


def test_the_leak_check_finds_a_planted_copy(a3_repo, tmp_path):
    out, plan = a3_repo
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    secret_line = next(iter(student.solution_lines(plan)))
    (copy / "notebooks" / "notes.md").write_text(f"a hint:\n    {secret_line}\n")
    assert [leak.split(":")[0] for leak in student.find_leaks(copy, plan)] == ["notebooks/notes.md"]


def test_it_holds_the_public_parts_only(a3_repo):
    out, _ = a3_repo
    assert sorted(p.name for p in (out / "assignments").iterdir()) == [
        "a0_memory", "a1_kernels", "a1b_attention", "a2_collectives", "a3_data_parallel"]
    notebooks = sorted(p.name for p in (out / "notebooks").iterdir())
    assert notebooks[-1].startswith("03_") and any(n.startswith("01b_") for n in notebooks)
    for absent in ("solutions", "tests", ".ci", "autograder/suites", "autograder/selftest.py",
                   "autograder/student.py", "autograder/gradescope.py"):
        assert not (out / absent).exists(), absent
    assert not list(out.rglob("ANSWERS.md"))
    assert (out / "assignments/a3_data_parallel/written_answers.md").is_file()
    record = json.loads((out / "autograder/public_manifest.json").read_text())
    assert record["solved"] == ["a0", "a1", "a1b", "a2"]
    assert "planted" not in json.dumps(record)


def test_library_runs_open_assignments_from_the_students_files_and_stubs_the_rest(a3_repo):
    out, _ = a3_repo
    assert "run_student_file(globals(), 'a3_data_parallel', 'dp_bucket.py')" in \
        (out / "lib/scaletrain/dp/bucket.py").read_text()
    assert "ring_reduce_scatter_chunks" in (out / "lib/scaletrain/comm/ring.py").read_text()  # a2 solved
    r = _run(out, "-c", "import scaletrain.pipeline as p; p.one_f_one_b(2, 4)")  # a4: not released
    assert "a4 (Pipeline parallelism" in r.stderr and "is not released yet" in r.stderr, r.stderr
    r = _run(out, "-c", "import scaletrain.dp, scaletrain.zero, scaletrain.comm, scaletrain.memory")
    assert r.returncode == 0, r.stderr


def test_public_grading_and_submit_on_stubs_then_on_solutions(a3_repo, tmp_path):
    out, _ = a3_repo
    r = _run(out, "-m", "autograder", "grade", "a0")
    assert r.returncode == 1 and "not implemented yet" in r.stdout and "ImportError" not in r.stdout, r.stdout
    r = _run(out, "-m", "autograder", "submit", "a0", "-o", str(tmp_path / "a0.zip"))
    assert r.returncode == 2 and "nothing implemented yet" in r.stderr, r.stderr
    for folder in ("a0_memory", "a3_data_parallel"):
        _copy_solution(out, folder)
    for a in ("a0", "a3"):
        r = _run(out, "-m", "autograder", "grade", a)
        assert r.returncode == 0 and "failed" not in r.stdout.split("public checks:")[1], r.stdout + r.stderr
    r = _run(out, "-m", "autograder", "submit", "a3", "-o", str(tmp_path / "a3.zip"))
    assert r.returncode == 0, r.stderr
    assert "question(s) have no answer yet" in r.stderr
    assert sorted(zipfile.ZipFile(tmp_path / "a3.zip").namelist()) == [
        "dp_bucket.py", "dp_data_parallel.py", "written_answers.md"]


def _copy_solution(out: Path, folder: str) -> None:
    for f in (REPO / "solutions" / folder).glob("*.py"):
        shutil.copy(f, out / "assignments" / folder / f.name)


def test_notebooks_run_on_the_student_repository(a3_repo):
    """With the a3 solution in the student's files, notebook 03 demos that code through the
    library (scaletrain.dp runs assignments/a3_data_parallel/*.py); 00-02 run on solved modules."""
    out, _ = a3_repo
    _copy_solution(out, "a3_data_parallel")
    r = _run(out, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "notebooks")
    assert r.returncode == 0, r.stdout[-3000:]


def test_nothing_released_solved_builds_and_imports(tmp_path):
    plan = student.make_plan("a5", "")
    out = tmp_path / "all"
    student.build(out, plan)
    assert student.find_leaks(out, plan) == []
    r = _run(out, "-c", "import scaletrain.pipeline, scaletrain.zero, scaletrain.dp, scaletrain.ops")
    assert r.returncode == 0, r.stderr


def test_plan_arguments_are_checked():
    with pytest.raises(ReleaseError, match="unknown assignment"):
        student.make_plan("a42")
    with pytest.raises(ReleaseError, match="a4: not among the released"):
        student.make_plan("a2", "a0,a4")
    assert student.make_plan("a2", "").solved == frozenset()
    assert student.make_plan("a2").solved == {"a0", "a1", "a1b"}
    assert [m.assignment for m in student.make_plan("a1").released] == ["a0", "a1"]  # a1b comes after a1
