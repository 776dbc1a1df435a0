"""Assignment a1: manifest, release, anti-cheat and public tests (its selftest — planted breakages
from an all-zeros softmax to the slide's sigma-for-sigma^2, wrappers that compute in torch, and the
attacks on the grader — runs in tests/test_assignments.py; the trusted side in test_a1_trusted.py)."""

import os
import subprocess
import sys

import pytest

from autograder.manifest import REPO, get_manifest
from autograder.release import outputs
from autograder.static_check import check_source

A1 = get_manifest("a1")


def test_manifest_points_split_cpu_and_gpu():
    assert A1.max_score == 100
    assert {c.task for c in A1.checks} == {t.id for t in A1.tasks}, "every task needs a check"
    cpu = sum(c.points for g in A1.groups if not g.needs_gpu for c in g.checks)
    # part A on the interpreter, the compile checks and part B in the CPU emulator (issue 20);
    # speed and the real CUDA runs need a GPU
    assert cpu == 80


def test_stubs_and_solutions_are_released_from_kernels():
    for path, text in outputs(A1).items():
        assert path.read_text() == text, f"{path.relative_to(REPO)} is stale: run `python -m autograder release`"


@pytest.mark.parametrize("line,flagged", [
    ("y = torch.softmax(x, -1)", True), ("import torch.nn.functional as F\nF.layer_norm(x, (4,))", True),
    ("from torch.nn.functional import softmax", True), ("torch.ops.aten._softmax(x, -1, False)", True),
    ("from scaletrain.ops import naive", True), ("from scaletrain.ops.backends import load_kernel_module", True),
    ("import scaletrain.ops\nscaletrain.ops.softmax(x)", True),
    ("from scaletrain.ops.mask import MaskView", False), ("y = torch.empty_like(x)", False),
    ("import triton.language as tl\nm = tl.max(x, axis=1)", False)])
def test_forbidden_names_in_the_triton_files(line, flagged):
    findings = check_source(line + "\n", "softmax_triton.py", A1.forbidden["softmax_triton.py"])
    assert bool(findings) == flagged, findings


def test_the_reference_sources_pass_their_own_static_check():
    for stub, source in A1.files.items():
        assert not check_source((REPO / source).read_text(), stub, A1.forbidden[stub]), source


@pytest.mark.slow
def test_public_tests_pass_on_the_solution():
    """Part A's public tests through the interpreter (the nvcc test is left to the selftest)."""
    env = dict(os.environ, AUTOGRADER_SUBMISSION=str(A1.solution_dir()))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not compile",
                           "assignments/a1_kernels"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
