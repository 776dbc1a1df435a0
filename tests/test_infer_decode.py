"""scaletrain.infer's cached decoding against the model's own full forward (fp64, tight), the cache's
bytes against 2·L·b·s·h·bytes, and the samplers against their definitions."""

from __future__ import annotations

import pytest
import torch

from scaletrain.infer import (KVCache, cache_bytes, forward_cached, generate, generate_uncached, greedy, sampler,
                              top_k_filter, top_p_filter)
from scaletrain.models import GPT, GPTConfig
from scaletrain.testing import assert_close

CFG = GPTConfig(vocab_size=29, block_size=24, n_layer=3, n_head=3, n_embd=24)


@pytest.fixture(scope="module")
def model():
    return GPT(CFG, seed=3).double().eval()


def test_cached_logits_equal_the_full_forward(model):
    idx = torch.randint(0, CFG.vocab_size, (2, 19), generator=torch.Generator().manual_seed(0))
    full = model(idx)[0]
    cache = KVCache.for_model(model, batch=2)
    # prefill 7, then 1, 1, a chunk of 3 (the mask beyond the cache's start), then one at a time
    cuts = [0, 7, 8, 9, 12, *range(13, 20)]
    got = torch.cat([forward_cached(model, idx[:, a:b], cache) for a, b in zip(cuts, cuts[1:])], dim=1)
    assert cache.length == 19
    assert_close(got, full, rtol=1e-12)


def test_the_cache_holds_two_L_b_s_h_bytes(model):
    cache = KVCache.for_model(model, batch=3, max_len=11)
    assert cache.nbytes == cache_bytes(n_layer=3, batch=3, seq_len=11, n_embd=24, bytes_per_element=8)
    assert cache.nbytes == 2 * 3 * 3 * 11 * 24 * 8 == 38016
    half = KVCache(n_layer=2, batch=1, n_head=4, head_dim=16, max_len=64, dtype=torch.float16)
    assert half.nbytes == 2 * 2 * 1 * 64 * 64 * 2


def test_the_cache_refuses_positions_past_its_end(model):
    cache = KVCache.for_model(model, batch=1, max_len=4)
    forward_cached(model, torch.zeros(1, 4, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="exceed max_len"):
        forward_cached(model, torch.zeros(1, 1, dtype=torch.long), cache)


def test_cached_greedy_generation_equals_the_uncached(model):
    prompt = torch.randint(0, CFG.vocab_size, (3, 5), generator=torch.Generator().manual_seed(1))
    cached = generate(model, prompt, 15, greedy)
    assert cached.shape == (3, 20)
    assert torch.equal(cached, generate_uncached(model, prompt, 15, greedy))


def test_top_k_keeps_the_k_largest():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(2))
    kept = top_k_filter(logits, 7).isfinite()
    want = torch.zeros_like(kept).scatter(1, logits.topk(7).indices, True)
    assert torch.equal(kept, want)


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_keeps_the_smallest_set_that_reaches_p(p):
    logits = torch.randn(8, 40, generator=torch.Generator().manual_seed(3)) * 2
    probs = logits.softmax(-1)
    kept = top_p_filter(logits, p).isfinite()
    for row, keep in zip(probs, kept):
        mass = row[keep].sum()
        assert mass >= p and mass - row[keep].min() < p  # reaches p, and no kept token is spare
        assert keep.all() or row[keep].min() >= row[~keep].max()  # the most likely ones


def test_sampling_draws_only_allowed_tokens():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(4))
    pick = sampler(top_k=5, top_p=0.8, temperature=0.7, generator=torch.Generator().manual_seed(5))
    allowed = top_p_filter(top_k_filter(logits / 0.7, 5), 0.8).isfinite()
    draws = torch.stack([pick(logits) for _ in range(200)], dim=1)  # (4, 200)
    assert allowed.gather(1, draws).all()
    assert torch.equal(sampler(top_k=1)(logits), greedy(logits))
