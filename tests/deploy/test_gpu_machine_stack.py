"""The GPU machine's torch and Triton, on a CPU: what `make gpu-check` and an instructor's GPU box run.

`make gpu-check` runs on a GPU machine as it comes, on that machine's own packages: torch 2.11
and Triton 3.6 against the pins 2.13 / 3.9 (`../shared/gpu-runs/2026-11-27-h200/env.txt`; the
image's package list adds NumPy 2.5.2, which PyPI here does not have: 2.4.6, the pin, shares its
behaviour that mattered). What ran there and broke, each invisible on the pins:
  * Triton 3.6's interpreter beside NumPy >= 2.4 could not take a loop bound from a kernel's scalar
    argument (`scaletrain/ops/toolchain/interpreter_compat.py`): the class's CPU regrade lost
    the solution its points;
  * torch 2.11 has no `dist.reduce_scatter_single` / `all_gather_single` (2.13 names for
    `reduce_scatter_tensor` / `all_gather_into_tensor`): a2's baselines errored, and forbidding
    the missing name crashed a6, a8 and a10's checks (`scaletrain.comm.tensor_collectives`,
    `autograder.checks.forbid_calls`);
  * torch 2.11's profiler events have no `input_dtypes` (the GPT-2 profile crashed);
  * a ZeRO checkpoint round trip read 1.1e-3 against its 1e-3 on 2.11: Adam scaled up the rounding
    noise of the attention key bias, whose exact gradient is 0, in another summation order
    (`scaletrain.zero.verify.exact_key_bias_gradients`, also in a5's probe).
Here an interpreter is made with the GPU machine's torch and Triton and the development venv's
every other package (a hard-linked copy of the venv, both installed into it, torch with its CUDA
libraries: about 2.5 GB, from pip's cache after the first run), and on it: the interpreted and
sm_80-compiled kernel tests, a1's public tests on the solution, gpu-check's own CPU regrade of
its class, the selftests of the assignments that call torch.distributed's collectives, the ZeRO
engine's tests, and the profile's tests.

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

GPU_MACHINE_TRITON = "3.6.0"   # the H200 runs' (env.txt); the pin is 3.9
GPU_MACHINE_TORCH = "2.11.0"    # the same runs' (2.11.0+cu130); the pin is 2.13. PyPI's is a CUDA build too
# the assignments whose checks call or forbid torch.distributed's collectives by name
COLLECTIVE_SELFTESTS = ("a2", "a5", "a6", "a8", "a10")
TORCH_TESTS = ["tests/test_tensor_collectives.py", "tests/test_zero.py", "tests/test_zero_optimizer.py",
               "tests/test_profile.py", "tests/test_profile_fused.py"]
KERNEL_TESTS = ["tests/test_ops_triton.py", "tests/test_attention_triton.py", "tests/test_attention_tuning.py",
                "tests/test_cross_entropy.py", "tests/test_embedding.py", "tests/test_linear_cross_entropy.py",
                "tests/test_infer_rerank.py", "tests/test_kernels_compile.py", "tests/test_kernels_a1.py"]


def _run(cmd: list, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def gpu_stack():
    """(python, environment): a copy of the development venv (hard links where the disk allows:
    pip replaces files, it never writes into one) with torch GPU_MACHINE_TORCH and Triton
    GPU_MACHINE_TRITON in place of the pins.
    Not a venv that adds the development one by a .pth: the grader's worker finds its packages in
    its interpreter's own site-packages, as on the GPU machine, whose torch is in its venv's."""
    root = tempfile.mkdtemp(prefix="gpu-stack-")   # /tmp: the sandboxed worker's account must reach it
    os.chmod(root, 0o755)
    venv = Path(root) / "venv"
    try:
        shutil.copytree(sys.prefix, venv, symlinks=True, copy_function=_link_or_copy)
        pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        # torch with its dependencies (the CUDA libraries it loads at import), then the Triton it pins
        # replaced by the GPU machine's
        for args in ([f"torch=={GPU_MACHINE_TORCH}"], ["--no-deps", f"triton=={GPU_MACHINE_TRITON}"]):
            proc = _run([*pip, *args], dict(os.environ), 1800)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        env = {**gpu_check.environment(), "TRITON_CACHE_DIR": str(Path(root) / "triton-cache")}
        for name in ("TRITON_INTERPRET", "VIRTUAL_ENV", "AUTOGRADER_SUBMISSION"):
            env.pop(name, None)
        shown = _run([venv / "bin" / "python", "-c", "import numpy, torch, triton; "
                      "print(torch.__version__.split('+')[0], triton.__version__, numpy.__version__)"], env, 300)
        assert shown.stdout.split()[:2] == [GPU_MACHINE_TORCH, GPU_MACHINE_TRITON], shown
        print(f"\nthe GPU machine's torch {GPU_MACHINE_TORCH} and Triton {GPU_MACHINE_TRITON} "
              f"beside NumPy {shown.stdout.split()[2]}")
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


def test_the_collective_assignments_selftest_under_the_gpu_machines_torch(gpu_stack):
    """Solutions full marks, stubs zero, every plant its outcome, on torch 2.11: the checks that
    forbid a collective by a name 2.11 lacks, and the baselines that call one, work there too."""
    python, env = gpu_stack
    tests = [f"tests/test_assignments.py::test_selftest_solution_stub_and_planted_submissions[{a}]"
             for a in COLLECTIVE_SELFTESTS]
    proc = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-n", "2", *tests,
                 *TORCH_TESTS], env, 1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " failed" not in proc.stdout and "error" not in proc.stdout.splitlines()[-1]
