"""Beam search with the KV cache against exhaustive search over every continuation (beam wide enough
to keep every prefix) and against a cache-free beam search written here; a search whose cache is
not re-indexed by beam is caught by the same comparison."""

from __future__ import annotations

import pytest
import torch

from scaletrain.infer import KVCache, beam_search, beam_topk, exhaustive_search, flat_topk
from scaletrain.models import GPT, GPTConfig
from scaletrain.testing import assert_close


def _model(vocab: int, seed: int) -> GPT:
    cfg = GPTConfig(vocab_size=vocab, block_size=16, n_layer=2, n_head=2, n_embd=16)
    model = GPT(cfg, seed=seed).double().eval()
    with torch.no_grad():  # GPT-2's 0.02 init gives near-uniform next-token laws: sharpen them
        model.wte.weight.mul_(40.0)
    return model


def _prompt(vocab: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("vocab,steps,seed", [(4, 3, 0), (3, 4, 1), (5, 2, 2), (6, 3, 3)])
@pytest.mark.parametrize("select", [flat_topk, beam_topk], ids=["sort kV", "retrieve-rerank"])
def test_beam_search_keeping_every_prefix_is_exhaustive_search(vocab, steps, seed, select):
    model, prompt = _model(vocab, seed), _prompt(vocab, 3, seed)
    k = vocab ** (steps - 1)  # no prefix is ever dropped: the last step ranks all V^n continuations
    seqs, scores = beam_search(model, prompt, beam_size=k, steps=steps, select=select)
    want_seqs, want_scores = exhaustive_search(model, prompt, steps=steps, k=k)
    assert torch.equal(seqs, want_seqs)
    assert_close(scores, want_scores, rtol=1e-12)


@torch.no_grad()
def _beam_search_without_cache(model, prompt, k, steps):
    """The textbook loop: every step runs every beam's whole sequence through the full forward."""
    beams = [([], 0.0)]
    for _ in range(steps):
        grown = []
        for toks, score in beams:
            full = torch.cat([prompt, torch.tensor(toks, dtype=torch.long)])[None]
            logp = model(full)[0][0, -1].log_softmax(-1)
            grown += [(toks + [t], score + float(logp[t])) for t in range(model.cfg.vocab_size)]
        beams = sorted(grown, key=lambda b: -b[1])[:k]
    return beams


@pytest.mark.parametrize("vocab,k,steps,seed", [(7, 2, 5, 4), (9, 3, 4, 5), (5, 4, 6, 6)])
def test_narrow_beam_search_equals_the_cache_free_search(vocab, k, steps, seed):
    model, prompt = _model(vocab, seed), _prompt(vocab, 2, seed)
    seqs, scores = beam_search(model, prompt, beam_size=k, steps=steps, select=beam_topk)
    want = _beam_search_without_cache(model, prompt, k, steps)
    assert seqs.tolist() == [toks for toks, _ in want]
    assert_close(scores, torch.tensor([s for _, s in want], dtype=torch.float64), rtol=1e-12)


def test_a_cache_not_reindexed_by_beam_differs_from_exhaustive_search(monkeypatch):
    model, prompt = _model(4, 0), _prompt(4, 3, 0)
    want_seqs, want_scores = exhaustive_search(model, prompt, steps=3, k=16)
    monkeypatch.setattr(KVCache, "reorder", lambda self, parents: None)  # the planted bug
    seqs, scores = beam_search(model, prompt, beam_size=16, steps=3)
    assert not torch.equal(seqs, want_seqs) or (scores - want_scores).abs().max() > 1e-6
