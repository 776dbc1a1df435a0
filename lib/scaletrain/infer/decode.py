"""Incremental decoding of `scaletrain.models.GPT` with a KV cache: prefill, then one token a step.

Without a cache, generating token t runs the whole prefix again: Σ_t t = O(n²) token-layers for n
tokens. With it, the prompt is run once (prefill) and each step runs one token whose attention reads
the cached keys and values: O(n) token-layers (attention still reads t cached positions per step).
`forward_cached` uses the model's own modules (wte, wpe, blocks' ln/qkv/proj/mlp, ln_f, lm_head), so
its logits equal the model's full forward (tests/test_infer_decode.py, fp64).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from scaletrain.infer.kv_cache import KVCache

__all__ = ["forward_cached", "generate", "generate_uncached"]


def _attend(attn, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
    """Causal self-attention of the n new positions (b, n, h) against the cache plus themselves."""
    b, n, h = x.shape
    q, k, v = attn.qkv(x).split(h, dim=2)
    q, k, v = (t.view(b, n, attn.n_head, h // attn.n_head).transpose(1, 2) for t in (q, k, v))
    keys, values = cache.write(layer, k, v)
    t0 = cache.length
    # new position i (absolute t0 + i) sees keys j <= t0 + i; one new token sees every key, no mask.
    # SDPA's is_causal aligns the mask top-left, wrong once t0 > 0, hence an explicit mask.
    mask = None if n == 1 else (torch.arange(t0 + n, device=x.device)[None, :]
                                <= torch.arange(t0, t0 + n, device=x.device)[:, None])
    y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    return attn.proj(y.transpose(1, 2).reshape(b, n, h))


@torch.no_grad()
def forward_cached(model, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits (b, n, V) of the n new tokens idx (b, n) at positions [cache.length, cache.length + n)."""
    n, t0 = idx.shape[1], cache.length
    if t0 + n > model.cfg.block_size:
        raise ValueError(f"forward_cached: position {t0 + n} exceeds block_size {model.cfg.block_size}")
    x = model.wte(idx) + model.wpe(torch.arange(t0, t0 + n, device=idx.device))
    for layer, block in enumerate(model.blocks):
        x = x + _attend(block.attn, block.ln1(x), cache, layer)
        x = x + block.mlp(block.ln2(x))
    cache.advance(n)
    return model.lm_head(model.ln_f(x))


def generate(model, prompt: torch.Tensor, steps: int, pick: Callable[[torch.Tensor], torch.Tensor], *,
             step: Callable = forward_cached) -> torch.Tensor:
    """prompt (b, s0) → (b, s0 + steps): prefill once, then one cached token per step.
    `pick` maps the last logits (b, V) to the next tokens (b,) (sampling.greedy, a sampler); `step`
    is `forward_cached` or a compiled version of it (the benchmark's `torch.compile` row)."""
    cache = KVCache.for_model(model, batch=prompt.shape[0], max_len=prompt.shape[1] + steps)
    out, new = prompt, prompt
    for _ in range(steps):
        nxt = pick(step(model, new, cache)[:, -1])[:, None]
        out, new = torch.cat([out, nxt], dim=1), nxt
    return out


@torch.no_grad()
def generate_uncached(model, prompt: torch.Tensor, steps: int,
                      pick: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The baseline: the full forward over the whole prefix at every step (O(n²) token-layers)."""
    out = prompt
    for _ in range(steps):
        out = torch.cat([out, pick(model(out)[0][:, -1])[:, None]], dim=1)
    return out
