"""The fused embedding (scaletrain.ops.embedding: token + position + dropout, scatter-add backward)
against torch.nn.functional.embedding plus the position rows, in float64; dropout checked by its
own properties (the kept entries equal the no-dropout value / (1 - p), the dropped fraction is
near p, the gradient follows the same mask).  Triton through the interpreter; the sm_80 build
is in test_attention_triton.py."""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from scaletrain.ops import embedding
from scaletrain.ops.toolchain.isolated import IsolatedWorker
from scaletrain.testing import TOLERANCE, assert_close

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the triton package is not installed (Linux x86-64 only)")


def check_case(batch, seq, dim, dtype, backend, p=0.0, device="cpu", seed=0):
    torch.manual_seed(seed)
    ids = torch.randint(0, 13, (batch, seq), device=device)  # 13 ids for many tokens: repeated rows collide
    tok = torch.randn(13, dim, device=device).to(dtype).requires_grad_()
    pos = torch.randn(seq + 2, dim, device=device).to(dtype).requires_grad_()
    with torch.no_grad():  # kept entries that sum to exactly 0 (in bf16 ~1e-3 of them by chance): a row of them
        pos[0] = -tok[ids[0, 0]]
    y = embedding(ids, tok, pos, p=p, seed=seed, backend=backend)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref = [t.detach().double().requires_grad_() for t in (tok, pos)]
    dense = F.embedding(ids, ref[0]) + ref[1][:seq]
    keep = _kept(ids, tok, pos, p, seed, backend) if p else torch.ones_like(dense)
    expected = dense * keep / (1 - p)
    expected.backward(dy.double())
    tol = TOLERANCE[dtype]
    assert_close(y, expected, rtol=tol, what=f"embedding {batch}x{seq}x{dim} p={p}")
    assert_close(tok.grad, ref[0].grad, rtol=4 * tol, what="dtoken (scatter-add)")
    assert_close(pos.grad, ref[1].grad, rtol=4 * tol, floor=1e-6, what="dposition")
    if p:
        dropped = 1 - keep.mean().item()
        assert abs(dropped - p) < 0.05, f"dropped {dropped:.3f} of the entries, expected about {p}"


def _kept(ids, tok, pos, p, seed, backend):
    """The dropout mask, read back through the seed on inputs that cannot cancel (ones): y == 0 is
    no sign of a dropped entry where tok + pos is exactly 0, which the H200 run's bf16 case had by
    chance (dposition 'relative error 0.32': the test dropped kept gradients, issue 29)."""
    ones = embedding(ids, torch.ones_like(tok), torch.zeros_like(pos), p=p, seed=seed, backend=backend)
    return (ones != 0).double()


CASES = [(3, 17, 24, torch.float32, 0.0), (2, 33, 130, torch.float16, 0.0), (5, 31, 64, torch.float32, 0.25)]


@pytest.mark.parametrize("batch,seq,dim,dtype,p", CASES)
def test_torch_backend(batch, seq, dim, dtype, p):
    check_case(batch, seq, dim, dtype, "torch", p)


def test_clear_errors():
    ids, tok, pos = torch.randint(0, 5, (2, 4)), torch.randn(5, 8), torch.randn(3, 8)
    with pytest.raises(ValueError, match="exceeds the 3 positions"):
        embedding(ids, tok, pos)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 5\)"):
        embedding(ids + 5, tok, torch.randn(4, 8))
    with pytest.raises(ValueError, match="dropout p"):
        embedding(ids, tok, torch.randn(4, 8), p=1.0)
    with pytest.raises(ValueError, match="backend 'cuda' needs CUDA tensors"):
        embedding(ids, tok, torch.randn(4, 8), backend="cuda")


@pytest.fixture(scope="module")
def interp():
    with IsolatedWorker({"TRITON_INTERPRET": "1"}, timeout_s=240) as worker:
        yield worker.run


@needs_triton
def test_triton_through_the_interpreter(interp):
    for case in CASES:
        interp(check_case, *case[:4], "triton", case[4])


@pytest.mark.gpu
@pytest.mark.parametrize("batch,seq,dim,dtype,p", CASES + [(8, 1024, 768, torch.bfloat16, 0.1)])
def test_gpu(batch, seq, dim, dtype, p):
    check_case(batch, seq, dim, dtype, "triton", p, device="cuda")
