"""An additive softmax mask broadcast to the scores' (rows, cols) view without copying it.

Attention masks are small and broadcast: a padding mask is (batch, 1, 1, s) for scores of shape
(batch, heads, s, s), a causal or ALiBi-like bias is (s, s).  Expanding them to the scores'
shape would cost a full MN-element read in the kernel (and MN elements of memory if copied).
Instead the kernels read the small tensor through strides: row r of the flattened scores splits
into at most three leading indices (i0, i1, i2) with their mask strides, and column c steps by
`col_stride` (0 when the mask broadcasts along the softmax dim).  This is the `attn_mask`
argument of LightSeq's `ker_attn_softmax` (accelerating-transformer-training-lecture.md,
"Code Example: Softmax Forward"), generalized to any broadcastable shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MaskView"]

_MAX_LEADING = 3  # the kernels decompose a row index into at most three leading indices


@dataclass(frozen=True, kw_only=True)
class MaskView:
    """`tensor` seen as a (rows, cols) mask: the rows, in C order, are the points of a
    (rows // (size1*size2), size1, size2) grid whose three indices step `tensor` by stride0,
    stride1 and stride2 elements, and a row's columns step it by col_stride (0 where the mask
    broadcasts). `dense` materializes exactly this view (torch.as_strided)."""

    tensor: torch.Tensor
    size1: int
    size2: int
    stride0: int
    stride1: int
    stride2: int
    col_stride: int

    def __post_init__(self):
        if min(self.size1, self.size2) < 1:
            raise ValueError(f"MaskView: sizes must be >= 1, got size1={self.size1}, size2={self.size2}")

    @classmethod
    def broadcast(cls, mask: torch.Tensor) -> "MaskView":
        """View of `mask`, already expanded (stride-0 dims allowed) to the scores' shape, whose
        last dim is the softmax dim.  Adjacent leading dims are merged when one steps exactly
        over the other (always true for runs of broadcast dims); if more than three remain the
        mask is materialized once (a copy of rows x cols elements)."""
        leading = _merge_dims(mask.shape[:-1], mask.stride()[:-1])
        if len(leading) > _MAX_LEADING:
            mask = mask.contiguous()
            leading = _merge_dims(mask.shape[:-1], mask.stride()[:-1])
        leading = [(1, 0)] * (_MAX_LEADING - len(leading)) + leading
        (_, s0), (n1, s1), (n2, s2) = leading
        return cls(tensor=mask, size1=n1, size2=n2, stride0=s0, stride1=s1, stride2=s2,
                   col_stride=mask.stride(-1))

    def dense(self, rows: int, cols: int) -> torch.Tensor:
        """The (rows, cols) mask materialized (what the naive reference adds; tests use it too)."""
        n0 = rows // (self.size1 * self.size2)
        full = torch.as_strided(self.tensor, (n0, self.size1, self.size2, cols),
                                (self.stride0, self.stride1, self.stride2, self.col_stride))
        return full.reshape(rows, cols)

    def kernel_args(self) -> tuple[int, ...]:
        """(size1, size2, stride0, stride1, stride2, col_stride), the order every kernel takes."""
        return (self.size1, self.size2, self.stride0, self.stride1, self.stride2, self.col_stride)


def _merge_dims(sizes, strides) -> list[tuple[int, int]]:
    """[(size, stride)] of the leading dims with size-1 dims dropped and mergeable neighbours
    merged (outer stride == inner stride * inner size), outermost first."""
    merged: list[tuple[int, int]] = []
    for size, stride in zip(sizes, strides):
        if size == 1:
            continue
        if merged and merged[-1][1] == stride * size:
            merged[-1] = (merged[-1][0] * size, stride)
        else:
            merged.append((size, stride))
    return merged
