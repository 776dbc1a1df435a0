"""The decoder's key/value cache (LightSeq lecture, "Fast Inference for Transformer": the decoder
cache; "refresh cache(cache, topk_indices)" in its beam-search code).

A causal layer's keys and values at positions < t never change once computed, so decoding token t
needs only its own q, k, v: the cache keeps every layer's k and v and a step appends one position.
Its size is the formula the benchmark prints,

    bytes = 2 · L · b · s · h · bytes_per_element      (k and v; L layers, batch b, s positions, width h)

which `KVCache.nbytes` counts from the tensors themselves. Beam search permutes the batch rows
every step (a surviving beam may be a child of any parent): `reorder` gathers the rows by parent.
"""

from __future__ import annotations

import torch

__all__ = ["KVCache", "cache_bytes"]


def cache_bytes(*, n_layer: int, batch: int, seq_len: int, n_embd: int, bytes_per_element: int) -> int:
    """2·L·b·s·h·bytes: k and v of every layer, every row, every position."""
    return 2 * n_layer * batch * seq_len * n_embd * bytes_per_element


class KVCache:
    """Every layer's keys and values of the positions decoded so far, for `batch` rows.

    The contract `decode.forward_cached` and `beam.beam_search` rely on (a head's keys are (h/a)-wide):
    - `length`: positions filled, 0 at first; `max_len`: the most it will ever hold.
    - `write(layer, k, v)`: k, v (b, a, n, h/a) are positions [length, length + n) of `layer`; returns
      that layer's (keys, values) at positions [0, length + n), each (b, a, length + n, h/a), in
      position order. Every layer writes once per step, then `advance(n)`.
    - `reorder(parents)`: parents (b,) long, repeats allowed: row i becomes old row parents[i] in every
      layer (beam search's refresh by beam id).
    - `nbytes`: the bytes of the tensors the cache holds.
    Memory and work, the point of a cache: once `max_len` positions are filled it holds exactly
    2·L·b·max_len·h elements of `dtype` (`cache_bytes`) and nothing else, and a step copies only its
    new positions (amortized: the work of a write may not grow with `length`).
    """

    def __init__(self, *, n_layer: int, batch: int, n_head: int, head_dim: int, max_len: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        # BEGIN SOLUTION
        # preallocated: a write is a copy into a slice, a read a view, whatever the length
        shape = (batch, n_head, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        # END SOLUTION
        self.max_len, self.length = max_len, 0

    @classmethod
    def for_model(cls, model, *, batch: int, max_len: int | None = None) -> "KVCache":
        """A cache shaped for `scaletrain.models.GPT`, in its parameters' dtype and device."""
        cfg, weight = model.cfg, model.wte.weight
        return cls(n_layer=cfg.n_layer, batch=batch, n_head=cfg.n_head, head_dim=cfg.n_embd // cfg.n_head,
                   max_len=max_len or cfg.block_size, dtype=weight.dtype, device=weight.device)

    @property
    def nbytes(self) -> int:
        """Bytes held, counted from the tensors (the formula's s is max_len when the cache is full)."""
        # BEGIN SOLUTION
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))
        # END SOLUTION

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (b, a, n, h/a) at positions [length, length + n); return all keys and values so far.
        `length` advances in `advance`, once every layer has written."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KVCache: {end} positions exceed max_len {self.max_len}")
        # BEGIN SOLUTION
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]
        # END SOLUTION

    def advance(self, n: int) -> None:
        self.length += n

    def reorder(self, parents: torch.Tensor) -> None:
        """Row i becomes old row parents[i] in every layer (beam search: the cache follows the beams)."""
        # BEGIN SOLUTION
        # a gather into new tensors: parents may repeat a row and drop another, so no in-place swap
        for cache in (self.k, self.v):
            for layer, t in enumerate(cache):
                cache[layer] = t.index_select(0, parents)
        # END SOLUTION
