"""Dropout under tensor parallelism: masks that do not depend on how a tensor is split.

The problem (Shoeybi et al. 2019, "Megatron-LM", §3, last paragraph; Korthikanti et al. 2022, §4.2.2).
A tensor-parallel block has dropout in two kinds of region:
  * replicated: after a row-parallel layer's allreduce (g) every rank holds the whole (b, s, h)
    activation. Its mask must be the same on every rank, or the replicas drift apart;
  * split: the attention probabilities (b, a/t, s, s) of this rank's heads, and, under sequence
    parallelism, the residual stream's (b, s/t, h) sequence shard. Their masks must differ across
    ranks: the same mask on every shard would correlate elements that one process drops independently.
Megatron keeps two stateful generators (`CudaRNGStatesTracker`): the default one, seeded alike on
every tp rank, for replicated regions, and "model-parallel-rng", seeded seed + 2718 + tp_rank, forked
for split regions (and for the sequence-parallel residual dropout). That gives the right distribution,
but not one process's masks: a t-rank run is a different random draw than the unsplit model.

Here the mask is a counter-based function instead (Salmon et al. 2011, "Parallel random numbers: as
easy as 1, 2, 3"; Philox is how torch's CUDA dropout lets each thread draw from a seed and an offset):
element i of the *whole, unsplit* tensor is kept iff

    u(key, i) = hash(key, i) / 2³² >= p,    key = (seed, site, call),

with `site` naming the dropout in the model, `call` counting its training forwards. A rank evaluates
u only at the global indices of its own slice, so
  * replicated regions: every rank evaluates every index: identical masks (Megatron's default stream);
  * split regions: disjoint indices: independent masks per rank, reproducible from the seed
    (Megatron's model-parallel stream);
  * and the slices together are exactly the mask of the unsplit tensor: the t-rank model equals the
    same model at t = 1, in one process, with dropout on (tests/test_tp_dropout.py). A stateful
    generator cannot do this: it cannot reach the numbers of slice r without drawing those before.
Every tp rank must make the same sequence of training forwards (they do: they run one program); a
recomputed forward (activation checkpointing) would have to reuse its `call`.

The hash is three rounds of Wellons' `lowbias32` integer mixer over 32-bit words, in int64 tensors
whose products never overflow (`_mul32`), so it is exact on every backend.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn

__all__ = ["keep_mask", "TensorParallelDropout"]

_M32 = 0xFFFFFFFF


def _mul32(x, c: int):
    """(x · c) mod 2³² for x in [0, 2³²): in 16-bit halves of c, so no int64 product overflows."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix32(x):
    """lowbias32 (C. Wellons, "Hash function prospector"): a bijection of [0, 2³²) that mixes every bit.
    Works on Python ints and int64 tensors alike."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _key(seed: int, site: int, call: int) -> tuple[int, int]:
    """Two 32-bit key words; the call enters after a mix, so keys are not XOR shifts of each other."""
    k0 = _mix32((seed & _M32) ^ _mix32(site & _M32))
    return k0, _mix32(k0 ^ _mix32((call + 0x9E3779B9) & _M32))


def _global_index(shape: Sequence[int], full_shape: Sequence[int], start: Sequence[int]) -> torch.Tensor:
    """Row-major index in `full_shape` of every element of the slice `shape` that starts at `start`."""
    index = torch.zeros((), dtype=torch.int64)
    for n, size, first in zip(shape, full_shape, start):
        index = index.unsqueeze(-1) * size + torch.arange(first, first + n, dtype=torch.int64)
    return index


def keep_mask(shape: Sequence[int], *, p: float, seed: int, site: int, call: int,
              full_shape: Sequence[int] | None = None, start: Sequence[int] | None = None) -> torch.Tensor:
    """Bool mask (shape) of the elements kept: the slice at `start` of the whole tensor's mask
    (`full_shape`; default: the slice is the whole tensor)."""
    full_shape = tuple(shape) if full_shape is None else tuple(full_shape)
    start = (0,) * len(shape) if start is None else tuple(start)
    if not len(shape) == len(full_shape) == len(start) or any(
            s0 < 0 or s0 + n > g for n, g, s0 in zip(shape, full_shape, start)):
        raise ValueError(f"keep_mask: slice {tuple(shape)} at {start} does not fit in {full_shape}")
    if not 0 <= p < 1:
        raise ValueError(f"keep_mask: p must be in [0, 1), got {p}")
    k0, k1 = _key(seed, site, call)
    index = _global_index(shape, full_shape, start)
    bits = _mix32(_mix32(_mix32((index & _M32) ^ k0) ^ k1) ^ (index >> 32))
    return bits >= int(p * 2 ** 32)  # u = bits / 2³² >= p


class TensorParallelDropout(nn.Module):
    """Dropout(p) with `keep_mask`'s counter-based masks, for an input that is the whole tensor
    (`split_dim=None`: replicated region) or rank `tp_rank`'s 1/t slice along `split_dim`.

    `seed` and `site` name the mask stream (`parallelize` numbers the GPT's dropouts); `calls` counts
    the training forwards, so each one draws a new mask. Eval mode and p = 0: the identity.
    """

    def __init__(self, p: float, *, seed: int, site: int, split_dim: int | None = None, tp_rank: int = 0,
                 tp_world_size: int = 1):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"TensorParallelDropout: p must be in [0, 1), got {p}")
        self.p, self.seed, self.site = p, seed, site
        self.split_dim, self.tp_rank, self.tp_world_size = split_dim, tp_rank, tp_world_size
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        full, start = list(x.shape), [0] * x.dim()
        if self.split_dim is not None:
            d = self.split_dim % x.dim()
            full[d], start[d] = x.shape[d] * self.tp_world_size, x.shape[d] * self.tp_rank
        keep = keep_mask(x.shape, p=self.p, seed=self.seed, site=self.site, call=self.calls, full_shape=full,
                         start=start)
        self.calls += 1
        return x * keep.to(x.dtype) * (1.0 / (1.0 - self.p))  # inverted dropout: E[out] = x, as torch's

    def extra_repr(self) -> str:
        where = "replicated" if self.split_dim is None else f"split along dim {self.split_dim}, " \
            f"slice {self.tp_rank} of {self.tp_world_size}"
        return f"p={self.p}, seed={self.seed}, site={self.site}, {where}"
