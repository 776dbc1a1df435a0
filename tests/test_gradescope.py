"""The Gradescope package's contents and grading semantics: unpacked in a folder laid out like
Gradescope's (source/, submission/, results/), its run_autograder grades the solution full marks and
the stub zero, and results.json has Gradescope's schema. These run against this checkout's venv
(`root/venv` links to it) for speed; tests/deploy/test_gradescope_deploy.py installs the same zip
at the real /autograder with its own setup.sh."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from autograder import student
from autograder.gradescope import build_package
from autograder.manifest import REPO, get_manifest
from autograder.package_info import GRADING_BUILD

pytestmark = pytest.mark.slow
SEED = 424242


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    out = tmp_path_factory.mktemp("gs") / "a0_autograder.zip"
    return build_package(get_manifest("a0"), out, seed=SEED)


def _grade(package: Path, root: Path, files: list[Path]) -> dict:
    """Lay out root/ like Gradescope's /autograder and run the package's run_autograder there."""
    with zipfile.ZipFile(package) as z:
        z.extractall(root / "source")
    (root / "submission").mkdir()
    for f in files:
        shutil.copy(f, root / "submission" / f.name)
    source = root / "source"
    (root / "venv").symlink_to(Path(sys.prefix))
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOGRADER_SEED", "PYTHONPATH")}
    env["AUTOGRADER_ROOT"] = str(root)
    r = subprocess.run(["bash", str(source / "run_autograder")], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads((root / "results" / "results.json").read_text())


def _assert_gradescope_schema(payload: dict) -> None:
    """Gradescope's results.json: numbers where numbers go, tests with the documented fields."""
    assert isinstance(payload["score"], (int, float)) and isinstance(payload["execution_time"], (int, float))
    assert isinstance(payload["output"], str) and isinstance(payload["tests"], list) and payload["tests"]
    for t in payload["tests"]:
        assert isinstance(t["name"], str) and isinstance(t["output"], str)
        assert isinstance(t["score"], (int, float)) and isinstance(t["max_score"], (int, float))
        assert 0 <= t["score"] <= t["max_score"]
        assert t["status"] in ("passed", "failed")
        assert t["visibility"] in ("visible", "hidden", "after_due_date", "after_published")
    assert abs(payload["score"] - sum(t["score"] for t in payload["tests"])) < 1e-6


def test_package_holds_one_suite_and_no_solutions(package):
    names = zipfile.ZipFile(package).namelist()
    assert {"setup.sh", "run_autograder", "requirements.txt", "package.json", "written_questions.md"} <= set(names)
    assert sorted(n for n in names if n.startswith("autograder/suites/")) == [
        "autograder/suites/__init__.py", *(f"autograder/suites/a0_memory/{f}.py"
                                          for f in ("__init__", "inputs", "judge", "names", "planted"))]
    assert not [n for n in names if n.startswith(("solutions/", "assignments/")) or n.endswith("ANSWERS.md")]
    assert "autograder/selftest.py" not in names
    assert "chmod -R go-rwx /autograder/source" in zipfile.ZipFile(package).read("setup.sh").decode()  # a0: all trusted
    run = zipfile.ZipFile(package).read("run_autograder").decode()
    assert str(SEED) not in run and "--package" in run and "--device cpu" in run  # a world-readable copy
    assert json.loads(zipfile.ZipFile(package).read("package.json"))["seed"] == SEED


def test_setup_installs_the_pinned_cpu_build_and_never_the_course(package):
    """setup.sh installs requirements.txt (torch pinned to the +cpu build from PyTorch's CPU index),
    never the course as a package: a `pip install /autograder/source` once wrote the grading
    build into site-packages, where the trusted side imported the student's code."""
    z = zipfile.ZipFile(package)
    setup, reqs = z.read("setup.sh").decode(), z.read("requirements.txt").decode().split()
    assert "torch==2.13.0+cpu" in reqs and "https://download.pytorch.org/whl/cpu" in setup
    assert "-r /autograder/source/requirements.txt" in setup and "install /autograder/source" not in setup
    assert not [n for n in z.namelist() if n.startswith("build/")], "build/ is where setuptools writes"
    cuda = zipfile.ZipFile(build_package(get_manifest("a0"), package.parent / "cuda.zip", seed=SEED, torch="cuda"))
    assert "torch==2.13.0" in cuda.read("requirements.txt").decode().split()
    assert "download.pytorch.org" not in cuda.read("setup.sh").decode()


def _setup_sh_on(tmp_path, package, python3_ok: bool, apt_has_311: bool) -> tuple[subprocess.CompletedProcess, list]:
    """setup.sh run by bash with only fakes on PATH: apt-get (records; its python3.11-venv install
    puts a python3.11 on PATH), python3 passing the version test or not (3.10: Ubuntu 22.04's), and
    every Python stopping at `-m venv` (exit 7): what ran, in order."""
    bin_, log = tmp_path / "bin", tmp_path / "calls"
    bin_.mkdir(parents=True)
    python = ('#!/bin/bash\necho "$(/usr/bin/basename $0) $*" >> {log}\n'
              'case "$1" in -c) exit {ok};; -m) exit 7;; esac\n')
    scripts = {"python3": python.format(log=log, ok=0 if python3_ok else 1), ".py311": python.format(log=log, ok=0),
               "apt-get": f'#!/bin/bash\necho "apt-get $*" >> {log}\n' + (
                   f'case "$*" in *python3.11-venv*) /bin/cp {bin_}/.py311 {bin_}/python3.11;; esac\n'
                   if apt_has_311 else "")}
    for name, text in scripts.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    setup = zipfile.ZipFile(package).read("setup.sh").decode()
    proc = subprocess.run(["/bin/bash", "-c", setup], env={"PATH": str(bin_)}, capture_output=True, text=True,
                          timeout=60)
    return proc, log.read_text().splitlines() if log.exists() else []


def test_setup_makes_its_venv_with_a_python_the_pins_accept(package, tmp_path):
    """numpy 2.4 and matplotlib 3.11 need Python >= 3.11. Ubuntu 22.04's python3 (3.10): setup.sh
    installs python3.11 from apt and makes the venv with it; a python3 >= 3.11 is used as it is; with
    neither, it stops with the reason before pip can fail on the pins."""
    proc, calls = _setup_sh_on(tmp_path / "jammy", package, python3_ok=False, apt_has_311=True)
    assert proc.returncode == 7 and calls[-1] == "python3.11 -m venv /autograder/venv", (calls, proc.stderr)
    assert any(c.startswith("apt-get install") and "python3.11-venv" in c for c in calls), calls
    proc, calls = _setup_sh_on(tmp_path / "noble", package, python3_ok=True, apt_has_311=True)
    assert proc.returncode == 7 and calls[-1] == "python3 -m venv /autograder/venv", (calls, proc.stderr)
    assert not any("python3.11" in c for c in calls), calls
    proc, calls = _setup_sh_on(tmp_path / "none", package, python3_ok=False, apt_has_311=False)
    assert proc.returncode == 1 and "no Python >= 3.11" in proc.stderr and not any("-m venv" in c for c in calls)


def test_kernel_assignments_install_what_their_cpu_checks_run(tmp_path):
    """a1's CPU checks run Triton's interpreter and the CUDA emulator (g++): its setup.sh installs
    both; a0's needs neither."""
    a1 = zipfile.ZipFile(build_package(get_manifest("a1"), tmp_path / "a1.zip", seed=SEED))
    assert any(r.startswith("triton==") for r in a1.read("requirements.txt").decode().splitlines())
    assert " g++" in a1.read("setup.sh").decode()
    a0 = zipfile.ZipFile(build_package(get_manifest("a0"), tmp_path / "a0.zip", seed=SEED))
    assert "triton" not in a0.read("requirements.txt").decode() and " g++" not in a0.read("setup.sh").decode()


def test_hidden_checks_take_the_packages_visibility(package, tmp_path):
    graded = _grade(package, tmp_path / "vis", [REPO / "solutions/a0_memory/memory.py"])
    assert {t["visibility"] for t in graded["tests"]} == {"after_published"}


def test_the_library_student_code_can_import_holds_no_graded_reference(package, tmp_path):
    """build/ is what the worker imports: a0's graded module there runs the submission."""
    with zipfile.ZipFile(package) as z:
        z.extractall(tmp_path, [n for n in z.namelist() if n.startswith(f"{GRADING_BUILD}/")])
    assert "run_student_file" in (tmp_path / GRADING_BUILD / "lib/scaletrain/memory.py").read_text()
    assert student.find_leaks(tmp_path / GRADING_BUILD, student.make_plan("a0", "")) == []


def test_solution_full_marks_stub_zero(package, tmp_path):
    solved = _grade(package, tmp_path / "solution", [REPO / "solutions/a0_memory/memory.py"])
    _assert_gradescope_schema(solved)
    assert solved["score"] == solved["max_score"] == 100
    assert solved["extra_data"]["seed"] == SEED
    stub = _grade(package, tmp_path / "stub", [REPO / "assignments/a0_memory/memory.py"])
    _assert_gradescope_schema(stub)
    assert stub["score"] == 0
    assert {t["extra_data"]["outcome"] for t in stub["tests"]} == {"failed"}


def test_planted_submission_loses_exactly_its_checks(package, tmp_path):
    plant = next(p for p in get_manifest("a0").planted if "fp32 master copy" in p.name)
    broken = tmp_path / "memory.py"
    broken.write_text(plant.apply((REPO / "solutions/a0_memory/memory.py").read_text()))
    graded = _grade(package, tmp_path / "planted", [broken])
    _assert_gradescope_schema(graded)
    outcome = {t["extra_data"]["check"]: t["extra_data"]["outcome"] for t in graded["tests"]}
    assert all(outcome[check] == want for check, want in plant.expect.items())
    lost = sum(t["max_score"] - t["score"] for t in graded["tests"])
    assert lost == sum(c.points for c in get_manifest("a0").checks if outcome[c.name] != "passed") > 0


def test_every_assignment_package_locks_its_source_and_ships_no_graded_reference(tmp_path):
    """All suites are trusted (a1 included): each package's setup.sh makes source/ unreadable to
    the worker's account, and build/ holds no solution line of the assignment (earlier ones ship solved)."""
    for m in (get_manifest(a) for a in ("a1", "a5")):
        package = build_package(m, tmp_path / f"{m.assignment}.zip", seed=SEED)
        with zipfile.ZipFile(package) as z:
            assert "chmod -R go-rwx /autograder/source" in z.read("setup.sh").decode(), m.assignment
            z.extractall(tmp_path / m.assignment, [n for n in z.namelist() if n.startswith(f"{GRADING_BUILD}/")])
        assert student.find_leaks(tmp_path / m.assignment / GRADING_BUILD, student.make_plan(m.assignment)) == []
