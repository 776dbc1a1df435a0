"""Beam search with the KV cache re-indexed by beam, and the exhaustive search it approximates.

LightSeq lecture, "Inference: Beam Search": keep the k best partial sequences; each step adds every
beam's next-token log-probability to its score, takes the top k of the k·V sums
(`tf.nn.top_k(log_seq_prob, k)`), and "refresh[es the] cache ... based on beam id": the surviving
beam i continues parent ⌊flat_i / V⌋, whose keys and values must move to row i. A search that skips
the refresh attends to another beam's past and no longer scores the sequences it returns.

With k ≥ V^(n-1) no prefix is ever dropped, so n steps of beam search return exactly the k best of
all V^n continuations: `exhaustive_search` computes those with the plain full forward.
"""

from __future__ import annotations

import itertools
from typing import Callable

import torch

from scaletrain.infer.decode import forward_cached
from scaletrain.infer.kv_cache import KVCache

__all__ = ["beam_search", "exhaustive_search", "flat_topk"]


def flat_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline selection: top k of the flattened (beams, V) scores, i.e. sorting k·V elements."""
    return scores.flatten().topk(k)


@torch.no_grad()
def beam_search(model, prompt: torch.Tensor, *, beam_size: int, steps: int,
                select: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]] = flat_topk):
    """prompt (s0,) → (sequences (k, steps), scores (k,)), best first; a score is Σ log p of the new tokens.

    `select(scores (k, V), k)` → (values, flat indices) picks the survivors: `flat_topk`, or
    rerank.beam_topk (retrieve and re-rank). Only beam 0 is live at the start (all rows hold the same
    prompt), so the first step does not return k copies of one sequence.

    The contract: one `KVCache.for_model(model, batch=beam_size, ...)` and `forward_cached` for every
    model call: the prompt once, then one new token per beam per step (k·(s0 + steps - 1) positions in
    all); every returned score is the log-probability the full forward gives its sequence.
    """
    # BEGIN SOLUTION
    k, V = beam_size, model.cfg.vocab_size
    cache = KVCache.for_model(model, batch=k, max_len=prompt.numel() + steps)
    logits = forward_cached(model, prompt.expand(k, -1), cache)[:, -1]
    scores = torch.full((k,), float("-inf"), dtype=logits.dtype, device=logits.device)
    scores[0] = 0.0
    seqs = prompt.new_empty(k, 0)
    for step in range(steps):
        total = scores[:, None] + logits.log_softmax(dim=-1)  # (k, V): log P(prefix) + log p(token)
        scores, flat = select(total, k)
        parents, tokens = flat // V, flat % V
        seqs = torch.cat([seqs[parents], tokens[:, None]], dim=1)
        if step + 1 < steps:
            cache.reorder(parents)
            logits = forward_cached(model, tokens[:, None], cache)[:, -1]
    return seqs, scores
    # END SOLUTION


@torch.no_grad()
def exhaustive_search(model, prompt: torch.Tensor, *, steps: int, k: int):
    """The k best of all V^steps continuations by the full forward: (sequences (k, steps), scores (k,))."""
    V = model.cfg.vocab_size
    seqs = torch.tensor(list(itertools.product(range(V), repeat=steps)), dtype=prompt.dtype, device=prompt.device)
    full = torch.cat([prompt.expand(len(seqs), -1), seqs], dim=1)
    logp = model(full)[0].log_softmax(dim=-1)[:, prompt.numel() - 1:-1]  # predicts the new tokens
    scores = logp.gather(-1, seqs[..., None]).squeeze(-1).sum(dim=1)
    best = scores.topk(k)
    return seqs[best.indices], best.values
