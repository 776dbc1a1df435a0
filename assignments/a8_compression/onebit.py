# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/compression/onebit.py by `python -m autograder release`; edit the source.
"""Sign (1-bit) gradient compression with error feedback.

Each rank sends one bit per element (the sign) plus one fp32 scale per chunk; the error the
compression made is kept and added to the next step's gradient (error feedback, Seide et al.,
2014, "1-bit SGD"; Karimireddy et al., 2019, "Error Feedback Fixes SignSGD"; the building block of
1-bit Adam, Tang et al., 2021, seminar notes §1.2.8.1.1 and `additional-techniques.md` §3
"1-Bit Compressive Optimizers"). On rank w, for each chunk c of the bucket (`chunk_numel`
elements; None: the whole bucket is one chunk):

    x_w   ← g_w + e_w
    s_w,c ← ‖x_w,c‖₁ / |c|                       the scale: mean magnitude of the chunk
    C(x_w) = s_w,c · sign(x_w,c)                 sign(0) := +1
    e_w   ← x_w − C(x_w)                         error feedback memory
    out   ← (1/p) Σ_w C(x_w)                     identical on every rank

Wire format: the signs packed 32 to an int32 word (⌈n/32⌉ words) followed by the scales as
int32 bit patterns (k words): one message of L = ⌈n/32⌉ + k words per rank, exchanged with our
ring all-gather (scaletrain.comm.ring_all_gather), so each rank sends exactly

    (p − 1) · 4 · (⌈n/32⌉ + k) bytes      vs   2(p − 1) · 4 · ⌈n/p⌉  for the fp32 ring allreduce,

i.e. ≈ 64/p × fewer bytes (32× at p = 2). An all-gather of 1-bit messages grows with p; 1-bit
Adam's compressed allreduce (a 1-bit reduce-scatter to "servers" that re-compress, with error
feedback on both sides) keeps ≈ 32× at every p: not built here.

Telescoping: Σ_t out_t = Σ_t mean_w g_w,t − mean_w e_w,T, so the sum of compressed gradients
tracks the sum of true means up to one bounded memory term; without feedback the bias of sign
compression accumulates.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.distributed as dist

from scaletrain.comm import ring_all_gather

__all__ = ["pack_signs", "unpack_signs", "onebit_bytes", "OneBitEF"]

_SHIFTS = torch.arange(32, dtype=torch.int64)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """Bit j of word i is 1 when x[32i + j] >= 0; ⌈n/32⌉ int32 words."""
    n = x.numel()
    bits = (x.reshape(-1) >= 0).to(torch.int64)
    bits = torch.cat([bits, bits.new_zeros((-n) % 32)]).view(-1, 32)
    words = (bits << _SHIFTS).sum(dim=1)  # 0 .. 2^32 - 1
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def unpack_signs(words: torch.Tensor, n: int) -> torch.Tensor:
    """±1.0 (float32) for the first n bits of `words`."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    bits = (w.unsqueeze(1) >> _SHIFTS) & 1
    return bits.reshape(-1)[:n].to(torch.float32) * 2 - 1


def _chunks(n: int, chunk_numel: int | None) -> int:
    return 1 if not chunk_numel else max(1, math.ceil(n / chunk_numel))


def onebit_bytes(n: int, p: int, chunk_numel: int | None = None) -> int:
    """Bytes one rank sends for a bucket of n elements: (p − 1) · 4 · (⌈n/32⌉ + chunks)."""
    return (p - 1) * 4 * (math.ceil(n / 32) + _chunks(n, chunk_numel))


class OneBitEF:
    """Compression hook (hook.py): 1 bit per element + one scale per chunk, with error feedback.

    Args: group; chunk_numel (elements per scale, None: one scale per bucket); error_feedback.
    """

    def __init__(self, *, group: Any = None, chunk_numel: int | None = None, error_feedback: bool = True):
        self.group, self.chunk_numel, self.error_feedback = group, chunk_numel, error_feedback
        self.errors: dict[int, torch.Tensor] = {}

    def compress(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed sign words, per-chunk scales) of a flat float tensor: `pack_signs(x)` and, for
        each of the k = ⌈n / chunk_numel⌉ chunks of ⌈n/k⌉ elements (the last one shorter), the
        float32 mean of |x| over the chunk's own elements."""
        raise NotImplementedError('a8 task 8.2: implement `compress` (see assignments/a8_compression/README.md)')

    def decompress(self, words: torch.Tensor, scales: torch.Tensor, n: int) -> torch.Tensor:
        """C(x) from `compress`'s output: ±scale of its chunk for each of the n elements (float32)."""
        raise NotImplementedError('a8 task 8.2: implement `decompress` (see assignments/a8_compression/README.md)')

    def reduce(self, index: int, flat: torch.Tensor, shapes: Sequence[torch.Size] = ()) -> torch.Tensor:
        """Bucket `index`'s local gradient -> (1/p) Σ_w C(g_w + e_w), identical on every rank; the
        error memory `self.errors[index]` (float32, flat) is e_w ← x_w − C(x_w). One ring
        all-gather of [sign words, scales] per call (given); `flat` is not modified."""
        p = dist.get_world_size(self.group)
        x = flat.float().clone()
        if self.error_feedback:
            raise NotImplementedError('a8 task 8.2: implement `reduce` (see assignments/a8_compression/README.md)')
        n = x.numel()
        words, scales = self.compress(x)
        message = torch.cat([words, scales.view(torch.int32)])
        gathered = ring_all_gather(message, p * message.numel(), group=self.group).view(p, -1)
        nw = words.numel()
        out = torch.zeros_like(x)
        for w in range(p):
            out += self.decompress(gathered[w, :nw], gathered[w, nw:].contiguous().view(torch.float32), n)
        out.div_(p)
        if self.error_feedback:
            raise NotImplementedError('a8 task 8.2: implement `reduce` (see assignments/a8_compression/README.md)')
        return out.to(flat.dtype)
