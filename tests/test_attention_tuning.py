"""The tuned Triton attention forward (scaletrain.ops.attention_tuning): every tile shape the tuner
may pick gives the launcher's answer (the kernel through the interpreter, float64 SDPA as the
reference), off the GPU the fixed launcher runs unchanged, the a1b-graded path stays untuned, a
tall tile builds for sm_90 within its shared memory; on a GPU (`gpu`) the tuned forward agrees
with the fixed one and records its choice."""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from scaletrain.ops import attention_tuning
from scaletrain.ops.backends import KERNELS_DIR
from scaletrain.ops.toolchain.isolated import IsolatedWorker
from scaletrain.testing import TOLERANCE, assert_close

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the triton package is not installed (Linux x86-64 only)")


def _reference(q, k, v, causal):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)


def tiles_case():
    """Each CONFIGS tile (BLOCK_M, BLOCK_N) through the launcher's explicit tiles, causal and not,
    a length that ends inside every tile; the interpreter ignores warps and stages."""
    from scaletrain.ops.backends import load_kernel_module
    kernels = load_kernel_module(KERNELS_DIR / "attention_triton.py")
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 133, 32) for _ in range(3))
    for m, n in sorted({(m, n) for m, n, _, _ in attention_tuning.CONFIGS}):
        for causal in (False, True):
            o, _ = kernels.attention_fwd(q, k, v, causal, block_m=m, block_n=n)
            assert_close(o, _reference(q, k, v, causal), rtol=TOLERANCE[torch.float32],
                         what=f"O with tiles {m} x {n}, causal={causal}")


def fallback_case():
    """Off the GPU tuned_attention_fwd is the launcher, bit for bit."""
    from scaletrain.ops.backends import load_kernel_module
    kernels = load_kernel_module(KERNELS_DIR / "attention_triton.py")
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 520, 16) for _ in range(3))  # long enough: only the CPU stops tuning
    assert not attention_tuning.tunable(q)
    o, lse = attention_tuning.tuned_attention_fwd(q, k, v, True, None)
    o_ref, lse_ref = kernels.attention_fwd(q, k, v, True, None)
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    assert not attention_tuning.chosen(), "nothing is tuned off the GPU"


@needs_triton
def test_every_tile_the_tuner_may_pick_is_correct_and_off_the_gpu_nothing_is_tuned():
    with IsolatedWorker({"TRITON_INTERPRET": "1"}, timeout_s=600) as worker:
        worker.run(tiles_case)
        worker.run(fallback_case)


def test_tuning_is_for_16_bit_gpu_tensors_of_real_length():
    q = torch.empty(4, 4096, 64, dtype=torch.float16)
    assert not attention_tuning.tunable(q), "a CPU tensor"
    assert all(min(c[0], c[1]) >= 32 for c in attention_tuning.CONFIGS)
    assert (64, 64, 4, 3) in attention_tuning.CONFIGS and (64, 64, 8, 3) in attention_tuning.CONFIGS, \
        "the launcher's own tiles (4 warps at head dim 64, 8 at 128) must be among the candidates"


def test_the_graded_path_keeps_the_launchers_tiles():
    """a1b grades a kernel through the launcher's fixed tiles; bench attention's 'as graded' rows
    (local_student) must time the same, not the tuned forward."""
    from scaletrain.ops.attention import attention_backend
    from scaletrain.ops.backends import load_kernel_module
    kernels = load_kernel_module(KERNELS_DIR / "attention_triton.py")
    assert attention_backend("triton", tuned=False).fwd is kernels.attention_fwd
    assert attention_backend("triton").fwd is attention_tuning.tuned_attention_fwd


@needs_triton
def test_a_tall_tile_builds_for_sm90_within_its_shared_memory():
    """(128, 64) tiles, 3 stages, head dim 128 and fp16: what Hopper's 227 KB of shared memory per
    block must hold (Triton's compiler for sm_90, no GPU needed)."""
    from scaletrain.ops.backends import load_kernel_module
    from scaletrain.ops.toolchain.attention_compile import SIGNATURES
    from scaletrain.ops.toolchain.triton_compile import compile_kernel
    kernels = load_kernel_module(KERNELS_DIR / "attention_triton.py")
    config = dict(CAUSAL=True, DOT_PRECISION="tf32", BLOCK_M=128, BLOCK_N=64, BLOCK_D=128)
    compiled = compile_kernel(kernels.attention_fwd_kernel, SIGNATURES["attention_fwd_kernel"][0], config, 90, "fp16",
                              options={"num_warps": 8, "num_stages": 3})
    assert 0 < compiled.metadata.shared <= 227 * 1024, compiled.metadata.shared


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_tuned_forward_agrees_with_the_fixed_one(dtype, causal):
    from scaletrain.ops.backends import load_kernel_module
    kernels = load_kernel_module(KERNELS_DIR / "attention_triton.py")
    torch.manual_seed(2)
    q, k, v = (torch.randn(8, 1024, 64, device="cuda", dtype=dtype) for _ in range(3))
    o, lse = attention_tuning.tuned_attention_fwd(q, k, v, causal)
    o_ref, lse_ref = kernels.attention_fwd(q, k, v, causal)
    assert_close(o, _reference(q, k, v, causal), rtol=TOLERANCE[dtype], what="tuned O")
    assert_close(lse, lse_ref, rtol=TOLERANCE[torch.float32], what="tuned L")
    assert_close(o.float(), o_ref.float(), rtol=TOLERANCE[dtype], what="tuned O vs the launcher's")
    assert any(c["bucket"] == 1024 for c in attention_tuning.chosen())


@needs_triton
def test_one_tuner_per_bucket_over_every_config():
    """Built without a GPU: Triton checks the key names against the kernel's arguments."""
    from scaletrain.ops.backends import load_kernel_module
    kernel = load_kernel_module(KERNELS_DIR / "attention_triton.py").attention_fwd_kernel
    tuner = attention_tuning.tuner(kernel, 2048)
    assert tuner is attention_tuning.tuner(kernel, 2048) and tuner is not attention_tuning.tuner(kernel, 4096)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in tuner.configs] == \
        list(attention_tuning.CONFIGS)
    assert set(tuner.keys) <= set(tuner.arg_names)
