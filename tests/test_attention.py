"""scaletrain.ops.attention on the "torch" backend (the composed reference), its argument checks,
the traffic model against the aten byte counter, and what the autograd graph keeps: O(n d) for
the fused Function vs O(n^2) for the composed ops.  The Triton kernels are in
test_attention_triton.py (interpreter, sm_80 build); the CUDA ones run on a GPU only."""

import pytest
import torch
import torch.nn.functional as F

from scaletrain.ops import attention, attention_naive, traffic
from scaletrain.testing import TOLERANCE, assert_close


def _qkv(lead, seq_q, seq_k, d, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    shapes = ((*lead, seq_q, d), (*lead, seq_k, d), (*lead, seq_k, d))
    return [torch.randn(s).to(dtype).requires_grad_() for s in shapes]


@pytest.mark.parametrize("lead,seq_q,seq_k,d,causal", [((2, 3), 17, 17, 16, True), ((3,), 1, 1, 8, True),
                                                      ((1, 5), 9, 23, 24, False), ((1, 1), 23, 9, 16, True)])
def test_torch_backend_matches_sdpa_forward_and_backward(lead, seq_q, seq_k, d, causal):
    q, k, v = _qkv(lead, seq_q, seq_k, d)
    do = torch.randn(*lead, seq_q, d)
    attention(q, k, v, causal=causal, backend="torch").backward(do)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*ref, is_causal=causal)
    out.backward(do.double())
    assert_close(attention(q, k, v, causal=causal, backend="torch"), out, rtol=TOLERANCE[torch.float32])
    for name, got, r in zip("qkv", (q, k, v), ref):
        assert_close(got.grad, r.grad, rtol=4 * TOLERANCE[torch.float32], floor=1e-6, what=f"d{name}")


def test_scale_and_logsumexp():
    q, k, v = (t.detach() for t in _qkv((2,), 5, 7, 4))
    o, lse = attention_naive.attention_fwd(q, k, v, False, 0.3)
    scores = (q.double() @ k.double().transpose(1, 2)) * 0.3
    assert_close(lse, torch.logsumexp(scores, -1), what="L = logsumexp(S)")
    assert_close(o, F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.3))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bh,n,d", [(1, 8, 4), (3, 17, 16)])
def test_naive_traffic_formula_equals_the_aten_count(bh, n, d, causal):
    q, k, v = (t.detach() for t in _qkv((bh,), n, n, d))
    counted, _ = traffic.count_traffic(attention_naive.attention_fwd, q, k, v, causal)
    assert counted == traffic.attention_naive("fwd", bh, n, d, causal=causal)
    o, lse = attention_naive.attention_fwd(q, k, v, causal)
    counted, _ = traffic.count_traffic(attention_naive.attention_bwd, torch.randn_like(o), q, k, v, o, lse, causal)
    assert counted == traffic.attention_naive("bwd", bh, n, d, causal=causal)


def test_traffic_naive_grows_as_n_squared_fused_minimum_as_n():
    small, big = (traffic.attention_naive("fwd", 1, n, 64).total for n in (1024, 4096))
    assert 15 < big / small <= 16  # n^2 dominates
    small, big = (traffic.attention_minimum("fwd", 1, n, 64).total for n in (1024, 4096))
    assert big == 4 * small
    # no cache: each query tile re-reads K, V; causal visits about half the tiles
    full, causal = (traffic.attention_fused("fwd", 1, 4096, 64, causal=c).total for c in (False, True))
    assert 0.45 < causal / full < 0.55
    assert traffic.attention_fused("fwd", 1, 4096, 64).total < traffic.attention_naive("fwd", 1, 4096, 64).total / 6


def _saved_numel(fn):
    """Elements the autograd graph keeps for the backward while fn runs."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        fn()
    return sum(saved)


def test_the_function_saves_o_n_d_the_composed_ops_o_n_squared():
    bh, n, d = 2, 256, 16
    q, k, v = _qkv((bh,), n, n, d)
    fused = _saved_numel(lambda: attention(q, k, v, causal=True, backend="torch"))
    assert fused == 4 * bh * n * d + bh * n  # q, k, v, o and L
    composed = _saved_numel(lambda: torch.softmax(q @ k.transpose(1, 2) / d ** 0.5, -1) @ v)
    assert composed >= 2 * bh * n * n  # at least the scores and the probabilities


def test_clear_errors():
    q, k, v = (t.detach() for t in _qkv((2,), 5, 5, 8))
    with pytest.raises(ValueError, match="share the leading dims"):
        attention(q, k[:1], v[:1])
    with pytest.raises(TypeError, match="share a dtype"):
        attention(q, k.half(), v.half())
    with pytest.raises(TypeError, match="floating-point"):
        attention(q, k.long(), v)
    with pytest.raises(ValueError, match="at least one key"):
        attention(q, k[:, :0], v[:, :0])
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        attention(q, k, v, backend="tpu")
    with pytest.raises(ValueError, match="head_dim <= 128"):
        attention(*(torch.randn(1, 2, 130) for _ in range(3)), backend="triton")
    with pytest.raises(ValueError, match="backend 'cuda' needs CUDA tensors"):
        attention(q, k, v, backend="cuda")
    with pytest.raises(TypeError, match="supports dtypes"):
        attention(q.double(), k.double(), v.double(), backend="triton")
    assert attention(q[:0], k[:0], v[:0]).shape == (0, 5, 8)
