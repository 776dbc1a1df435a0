"""The grouped expert GEMM equals its two naive references (one matmul per expert; a padded batched
matmul), forward and backward, on irregular group sizes with empty groups; gradcheck on float64;
torch's grouped-GEMM kernel where it applies, the per-group kernel where it does not."""

from __future__ import annotations

import pytest
import torch

from scaletrain.moe.experts import Experts
from scaletrain.moe.grouped_gemm import grouped_mm, grouped_mm_loop, grouped_mm_padded, torch_kernel_accepts
from scaletrain.testing import TOLERANCE, assert_close

COUNTS = [[5, 0, 3, 11, 1], [0, 0, 7], [1], [13, 2, 0, 0, 9, 4, 1]]


def _operands(counts, k, f, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(counts), k, dtype=dtype, generator=gen)
    w = torch.randn(len(counts), k, f, dtype=dtype, generator=gen)
    dy = torch.randn(sum(counts), f, dtype=dtype, generator=gen)
    return x, w, dy


def _run(fn, x, w, dy, counts, **kw):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fn(x, w, counts, **kw)
    y.backward(dy)
    return y.detach(), x.grad, w.grad


def _by_hand(x, w, dy, counts):
    """Group by group with explicit slices: Y_e = X_e W_e, dX_e = dY_e W_eᵀ, dW_e = X_eᵀ dY_e."""
    y, dx, dw, lo = torch.zeros(x.shape[0], w.shape[2], dtype=x.dtype), torch.zeros_like(x), torch.zeros_like(w), 0
    for e, c in enumerate(counts):
        y[lo:lo + c] = x[lo:lo + c] @ w[e]
        dx[lo:lo + c] = dy[lo:lo + c] @ w[e].t()
        dw[e] = x[lo:lo + c].t() @ dy[lo:lo + c]
        lo += c
    return y, dx, dw


@pytest.mark.parametrize("counts", COUNTS, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("kernel", ["auto", "mm"])
def test_grouped_equals_loop_and_padded_fp64(counts, kernel):
    x, w, dy = _operands(counts, 6, 5, torch.float64)
    want = _by_hand(x, w, dy, counts)
    for got in (_run(grouped_mm, x, w, dy, counts, kernel=kernel), _run(grouped_mm_loop, x, w, dy, counts),
                _run(grouped_mm_padded, x, w, dy, counts)):
        for g, e, what in zip(got, want, ("Y", "dX", "dW")):
            assert_close(g, e, rtol=TOLERANCE["float64"], what=f"{what} {counts}")


@pytest.mark.parametrize("counts", COUNTS[:2], ids=lambda c: "-".join(map(str, c)))
def test_gradcheck_fp64(counts):
    x, w, _ = _operands(counts, 3, 4, torch.float64, seed=1)
    for fn in (grouped_mm, grouped_mm_loop, grouped_mm_padded):
        assert torch.autograd.gradcheck(lambda a, b: fn(a, b, counts), (x.requires_grad_(), w.requires_grad_()))


def test_torch_kernel_path_fp32_equals_the_per_group_kernel():
    counts = [17, 0, 5, 30, 2, 0, 9, 1]
    x, w, dy = _operands(counts, 32, 48, torch.float32, seed=2)
    assert torch_kernel_accepts(x, w) and torch_kernel_accepts(x.t(), dy)  # rows of 128 and 192 bytes
    assert not torch_kernel_accepts(x.double()) and not torch_kernel_accepts(torch.zeros(4, 5))
    fast, per_group = _run(grouped_mm, x, w, dy, counts, kernel="torch"), _run(grouped_mm, x, w, dy, counts, kernel="mm")
    want = _by_hand(x.double(), w.double(), dy.double(), counts)
    for a, b, e in zip(fast, per_group, want):
        assert_close(a, e, rtol=TOLERANCE["float32"])
        assert_close(b, e, rtol=TOLERANCE["float32"])


def test_no_rows_at_all_and_bad_counts():
    x, w = torch.zeros(0, 16, requires_grad=True), torch.randn(3, 16, 8, requires_grad=True)
    for fn in (grouped_mm, grouped_mm_loop, grouped_mm_padded):
        y = fn(x, w, [0, 0, 0])
        assert y.shape == (0, 8)
        y.sum().backward()
        assert w.grad is None or not w.grad.any()
    with pytest.raises(ValueError, match="must be >= 0 and sum to N = 4"):
        grouped_mm(torch.zeros(4, 2), torch.zeros(2, 2, 2), [3, 2])
    with pytest.raises(ValueError, match="kernel must be one of"):
        grouped_mm(torch.zeros(4, 2), torch.zeros(2, 2, 2), [2, 2], kernel="cutlass")


def test_experts_module_same_with_every_gemm_and_shards_by_slices():
    counts = [4, 0, 9, 2]
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(sum(counts), 8, dtype=torch.float64, generator=gen)
    outs = []
    for gemm in ("grouped", "loop", "padded"):
        ex = Experts(4, 8, 12, gemm=gemm).double()
        ex.reset_parameters(torch.Generator().manual_seed(4), n_layer=2)
        outs.append(ex(x, counts))
    assert_close(outs[1], outs[0], rtol=TOLERANCE["float64"])
    assert_close(outs[2], outs[0], rtol=TOLERANCE["float64"])
    half = ex.shard(1, 2)
    assert half.first == 2 and half.num_experts == 2 and torch.equal(half.w1, ex.w1[2:])
    assert_close(half(x[4:], counts[2:]), outs[0][4:], rtol=TOLERANCE["float64"])
    with pytest.raises(ValueError, match="4 experts do not split evenly over 3 ranks"):
        ex.shard(0, 3)
