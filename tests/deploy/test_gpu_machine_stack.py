"""The GPU machine's Triton, on a CPU: what `make gpu-check` runs through the interpreter there.

`make gpu-check` runs on a GPU machine as it comes, on that machine's own packages: the first
H200 run had torch 2.11 and Triton 3.6 against the pins 2.13 / 3.9
(`../shared/gpu-runs/2026-11-27-h200/env.txt`; the image's package list adds NumPy 2.5.2). Most of what it runs is compiled for the GPU,
but the class's CPU regrade (step 3) grades a1b's CPU groups through the Triton interpreter of
that machine, and Triton 3.6's interpreter beside NumPy >= 2.4 could not take a loop bound from a
kernel's scalar argument (`scaletrain/ops/toolchain/interpreter_compat.py`), which lost the
solution its points. Here an interpreter is made whose Triton is the GPU machine's and whose
every other package is the development venv's (a venv with Triton 3.6 installed in it and the
development site-packages added after its own), and on it: the interpreted and sm_80-compiled
kernel tests, a1's public tests on the solution, and gpu-check's own CPU regrade of its class.

Run: `.venv/bin/python -m pytest -p no:cacheprovider -n0 -o addopts="" tests/deploy/test_gpu_machine_stack.py`
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autograder import gpu_check
from autograder.manifest import REPO

pytestmark = pytest.mark.slow

GPU_MACHINE_TRITON = "3.6.0"   # the first H200 run's (env.txt); the pin is 3.9
KERNEL_TESTS = ["tests/test_ops_triton.py", "tests/test_attention_triton.py", "tests/test_attention_tuning.py",
                "tests/test_cross_entropy.py", "tests/test_embedding.py", "tests/test_linear_cross_entropy.py",
                "tests/test_infer_rerank.py", "tests/test_kernels_compile.py", "tests/test_kernels_a1.py"]


def _run(cmd: list, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def gpu_stack():
    """(python, environment): a copy of the development venv (hard links where the disk allows:
    pip replaces files, it never writes into one) with Triton GPU_MACHINE_TRITON in place of the pin.
    Not a venv that adds the development one by a .pth: the grader's worker finds its packages in
    its interpreter's own site-packages, as on the GPU machine, whose torch is in its venv's."""
    root = tempfile.mkdtemp(prefix="gpu-stack-")   # /tmp: the sandboxed worker's account must reach it
    os.chmod(root, 0o755)
    venv = Path(root) / "venv"
    try:
        shutil.copytree(sys.prefix, venv, symlinks=True, copy_function=_link_or_copy)
        proc = _run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                     "--no-deps", f"triton=={GPU_MACHINE_TRITON}"], dict(os.environ), 900)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        env = {**gpu_check.environment(), "TRITON_CACHE_DIR": str(Path(root) / "triton-cache")}
        for name in ("TRITON_INTERPRET", "VIRTUAL_ENV", "AUTOGRADER_SUBMISSION"):
            env.pop(name, None)
        shown = _run([venv / "bin" / "python", "-c", "import numpy, triton; print(triton.__version__, numpy.__version__)"],
                     env, 300)
        assert shown.stdout.split()[0] == GPU_MACHINE_TRITON, shown
        print(f"\nthe GPU machine's Triton {GPU_MACHINE_TRITON} beside NumPy {shown.stdout.split()[1]}")
        yield venv / "bin" / "python", env
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copy2(src, dst)


def test_the_interpreted_and_compiled_kernels_pass_under_the_gpu_machines_triton(gpu_stack):
    python, env = gpu_stack
    proc = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-n", "2", *KERNEL_TESTS],
                env, 1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout


def test_gpu_checks_cpu_regrade_of_its_class_under_the_gpu_machines_triton(gpu_stack, tmp_path):
    """gpu-check's step 3, CPU half, as gpu-check builds and runs it: the solution gets every point
    graded here, the stub none, the planted bug fewer than the solution."""
    python, env = gpu_stack
    for assignment in gpu_check.CLASS:
        out = tmp_path / "gpu_check"
        gpu_check.class_folder(assignment, out / "class" / assignment / "submissions")
        proc = _run(gpu_check.commands(str(python), out)[f"class {assignment} cpu"], env, 1200)
        assert proc.returncode in (0, 1, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
        with open(out / "class" / assignment / "results" / "scores.csv", newline="") as f:
            rows = {row["name"]: {k: float(row[k]) for k in ("total", "max", "pending")} for row in csv.DictReader(f)}
        solution, stub, planted = rows["solution"], rows["stub"], rows["planted"]
        assert solution["total"] == solution["max"] > 0 and solution["pending"] > 0, rows
        assert stub["total"] == 0 and planted["total"] < solution["total"], rows
