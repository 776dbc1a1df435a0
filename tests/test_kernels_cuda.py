"""The CUDA and Triton kernels executed on a GPU against float64 torch (GPU machines only; skipped
with a reason elsewhere: on CPU the Triton kernels run through the interpreter in
test_ops_triton.py and the CUDA sources are only compiled, test_kernels_compile.py)."""

import pytest
import torch

from scaletrain.ops import conformance as cf
from scaletrain.ops.backends import get_backend, resolve

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")]

BACKENDS = ["cuda", "triton"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("shape", cf.BUCKET_SHAPES)
def test_kernels_match_torch(backend, dtype, shape):
    be = get_backend(backend)
    cf.softmax_forward(be, shape, dtype=dtype, device="cuda")
    cf.softmax_backward(be, shape, dtype=dtype, device="cuda")
    cf.layer_norm_forward(be, shape, dtype=dtype, offset=1.0, device="cuda")
    cf.layer_norm_backward(be, shape, dtype=dtype, device="cuda")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("s", [37, 128, 1031])
def test_softmax_masks_causal_and_huge_logits(backend, s):
    be = get_backend(backend)
    cf.softmax_forward(be, (2, 3, s, s), mask_shape=(2, 1, 1, s), pad=True, causal=True, device="cuda")
    cf.softmax_forward(be, (2, 3, s, s), mask_shape=(s, s), device="cuda")
    cf.huge_logits(be, device="cuda")
    cf.layer_norm_forward(be, (50, 200), scale=1.0, offset=1000.0, tol=2e-4, device="cuda")


@pytest.mark.parametrize("backend", BACKENDS)
def test_autograd_path_and_unaligned_views(backend):
    cf.unaligned_views(backend, rows=64, device="cuda")


def test_auto_prefers_the_fused_kernels_on_gpu():
    assert resolve("auto", torch.randn(2, device="cuda"), "softmax").name in ("cuda", "triton")
