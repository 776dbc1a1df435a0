"""kernels/attention_mma.cu and attention_mma_bwd.cu on a GPU (sm_80+; skipped with a reason
elsewhere: on CPU the same kernels run in the CUDA emulator, test_attention_mma_cuda_cpu.py, and
compile for sm_80 / sm_90, test_attention_mma_compile.py):

* the "cuda" backend picks it for fp16 / bf16 at head dim 64 and 128, attention.cu's scalar kernel
  for fp32 and other head dims;
* its O and L against float64 attention, forced (attention_fwd_mma), over lengths that end inside
  a block and a tile, causal and not, seq_q != seq_k; the same for attention_mma_bwd.cu's dQ, dK,
  dV; the autograd path ("cuda": both on tensor cores) and the scalar backward on the tensor-core
  forward's O and L;
* the speed target: forward >= 0.5x SDPA's flash path at n = 4096 (batch 4 x 16 heads, d 64).
"""

import pytest
import torch
import torch.nn.functional as F

from scaletrain.ops.testing import attention_grad_atol
from scaletrain.testing import TOLERANCE, assert_close

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
                                 reason="needs a CUDA device of compute capability 8.0+ (none here)")]


def _ext():
    from scaletrain.ops import attention_cuda
    return attention_cuda.load()


@pytest.mark.parametrize("dtype,d,expected", [(torch.float16, 64, True), (torch.bfloat16, 128, True),
                                              (torch.float32, 64, False), (torch.float16, 80, False)])
def test_the_launcher_picks_tensor_cores_for_fp16_bf16_at_64_and_128(dtype, d, expected):
    q = torch.randn(2, 8, d, device="cuda").to(dtype)
    assert _ext().attention_fwd_uses_mma(q, q, q) is expected


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bh,seq_q,seq_k,d,causal", [
    (15, 1, 1, 64, True), (6, 129, 129, 64, True), (6, 1000, 1000, 128, False), (4, 200, 333, 64, False),
    (4, 333, 200, 128, True)])
def test_forward_matches_float64_attention(dtype, bh, seq_q, seq_k, d, causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(bh, s, d, device="cuda").to(dtype) for s in (seq_q, seq_k, seq_k))
    o, lse = _ext().attention_fwd_mma(q, k, v, causal, d ** -0.5)
    qd, kd, vd = (t.double() for t in (q, k, v))
    hidden = torch.full((seq_q, seq_k), -torch.inf, dtype=torch.float64, device="cuda").triu(1) if causal else 0.0
    assert_close(o, F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal), rtol=TOLERANCE[dtype], what="O")
    assert_close(lse, torch.logsumexp(qd @ kd.transpose(1, 2) * d ** -0.5 + hidden, -1),
                 rtol=TOLERANCE[torch.float32], what="L")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bh,seq_q,seq_k,d,causal", [
    (15, 1, 1, 64, True), (6, 129, 129, 64, True), (4, 1000, 1000, 128, False), (4, 200, 333, 64, False),
    (4, 333, 200, 128, True)])
def test_backward_matches_float64_attention(dtype, bh, seq_q, seq_k, d, causal):
    from scaletrain.ops.testing import attention_grad_atol
    torch.manual_seed(2)
    q, k, v = (torch.randn(bh, s, d, device="cuda").to(dtype) for s in (seq_q, seq_k, seq_k))
    do = torch.randn_like(q)
    o, lse = _ext().attention_fwd_mma(q, k, v, causal, d ** -0.5)
    grads = _ext().attention_bwd_mma(do, q, k, v, o, lse, causal, d ** -0.5)
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*ref, is_causal=causal).backward(do.double())
    atol = attention_grad_atol(q, k, v, do, storage=dtype)  # where dS = P (dP - D) cancels (one key)
    for name, got, r in zip(("dQ", "dK", "dV"), grads, ref):
        assert_close(got, r.grad, rtol=4 * TOLERANCE[dtype], atol=atol[name], what=name)


def test_the_autograd_path_and_the_scalar_backward_agree():
    from scaletrain.ops import attention
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    attention(q, k, v, causal=True, backend="cuda").backward(do)  # both ways on tensor cores
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*ref, is_causal=True).backward(do.double())
    atol = attention_grad_atol(q, k, v, do, storage=torch.float16)  # row 0 sees one key: dQ is 0 there
    for name, got, r in zip("QKV", (q, k, v), ref):
        assert_close(got.grad, r.grad, rtol=8 * TOLERANCE[torch.float16], atol=atol[f"d{name}"], what=f"d{name}")
    o, lse = _ext().attention_fwd_mma(*(t.detach().reshape(8, 300, 64) for t in (q, k, v)), True, 0.125)
    scalar = _ext().attention_bwd_scalar(do.reshape(8, 300, 64), *(t.detach().reshape(8, 300, 64) for t in (q, k, v)),
                                         o, lse, True, 0.125)
    for name, got, r in zip("QKV", scalar, ref):  # the scalar backward on the tensor-core forward's O and L
        assert_close(got.reshape(r.shape), r.grad, rtol=8 * TOLERANCE[torch.float16], atol=atol[f"d{name}"],
                     what=f"d{name} (scalar)")


def test_speed_target_half_of_sdpa_flash_forward():
    """The target, not yet measured: >= 0.5x SDPA's flash path, forward, fp16, n = 4096."""
    from scaletrain.ops.attention_benchmark import speed_rows
    rows = [r for r in speed_rows(ns=(4096,), dtype=torch.float16, reps=10) if r["direction"] == "fwd"]
    for row in rows:
        print(row)
    cuda = next(r for r in rows if r["impl"] == "cuda")
    assert cuda["vs flash"] >= 0.5, cuda
