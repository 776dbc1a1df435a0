"""LayerNorm's backward dx under GPU fp32 arithmetic, on a CPU (issue 29).

On an H200 the reference kernels gave dx of 1e-5..6e-5 at row length N = 1, where torch's is
exactly 0, in Triton and CUDA and every dtype; the interpreter and the emulator said 0.  The
cause: rstd g_i + alpha_i sum g with alpha = -rstd / N cancels exactly at N = 1, but a fused
multiply-add (Triton's fp fusion, nvcc's -fmad) rounds rstd g_i and not alpha sum g, leaving the
rounding error of rstd g_i (rstd = 1/sqrt(eps) ~ 316: half an ulp of 316 |g| ~ 2e-5 |g|); an
approximate `/` (Triton: div.full.f32) does the same to alpha.  Here: the kernel's own `_dx`
on tests/fp32_model.py (fused products, division off by up to 2 ulp), the CUDA emulator, which
now contracts like nvcc (cuda_cpu_build.CONTRACT_FLAGS), and what Triton's compiler emits.
"""

import importlib.util
import itertools
import re
import shutil

import numpy as np
import pytest
import torch

from scaletrain.ops import conformance as cf
from scaletrain.ops.interface import KERNELS_DIR
from fp32_model import run  # tests/ is on sys.path

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="the triton package is not installed")

EPS = 1e-5
MODES = list(itertools.product([None, "left", "right"], [0, 1, -1, 2, -2]))


@pytest.fixture(scope="module")
def ln():
    spec = importlib.util.spec_from_file_location("layer_norm_triton_fma", KERNELS_DIR / "layer_norm_triton.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row_inputs(rows: int, cols: int, seed: int, offset: float = 0.0):
    """x, g = w * dy and the row statistics the kernel is given, as fp32 numpy arrays."""
    gen = np.random.default_rng(seed)
    x = (gen.standard_normal((rows, cols)) * 2 + offset).astype(np.float32)
    g = (gen.standard_normal((rows, cols)) * gen.standard_normal(cols)).astype(np.float32)
    mean = x.astype(np.float64).mean(1).astype(np.float32)
    rstd = (1 / np.sqrt(x.astype(np.float64).var(1) + EPS)).astype(np.float32)
    sums = [(g.astype(np.float64) * f).sum(1).astype(np.float32) for f in (1, x)]
    return x, g, mean, rstd, *sums


def _torch_dx(x, g, eps=EPS):
    xt = torch.from_numpy(x).double().requires_grad_()
    torch.nn.functional.layer_norm(xt, x.shape[-1:], eps=eps).backward(torch.from_numpy(g).double())
    return xt.grad.numpy()


@pytest.mark.parametrize("fuse, div_ulps", MODES, ids=[f"fuse={f}-div{u:+d}ulp" for f, u in MODES])
def test_dx_is_exactly_zero_at_one_element_per_row(ln, fuse, div_ulps):
    """torch's dx at N = 1 is exactly 0 for every input: so is the kernel's, fused or not."""
    x, g, mean, rstd, sum_g, sum_gx = _row_inputs(4096, 1, seed=0)
    dx = run(ln._dx, x, g, mean, rstd, sum_g, sum_gx, 1, fuse=fuse, div_ulps=div_ulps)
    assert np.abs(_torch_dx(x, g)).max() == 0
    assert np.abs(dx).max() == 0, f"max |dx| {np.abs(dx).max():.3g} where torch's is 0"


@pytest.mark.parametrize("fuse, div_ulps", [(None, 0), ("left", 2), ("right", -2)])
@pytest.mark.parametrize("cols, offset", [(3, 0.0), (781, 0.0), (200, 1000.0)])
def test_dx_matches_torch_under_fused_arithmetic(ln, fuse, div_ulps, cols, offset):
    """The model is fair (it agrees with float64 torch where the answer is not 0), and so is the
    formulation: within the fp32 tolerance the grader uses (8 x 2e-5; 2e-4 at |mean| = 1000 sigma)."""
    x, g, mean, rstd, sum_g, sum_gx = _row_inputs(64, cols, seed=cols, offset=offset)
    dx = run(ln._dx, x, g, mean, rstd, sum_g, sum_gx, cols, fuse=fuse, div_ulps=div_ulps)
    ref = _torch_dx(x, g)
    tol = 2e-3 if offset else 1.6e-4
    assert np.abs(dx - ref).max() <= tol * np.abs(ref).max()


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ for the CUDA emulator")
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_emulated_cuda_dx_at_one_element_per_row_like_the_h200(dtype):
    """The GPU test's shape (4096, 1) and the grader's (7, 1) on the emulator, which fuses a * b + c
    where the host has FMA as nvcc does: before the fix 1.5e-5..6.1e-5, as on the H200."""
    from scaletrain.ops.toolchain import cuda_cpu, cuda_cpu_build
    if not cuda_cpu_build.CONTRACT_FLAGS:
        pytest.skip("this host's g++ cannot fuse multiply-adds (no FMA): the emulator rounds every product")
    emu = cuda_cpu.make_backend()
    for shape in ((7, 1), (4096, 1)):
        cf.layer_norm_backward(emu, shape, dtype=dtype, grads=("dx",))


def test_triton_fuses_and_the_row_mean_divides_exactly(ln):
    """What the premise rests on, from Triton's compiler for sm_80: the dx kernel's PTX has FMAs,
    and its row means of g divide with div.rn (IEEE), not only the approximate div.full."""
    from scaletrain.ops.toolchain.triton_compile import compile_ptx
    ptx = compile_ptx(ln, "layer_norm_bwd_dx_kernel", storage="fp32")
    assert "fma.rn.f32" in ptx
    assert "div.rn.f32" in ptx


def _products(ptx: str) -> tuple[set, set]:
    """(operand pairs whose fp32 product is rounded: mul, or fma with a 0 addend; pairs fused
    unrounded into an fma with another addend), read from PTX."""
    rounded, fused = set(), set()
    for op, a, b, c in re.findall(r"\b(mul(?:\.rn)?\.f32|fma\.rn\.f32)\s+%\w+,\s*(%\w+),\s*(%\w+)(?:,\s*(\S+?))?;", ptx):
        (rounded if op.startswith("mul") or c == "0f00000000" else fused).add(frozenset((a, b)))
    return rounded, fused


def test_triton_dx_rounds_the_product_g_once(ln):
    """The H200's fp32 dx of 4e-5 at N = 1 (Triton; the CUDA kernel passed): g = w * dy was a rounded
    product where the row sums read it and an unrounded one fused into `g - mean_g`, so g - mean_g
    was the product's rounding error, times rstd ~ 316. No product may be both in the dx kernel."""
    from scaletrain.ops.toolchain.triton_compile import compile_ptx
    rounded, fused = _products(compile_ptx(ln, "layer_norm_bwd_dx_kernel", storage="fp32"))
    assert rounded and fused, "the PTX parse found no products"
    assert not rounded & fused, f"products both rounded and fused: {sorted(map(sorted, rounded & fused))[:4]}"


def test_the_product_check_sees_the_h200_bug():
    """The check above on the PTX Triton made before the fix (its lines for one element)."""
    before = ("mul.f32 \t%r125, %r42, %r74;\n add.f32 \t%r157, %r125, %r126;\n"
              "neg.f32 \t%r441, %r357;\n fma.rn.f32 \t%r442, %r42, %r74, %r441;\n")
    rounded, fused = _products(before)
    assert rounded & fused == {frozenset(("%r42", "%r74"))}
    after = before.replace("mul.f32 \t%r125, %r42, %r74", "fma.rn.f32 \t%r125, %r42, %r74, 0f00000000").replace(
        "fma.rn.f32 \t%r442, %r42, %r74, %r441", "sub.f32 \t%r442, %r125, %r357")
    assert not _products(after)[0] & _products(after)[1]
