"""Public tests of a12: your KV cache under the course's cached decoding, your beam search, your
retrieve and re-rank and your quantization on small hand-made cases, against the model's full
forward, exhaustive search, LightSeq's worked example and bounds computed here.

One task at a time: `pytest assignments/a12_inference -m task12_3`. The grader runs more: hidden
GPT shapes in float32 and float64, reorders with repeated and dropped rows, the bytes your cache
holds and the elements its writes produce, pruned beams against a cache-free beam search, rows with
ties and -inf, the elements your re-rank sorts, 4 bits, edge groups, and the quantized GPT's loss.
"""

import pytest
import torch

from autograder.checks import student_module
from scaletrain.infer.decode import forward_cached
from scaletrain.models import GPT, GPTConfig
from scaletrain.testing import assert_close, expect_equal

STEMS = ("infer_kv_cache", "infer_beam", "infer_rerank", "infer_quant")
for _stem in STEMS:
    student_module(_stem, default=__file__)  # an import error shows here, before any test runs

GPT_CFG = dict(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=8)
CUTS = [0, 5, 6, 9, 10, 11, 12]  # prefill 5, one token, a chunk of 3, then one at a time
BEAM_CFG = dict(vocab_size=3, block_size=8, n_layer=2, n_head=2, n_embd=8)
# LightSeq lecture, "Retrieve": beam size 2, vocabulary 8, two groups of four per beam
LIGHTSEQ = torch.tensor([[2, 4, 2, 4, 3, 5, 1, 2], [1, 3, 7, 4, 1, 5, 8, 6]], dtype=torch.float32)
W = torch.tensor([[0.5, -1.0, 0.25, 2.0, -0.75, 0.0, 1.5, -2.0], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
                  [-3.0, 1.0, 0.0, 0.5, -0.5, 2.5, -1.5, 1.25], [0.0, 0.0, 0.0, 0.0, 0.01, -0.02, 0.03, -0.04]])


def gpt(cfg: dict) -> GPT:
    """A float64 GPT whose weights are spread (std 0.5) so that next-token distributions are far from uniform."""
    model, gen = GPT(GPTConfig(**cfg), seed=0), torch.Generator().manual_seed(0)
    state = {name: torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5
             if p.dim() == 2 or name.endswith("bias") else p.double() for name, p in model.state_dict().items()}
    model = model.double().eval()
    model.load_state_dict(state)
    return model


@pytest.mark.task12_1
def test_task12_1_kv_cache():
    m, model = student_module("infer_kv_cache"), gpt(GPT_CFG)
    idx = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(0))
    cache = m.KVCache.for_model(model, batch=2, max_len=12)
    got = torch.cat([forward_cached(model, idx[:, a:b], cache) for a, b in zip(CUTS, CUTS[1:])], dim=1)
    assert_close(got, model(idx)[0], rtol=1e-10, what="task 12.1: cached logits against the full forward")
    expect_equal(cache.length, 12, what="task 12.1: cache.length after 12 positions")
    expect_equal(cache.nbytes, 2 * 2 * 2 * 12 * 8 * 8, what="task 12.1: nbytes of a full cache, 2·L·b·s·h·bytes")

    rows = torch.randint(0, 11, (3, 4), generator=torch.Generator().manual_seed(1))
    parents, nxt = torch.tensor([2, 0, 0]), torch.tensor([5, 6, 7])
    cache = m.KVCache.for_model(model, batch=3, max_len=5)
    forward_cached(model, rows, cache)
    cache.reorder(parents)
    got = forward_cached(model, nxt[:, None], cache)[:, -1]
    want = model(torch.cat([rows[parents], nxt[:, None]], dim=1))[0][:, -1]
    assert_close(got, want, rtol=1e-10, what="task 12.1: the next token after reorder([2, 0, 0])")


@pytest.mark.task12_2
def test_task12_2_beam_search_equals_exhaustive_search():
    m, model = student_module("infer_beam"), gpt(BEAM_CFG)
    prompt = torch.tensor([1, 2])
    seqs, scores = m.beam_search(model, prompt, beam_size=9, steps=3)  # k = V^(n-1): nothing is pruned
    want_seqs, want_scores = m.exhaustive_search(model, prompt, steps=3, k=9)
    expect_equal(seqs.tolist(), want_seqs.tolist(), what="task 12.2: beam search's sequences, best first")
    assert_close(scores, want_scores, rtol=1e-10, what="task 12.2: beam search's scores")


@pytest.mark.task12_3
def test_task12_3_lightseq_worked_example():
    m = student_module("infer_rerank")
    expect_equal(m.rough_threshold(LIGHTSEQ, 2).tolist(), [4.0, 7.0], what="task 12.3: R, the min of the group maxima")
    expect_equal(m.candidates(LIGHTSEQ, 2).nonzero().tolist(), [[0, 1], [0, 3], [0, 5], [1, 2], [1, 6]],
                 what="task 12.3: the candidates (\"re-rank only on five logits\")")
    values, indices = m.retrieve_rerank(LIGHTSEQ, 2)
    expect_equal(values.tolist(), [[5.0, 4.0], [8.0, 7.0]], what="task 12.3: retrieve_rerank's values")
    expect_equal(LIGHTSEQ.gather(1, indices).tolist(), values.tolist(), what="task 12.3: x at your indices")
    values, flat = m.beam_topk(LIGHTSEQ, 2)
    expect_equal((values.tolist(), flat.tolist()), ([8.0, 7.0], [14, 10]),
                 what="task 12.3: beam_topk across both beams (values, beam·V + token)")


@pytest.mark.task12_4
@pytest.mark.parametrize("group_size", [8, 16])
@pytest.mark.parametrize("symmetric", [True, False])
def test_task12_4_group_wise_quantization(group_size, symmetric):
    m = student_module("infer_quant")
    qt = m.quantize(W, m.QuantSpec(bits=8, symmetric=symmetric, granularity="group", group_size=group_size))
    what = f"task 12.4, groups of {group_size}, symmetric={symmetric}"
    groups = W.numel() // group_size
    expect_equal((qt.q.dtype, tuple(qt.scale.shape), tuple(qt.zero.shape)), (torch.int8, (groups,), (groups,)),
                 what=f"{what}: codes int8, one scale and zero point per group")
    lo, hi = (-127, 127) if symmetric else (-128, 127)
    assert lo <= int(qt.q.min()) and int(qt.q.max()) <= hi, f"{what}: codes outside [{lo}, {hi}]"
    q, w = qt.q.reshape(groups, -1).double(), W.reshape(groups, -1).double()
    deq = (q - qt.zero.double()[:, None]) * qt.scale.double()[:, None]
    err = (w - deq).abs().amax(1)
    assert bool((err <= qt.scale.double() / 2 * (1 + 1e-5)).all()), f"{what}: an error above S/2: {err.tolist()}"
    alpha, beta = (-w.abs().amax(1), w.abs().amax(1)) if symmetric else (w.amin(1).clamp(max=0), w.amax(1).clamp(min=0))
    finest = (beta - alpha) / (2 * (hi - lo))
    assert bool((err <= finest * (1 + 1e-5)).all()), \
        f"{what}: errors {err.tolist()} above range/(2·steps) {finest.tolist()}"
    assert_close(m.dequantize(qt), deq.reshape(W.shape).float(), rtol=1e-6, what=f"{what}: dequantize, (q - Z)·S")
