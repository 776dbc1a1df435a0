"""`release --student`: a repository a class can clone, with no solution text in it, whose public
tests, local grading, `submit` and notebooks work on the student's own files (issue: ship the course).

The student repository is run with this checkout's virtualenv and PYTHONPATH pointing at the
built `lib/` and root, which shadow the editable install: the code under test is the built one.
"""

import json
import os
import re
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
                   "autograder/student.py", "autograder/gradescope.py", "autograder/attacks.py"):
        assert not (out / absent).exists(), absent
    # the worker's probes of the released assignments and what they import; none of a4..a9
    assert sorted(p.name for p in (out / "autograder/probes").iterdir()) == [
        "__init__.py", "a0_memory.py", "a1_kernels.py", "a1b_attention.py", "a2_collectives.py",
        "a3_data_parallel.py", "common.py", "triton_kernels.py"]
    assert not list(out.rglob("ANSWERS.md"))
    assert (out / "assignments/a3_data_parallel/written_answers.md").is_file()
    record = json.loads((out / "autograder/public_manifest.json").read_text())
    assert record["solved"] == ["a0", "a1", "a1b", "a2"]
    assert "planted" not in json.dumps(record)


INSTRUCTOR_ONLY_TEXT = re.compile(r"ANSWERS\.md|ANCHORS\.md|the issue|[Ii]ssue \d+|In this repository the library")


def test_no_file_speaks_to_the_instructor(a3_repo):
    """Nothing a student reads names the staff's files (ANSWERS.md, ANCHORS.md) or tracker."""
    out, _ = a3_repo
    found = [f"{path.relative_to(out)}:{i}: {line.strip()[:80]}" for path in student.repo_files(out)
             for i, line in enumerate(student.text_lines(path), 1) if INSTRUCTOR_ONLY_TEXT.search(line)]
    assert found == []


def test_stubs_handouts_and_readme_speak_to_the_student(a3_repo):
    out, _ = a3_repo
    stub = (out / "assignments/a3_data_parallel/dp_bucket.py").read_text()
    assert stub.startswith("# The file to fill in") and "Edit that file, not this one" not in stub
    shim = (out / "lib/scaletrain/dp/bucket.py").read_text()
    assert len(shim.splitlines()) == 5 and "assignments/a3_data_parallel/dp_bucket.py" in shim
    solved = (out / "lib/scaletrain/comm/ring.py").read_text().splitlines()[0]
    assert solved == "# The reference of a2 (Ring collectives on point-to-point messages), released with its solutions."
    for handout in (out / "assignments").glob("*/README.md"):  # the student README's commands
        bare = [line for line in handout.read_text().splitlines()
                if re.match(r"(AUTOGRADER_SUBMISSION=\S+ )?(pytest|python) ", line)]
        assert bare == [], (handout, bare)
    readme = (out / "README.md").read_text()
    assert ".venv/bin/python -m autograder submit a3" in readme and "autograder grade a2" not in readme
    assert "{{" not in readme


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
    assert "hidden inputs and anti-cheat checks" in r.stdout and "speed" not in r.stdout, r.stdout
    r = _run(out, "-m", "autograder", "submit", "a0", "-o", str(tmp_path / "a0.zip"))
    assert r.returncode == 2 and "nothing implemented yet" in r.stderr, r.stderr
    for folder in ("a0_memory", "a3_data_parallel"):
        _copy_solution(out, folder)
    for a in ("a0", "a3"):
        r = _run(out, "-m", "autograder", "grade", a)
        assert r.returncode == 0 and "failed" not in r.stdout.split("public checks:")[1], r.stdout + r.stderr
    r = _run(out, "-m", "autograder", "submit", "a3", "-o", str(tmp_path / "a3.zip"))
    assert r.returncode == 0, r.stderr
    assert "question(s) have no answer yet" in r.stderr and "missing" not in r.stderr, r.stderr
    assert sorted(zipfile.ZipFile(tmp_path / "a3.zip").namelist()) == [
        "dp_bucket.py", "dp_data_parallel.py", "written_answers.md"]
    answers = out / "assignments/a3_data_parallel/written_answers.md"
    answers.write_text(answers.read_text().split("## Question 4")[0])  # questions 4 and 5 deleted
    r = _run(out, "-m", "autograder", "submit", "a3", "-o", str(tmp_path / "a3.zip"))
    assert r.returncode == 0 and "question(s) 4, 5 of the handout's 5 are missing" in r.stderr, r.stderr


def test_3_2_and_3_3_public_tests_do_not_wait_for_3_1(a3_repo, tmp_path):
    """The handout grades 3.2 and 3.3 whatever the state of 3.1: so do the public tests."""
    out, _ = a3_repo
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(REPO / "assignments/a3_data_parallel/dp_bucket.py", mixed)  # 3.1: the stub
    shutil.copy(REPO / "solutions/a3_data_parallel/dp_data_parallel.py", mixed)
    r = _run(out, "-m", "autograder", "grade", "a3", "--submission", str(mixed))
    rows = [line for line in r.stdout.splitlines() if line.startswith(("3.1", "3.2", "3.3"))]
    assert rows and all(("passed" in row) == (not row.startswith("3.1")) for row in rows), r.stdout


def _copy_solution(out: Path, folder: str) -> None:
    for f in (REPO / "solutions" / folder).glob("*.py"):
        shutil.copy(f, out / "assignments" / folder / f.name)


def test_notebooks_run_on_the_student_repository(a3_repo):
    """With the a3 solution in the student's files and IMPL = "student" (as the notebook's skipped
    demos ask), notebook 03 demos that code; 00-02 run on solved modules. (The notebooks before any
    student code exists: tests/deploy/test_student_repo.py.)"""
    out, _ = a3_repo
    _copy_solution(out, "a3_data_parallel")
    notebook = out / "notebooks/03_data_parallel.ipynb"
    notebook.write_text(notebook.read_text().replace('IMPL = \\"reference\\"', 'IMPL = \\"student\\"', 1))
    assert 'IMPL = \\"student\\"' in notebook.read_text()
    r = _run(out, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "notebooks")
    assert r.returncode == 0, r.stdout[-3000:]


def test_nothing_released_solved_builds_and_imports(tmp_path):
    plan = student.make_plan("a5", "")
    out = tmp_path / "all"
    student.build(out, plan)
    assert student.find_leaks(out, plan) == []
    r = _run(out, "-c", "import scaletrain.pipeline, scaletrain.zero, scaletrain.dp, scaletrain.ops")
    assert r.returncode == 0, r.stderr


def test_the_grading_build_holds_its_assignments_probes_only(tmp_path):
    """The sandboxed worker grading a1 needs a1's probe and the shared ones it imports: not the
    other assignments' probes, not the attacks the suites plant."""
    build = student.grading_build("a1", tmp_path / "build")
    assert sorted(p.name for p in (build / "autograder/probes").iterdir()) == [
        "__init__.py", "a1_kernels.py", "common.py", "triton_kernels.py"]
    assert not (build / "autograder/attacks.py").exists()
    record = json.loads((build / "lib/scaletrain/student_release.json").read_text())
    assert record["open"] == {"a1": "a1_kernels"} and "a1b" in record["unreleased"]


def test_plan_arguments_are_checked():
    with pytest.raises(ReleaseError, match="unknown assignment"):
        student.make_plan("a42")
    with pytest.raises(ReleaseError, match="a4: not among the released"):
        student.make_plan("a2", "a0,a4")
    assert student.make_plan("a2", "").solved == frozenset()
    assert student.make_plan("a2").solved == {"a0", "a1", "a1b"}
    assert [m.assignment for m in student.make_plan("a1").released] == ["a0", "a1"]  # a1b comes after a1
