"""The student repository as a class gets it (issue 27, part 6): day one works.

An instructor runs `python -m autograder release --student OUT --through aN` for each release and
pushes OUT to the class's git remote; a student clones it, runs `make setup` (its own .venv, the
pinned stack) and opens the notebooks before writing a line. This test does exactly that, with no
path back into this checkout's venv: every release a0..a9 is a commit (and tag) of an origin
repository; a fresh clone of the a3 release (a0-a2 solved, a3 open) runs its own `make setup`,
executes every released notebook on the untouched stubs, runs the public `grade a3` (stub rows
fail "not implemented", nothing crashes) and `submit a3` (refused), then fills in the solution
files and sees `grade` pass and `submit` write the zip. The same clone then checks out every
other release, as a student who pulls it, and executes the notebook of its open assignment (at the
last release, every notebook). Setup and notebook times are printed.

Run: `.venv/bin/python -m pytest -p no:cacheprovider -n0 tests/deploy/test_student_repo.py -o addopts=""`
(`make deploy-test` runs the whole folder).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from autograder.manifest import REPO, all_manifests
from autograder.student import course_order

pytestmark = pytest.mark.slow

OPEN = "a3"                                   # the release a fresh clone starts from
RELEASES = list(all_manifests())              # a0, a1, a1b, a2, ..., a9
NOTEBOOK_LIMIT_S = 300                        # each runs in well under a minute; this catches a hang
TIMES: dict[str, float] = {}                  # what the last test prints
# what a student's shell has: no venv of ours, no PYTHONPATH, no grader or notebook switches
DROPPED_ENV = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "AUTOGRADER_SUBMISSION", "AUTOGRADER_SEED",
               "AUTOGRADER_BUILD", "SCALETRAIN_STUDENT_FILES", "TRITON_INTERPRET")


def _student_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV and not k.startswith("PYTEST")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(REPO)) and ".venv" not in p)
    return env


def _sh(cmd: list[str], cwd: Path, *, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=_student_env(), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _git(repo: Path, *args: str) -> str:
    return _sh(["git", "-c", "user.name=course staff", "-c", "user.email=staff@example.org",
                "-c", "init.defaultBranch=main", "-c", "advice.detachedHead=false", *args], repo).stdout


def _publish(origin: Path, release: str, work: Path) -> None:
    """What the instructor does for `release`: build the student repository with this checkout's
    CLI, replace the origin's files with it, commit and tag."""
    build = work / f"build-{release}"
    proc = subprocess.run([sys.executable, "-m", "autograder", "release", "--student", str(build),
                           "--through", release], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for old in origin.iterdir():
        if old.name != ".git":
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    shutil.copytree(build, origin, dirs_exist_ok=True)
    _git(origin, "add", "-A", ".")
    _git(origin, "commit", "-q", "-m", f"release {release}")
    _git(origin, "tag", release)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The origin with releases a0..a3, and a student's fresh clone of it (a3) after `make setup`."""
    work = tmp_path_factory.mktemp("deploy-student")
    origin = work / "origin"
    origin.mkdir()
    _git(origin, "init", "-q")
    for release in RELEASES[:RELEASES.index(OPEN) + 1]:
        _publish(origin, release, work)
    clone = work / "student"
    _git(work, "clone", "-q", str(origin), str(clone))
    start = time.monotonic()
    _sh(["make", "setup"], clone)
    TIMES["make setup (fresh clone, own .venv)"] = time.monotonic() - start
    where = _sh([".venv/bin/python", "-c", "import scaletrain, autograder; print(scaletrain.__file__); "
                 "print(autograder.__file__)"], clone).stdout.split()
    assert all(Path(w).resolve().is_relative_to(clone) for w in where), where  # its own install, not ours
    return work, origin, clone


def _execute(clone: Path, notebook: str, label: str) -> str:
    """Run one notebook top to bottom with the clone's own jupyter; its outputs' text."""
    out = clone.parent / "executed" / label / notebook
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    proc = _sh([str(clone / ".venv/bin/jupyter"), "execute", f"--output={out}", f"notebooks/{notebook}"], clone,
               timeout=NOTEBOOK_LIMIT_S, check=False)
    TIMES[f"{label}: {notebook}"] = time.monotonic() - start
    assert proc.returncode == 0, f"{label}: {notebook} stopped:\n{proc.stderr[-4000:]}"
    cells = json.loads(out.read_text())["cells"]
    return "\n".join("".join(o.get("text", "")) for c in cells for o in c.get("outputs", []))


def _open_notebook(clone: Path, assignment: str) -> str:
    return next(p.name for p in (clone / "notebooks").glob("*.ipynb") if course_order(p.name) == course_order(assignment))


def test_the_fresh_clone_runs_every_notebook_before_any_student_code(course):
    _, _, clone = course
    notebooks = sorted(p.name for p in (clone / "notebooks").glob("*.ipynb"))
    assert [course_order(n) for n in notebooks] == [course_order(a) for a in RELEASES[:RELEASES.index(OPEN) + 1]]
    for notebook in notebooks:
        text = _execute(clone, notebook, OPEN)
        if notebook == _open_notebook(clone, OPEN):  # its demos say what to do instead of failing
            assert "implement task 3.1 first (set IMPL = 'student'" in text, text[-2000:]
    assert _sh(["git", "status", "--porcelain"], clone).stdout == ""  # nothing written into the repository


def test_public_grade_and_submit_on_the_stubs(course):
    _, _, clone = course
    start = time.monotonic()
    grade = _sh([".venv/bin/python", "-m", "autograder", "grade", OPEN], clone, check=False)
    TIMES[f"grade {OPEN} (public tests, stubs)"] = time.monotonic() - start
    assert grade.returncode == 1, grade.stdout + grade.stderr
    rows = [line for line in grade.stdout.splitlines() if re.match(r"\d+\.\d+\s", line)]
    assert rows and all(" failed " in row and "not implemented yet" in row for row in rows), grade.stdout
    assert "Traceback" not in grade.stdout + grade.stderr and "speed" not in grade.stdout, grade.stdout
    submit = _sh([".venv/bin/python", "-m", "autograder", "submit", OPEN], clone, check=False)
    assert submit.returncode == 2 and "nothing implemented yet" in submit.stderr, submit.stderr
    assert not list(clone.glob("*.zip"))


def test_make_check_runs_every_released_assignment_and_bare_pytest_says_how(course):
    """`make check`, the student README's second command: each released assignment's public tests in
    a session of their own (one session over several sent a1's imports to a0's folder). A bare
    `pytest` over them all is refused with the commands that work."""
    _, _, clone = course
    start = time.monotonic()
    check = _sh(["make", "check"], clone, check=False)
    TIMES["make check (every released assignment, stubs)"] = time.monotonic() - start
    released = RELEASES[:RELEASES.index(OPEN) + 1]
    assert check.returncode != 0 and "Traceback" not in check.stdout + check.stderr, check.stdout[-3000:]
    assert all(f"{a} public checks:" in check.stdout for a in released), check.stdout[-3000:]
    assert "the submission must contain" not in check.stdout + check.stderr, check.stdout[-3000:]
    bare = _sh([".venv/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider"], clone, check=False)
    assert bare.returncode == 4 and "run one assignment per pytest session" in bare.stderr, bare.stdout + bare.stderr


def test_grade_passes_and_submit_writes_the_zip_once_the_files_are_filled_in(course):
    _, _, clone = course
    m = all_manifests()[OPEN]
    try:
        for name in m.files:
            shutil.copy(m.solution_dir() / name, clone / "assignments" / m.folder / name)
        start = time.monotonic()
        grade = _sh([".venv/bin/python", "-m", "autograder", "grade", OPEN], clone, check=False)
        TIMES[f"grade {OPEN} (public tests, solution filled in)"] = time.monotonic() - start
        assert grade.returncode == 0, grade.stdout + grade.stderr
        submit = _sh([".venv/bin/python", "-m", "autograder", "submit", OPEN], clone)
        archive = clone / f"{OPEN}_submission.zip"
        assert "upload this file" in submit.stdout
        assert sorted(zipfile.ZipFile(archive).namelist()) == sorted([*m.files, "written_answers.md"])
    finally:  # back to the untouched stubs, as the later releases expect
        _sh(["git", "checkout", "-q", "--", "."], clone)
        _sh(["git", "clean", "-q", "-fd"], clone)


def test_every_release_runs_its_open_assignments_notebook(course):
    """Earlier releases (checked out in the clone) and later ones (pulled), each with `make setup`
    as a student runs it after a pull: the open assignment's notebook, before any student code;
    at the last release every notebook."""
    work, origin, clone = course
    for release in RELEASES[RELEASES.index(OPEN) + 1:]:
        _publish(origin, release, work)
    _git(clone, "fetch", "-q", "--tags", "origin")
    for release in [r for r in RELEASES if r != OPEN]:
        _git(clone, "checkout", "-q", release)
        _sh(["make", "setup"], clone)
        last = release == RELEASES[-1]
        notebooks = sorted(p.name for p in (clone / "notebooks").glob("*.ipynb")) if last else \
            [_open_notebook(clone, release)]
        for notebook in notebooks:
            _execute(clone, notebook, release)


def test_report_the_times(course, capsys):
    with capsys.disabled():
        print("\nstudent repository, deployed:")
        for what, seconds in TIMES.items():
            print(f"  {what:55s} {seconds:6.1f} s")
