"""Public tests of a1: a few of the grader's trials, small enough for the Triton interpreter.

Part A (Triton) runs everywhere: on a CPU through the interpreter (conftest.py sets
TRITON_INTERPRET=1), on a GPU compiled.  Part B (CUDA) compiles with nvcc where it exists and
runs only on a GPU.  The grader runs more shapes, dtypes and seeds, and the speed checks.
Run one task: `pytest assignments/a1_kernels -m task1_4`.
"""

import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from autograder.checks import student_module
from scaletrain.ops import conformance as cf
from scaletrain.ops.backends import KERNELS_DIR, Backend

pytest.importorskip("triton", reason="the triton package has wheels for Linux x86-64 only: part A's tests "
                                     "need it (the grader runs them for you; notebook 01 uses the torch reference)")
sm = student_module("softmax_triton", default=__file__)
ln = student_module("layer_norm_triton", default=__file__)
TRITON = Backend.from_modules("your triton kernels", sm, ln)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HERE = Path(sm.__file__).parent
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")


@pytest.mark.task1_1
@pytest.mark.parametrize("shape", [(7, 33), (31, 257), (1, 1), (2, 3, 45)])
def test_task1_1_softmax_forward(shape):
    cf.softmax_forward(TRITON, shape, device=DEVICE)


@pytest.mark.task1_1
def test_task1_1_softmax_forward_huge_logits_and_long_rows():
    cf.huge_logits(TRITON, device=DEVICE)
    cf.softmax_forward(TRITON, (2, 9001), device=DEVICE)  # longer than one tile: the looped path


@pytest.mark.task1_1
def test_task1_1_softmax_forward_fully_masked_first_tile():
    cf.masked_prefix(TRITON, device=DEVICE)  # whole -inf chunks first: exp(-inf - -inf) is NaN unguarded


@pytest.mark.task1_1
def test_task1_1_softmax_forward_mask_and_causal():
    cf.softmax_forward(TRITON, (2, 3, 17, 17), mask_shape=(2, 1, 1, 17), pad=True, causal=True, device=DEVICE)


@pytest.mark.task1_2
@pytest.mark.parametrize("shape,dtype", [((31, 257), "fp32"), ((3, 9001), "fp32"), ((16, 100), "bf16")])
def test_task1_2_softmax_backward(shape, dtype):
    cf.softmax_backward(TRITON, shape, dtype=dtype, device=DEVICE)


@pytest.mark.task1_3
@pytest.mark.parametrize("shape", [(31, 257), (7, 1), (3, 9001)])
def test_task1_3_layer_norm_forward(shape):
    cf.layer_norm_forward(TRITON, shape, offset=1.0, device=DEVICE)


@pytest.mark.task1_4
@pytest.mark.parametrize("shape", [(31, 257), (3, 9001)])
def test_task1_4_layer_norm_backward_dx(shape):
    cf.layer_norm_backward(TRITON, shape, grads=("dx",), device=DEVICE)


@pytest.mark.task1_4
def test_task1_4_layer_norm_backward_dweight_dbias_from_the_dx_kernel():
    """Rows in one tile: the dx kernel's programs each own several row blocks and sum dw, db."""
    cf.layer_norm_backward(TRITON, (4099, 64), grads=("dweight", "dbias"), device=DEVICE)


@pytest.mark.task1_5
@pytest.mark.parametrize("shape", [(301, 97), (3, 9001)])
def test_task1_5_layer_norm_backward_dweight_dbias(shape, monkeypatch):
    """The second kernel alone (FUSE_DWDB off), as the grader runs it: any row length."""
    monkeypatch.setattr(ln, "FUSE_DWDB", False)
    cf.layer_norm_backward(TRITON, shape, grads=("dweight", "dbias"), device=DEVICE)


@pytest.mark.task1_6
@pytest.mark.task1_8
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_task1_6_to_1_9_cuda_sources_compile():
    from scaletrain.ops.toolchain import nvcc
    files = [HERE / "softmax.cu", HERE / "layer_norm.cu"]
    procs = nvcc.start(files)
    for f in files:
        nvcc.finish(procs, f.name)


@pytest.fixture(scope="module")
def cuda_backend():
    from scaletrain.ops.cuda_ext import SOURCES, make_backend
    build = Path(tempfile.mkdtemp(prefix="a1-cuda-"))
    for name in SOURCES + ("kernel_utils.cuh", "launchers.h"):
        shutil.copy(HERE / name if name.endswith(".cu") else KERNELS_DIR / name, build / name)
    return make_backend(build)


@gpu
@pytest.mark.gpu
@pytest.mark.task1_6
@pytest.mark.task1_7
@pytest.mark.task1_8
@pytest.mark.task1_9
@pytest.mark.parametrize("shape", [(1823, 781), (333, 64), (3, 40000)])
def test_task1_6_to_1_9_cuda_kernels(cuda_backend, shape):
    cf.softmax_forward(cuda_backend, shape, device="cuda")
    cf.softmax_backward(cuda_backend, shape, device="cuda")
    cf.layer_norm_forward(cuda_backend, shape, device="cuda")
    cf.layer_norm_backward(cuda_backend, shape, device="cuda")
