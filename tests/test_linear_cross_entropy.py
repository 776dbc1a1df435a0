"""The chunked linear + cross-entropy (scaletrain.ops.linear_cross_entropy) against
F.cross_entropy(F.linear(h, W, b), y) in float64: loss, dh, dW, db on irregular shapes, a last
partial chunk, ignored rows (the default ignore_index and one inside the vocabulary), label
smoothing, an upstream gradient; its memory, counted op by op, holds one chunk of logits, not N x V;
the Triton criterion per chunk through the interpreter; the fused kernels on a GPU (marked `gpu`)."""

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F

from scaletrain.ops.allocations import peak_allocated
from scaletrain.ops.linear_cross_entropy import linear_cross_entropy, liger_chunk_rows
from scaletrain.ops.toolchain.isolated import IsolatedWorker
from scaletrain.testing import TOLERANCE, assert_close

# (batch shape, H, V, chunk rows, bias, ignore_index, label smoothing): N never a multiple of the chunk
CASES = [((37,), 16, 101, 8, False, -100, 0.0), ((3, 5), 24, 257, 4, True, -100, 0.1),
         ((2, 9), 8, 1000, 5, True, 3, 0.0), ((7,), 32, 64, 16, False, -1, 0.2)]


def check_case(shape, hidden, vocab, chunk, with_bias, ignore_index, eps, *, dtype=torch.float32, device="cpu",
               backend="torch", seed=0, upstream=1.0):
    torch.manual_seed(seed)
    h = torch.randn(*shape, hidden, device=device).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, device=device) / hidden ** 0.5).to(dtype).requires_grad_()
    b = torch.randn(vocab, device=device).to(dtype).requires_grad_() if with_bias else None
    y = torch.randint(0, vocab, shape, device=device)
    y.view(-1)[::3] = ignore_index                                 # every third row ignored
    loss = linear_cross_entropy(h, w, y, b, ignore_index=ignore_index, label_smoothing=eps, chunk_rows=chunk,
                                backend=backend)
    (upstream * loss).backward()
    ref = [t.detach().double().requires_grad_() for t in (h, w, *([b] if with_bias else []))]
    expected = F.cross_entropy(F.linear(ref[0], ref[1], ref[2] if with_bias else None).flatten(0, -2), y.flatten(),
                               ignore_index=ignore_index, label_smoothing=eps)
    (upstream * expected).backward()
    tol = TOLERANCE[dtype]
    what = f"{shape} H={hidden} V={vocab} chunk={chunk} ignore={ignore_index} eps={eps} {dtype}"
    assert loss.dtype == dtype
    assert_close(loss, expected, rtol=tol, what=f"loss {what}")
    for name, got, want in zip(("dh", "dW", "db"), (h, w, b), ref):
        assert got.grad.dtype == dtype
        assert_close(got.grad, want.grad, rtol=4 * tol, what=f"{name} {what}")
    assert (h.grad.reshape(-1, hidden)[::3] == 0).all(), "an ignored row's hidden state must get no gradient"


@pytest.mark.parametrize("case", CASES)
def test_loss_and_gradients_equal_torch(case):
    check_case(*case)


def test_an_upstream_gradient_scales_every_gradient():
    check_case((11,), 8, 50, 4, True, -100, 0.0, upstream=-2.5)


def test_one_chunk_and_one_row_per_chunk_agree_with_torch():
    check_case((9,), 8, 30, 64, True, -100, 0.0)
    check_case((9,), 8, 30, 1, True, -100, 0.1)


def test_every_row_ignored_gives_nan_as_torch():
    h, w = torch.randn(4, 8), torch.randn(20, 8)
    y = torch.full((4,), -100)
    assert math.isnan(linear_cross_entropy(h, w, y, chunk_rows=3).item())
    assert math.isnan(F.cross_entropy(h @ w.T, y).item())


def test_liger_chunk_rule():
    assert liger_chunk_rows(4096 * 4, 4096, 32000) == 2048  # Liger's own example: V / H -> 8, N / 8
    assert liger_chunk_rows(100, 64, 50) == 100 and liger_chunk_rows(1000, 64, 128_000) == 1


def test_memory_holds_one_chunk_of_logits_not_all_of_them():
    n, hidden, vocab, chunk = 1024, 32, 4096, 64
    torch.manual_seed(1)
    h, w = torch.randn(n, hidden, requires_grad=True), torch.randn(vocab, hidden, requires_grad=True)
    y = torch.randint(0, vocab, (n,))
    logits_bytes, chunk_bytes = n * vocab * 4, chunk * vocab * 4
    _, full = peak_allocated(lambda: F.cross_entropy(h @ w.T, y).backward())
    _, chunked = peak_allocated(lambda: linear_cross_entropy(h, w, y, chunk_rows=chunk).backward())
    grads = (n * hidden + vocab * hidden) * 4 * 2                  # dh, dW: the Function's and the returned copies
    assert full >= 2 * logits_bytes                                # logits, log-probabilities (and their gradient)
    assert chunked <= grads + 6 * chunk_bytes, (chunked, grads, chunk_bytes)  # the criterion's temporaries per chunk
    assert chunked < logits_bytes / 2


def test_clear_errors():
    h, w, y = torch.randn(4, 8), torch.randn(10, 8), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="must share H"):
        linear_cross_entropy(h, torch.randn(10, 7), y)
    with pytest.raises(TypeError, match="weight.to"):
        linear_cross_entropy(h, w.double(), y)
    with pytest.raises(TypeError, match="target.long"):
        linear_cross_entropy(h, w, y.int())
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        linear_cross_entropy(h, w, torch.tensor([0, 1, 2, 10]))
    with pytest.raises(ValueError, match="bias"):
        linear_cross_entropy(h, w, y, torch.randn(9))
    with pytest.raises(ValueError, match="chunk_rows"):
        linear_cross_entropy(h, w, y, chunk_rows=0)
    with pytest.raises(ValueError, match="label_smoothing"):
        linear_cross_entropy(h, w, y, label_smoothing=-0.1)


def triton_cases():
    for case in CASES[:2]:
        check_case(*case, backend="triton")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="the triton package is not installed")
def test_the_triton_criterion_per_chunk_through_the_interpreter():
    with IsolatedWorker({"TRITON_INTERPRET": "1"}, timeout_s=240) as worker:
        worker.run(triton_cases)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu(backend, dtype):
    for case in CASES:
        check_case(*case, dtype=dtype, device="cuda", backend=backend)


@pytest.mark.gpu
def test_gpu_dw_accumulates_bf16_products_into_fp32_in_place():
    """dW += dz^T h on the tensor cores into the fp32 sum, with no (V, H) temporary: on an H200 the
    bf16 path that made the product first ran at 0.2x the unchunked time with 4x the logits' peak."""
    from scaletrain.ops.linear_cross_entropy import _accumulate
    torch.manual_seed(0)
    vocab, hidden, rows = 32000, 1024, 128
    acc = torch.randn(vocab, hidden, device="cuda")
    a = torch.randn(vocab, rows, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    expected = acc.double() + a.double() @ b.double()
    _accumulate(acc.clone(), a, b)                                   # cuBLAS's workspace, once
    _, extra = peak_allocated(lambda: _accumulate(acc, a, b), device="cuda")
    assert extra < vocab * hidden * 2 // 4, f"{extra} bytes beyond the sum: a (V, H) temporary is {vocab * hidden * 2}"
    assert_close(acc, expected, rtol=TOLERANCE[torch.float32] * 8, what="dW accumulated in fp32")
