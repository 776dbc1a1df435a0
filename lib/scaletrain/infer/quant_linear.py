"""Real weight-only quantization: int8 codes stored, the scales applied to the matmul's partial sums.

Fake quantization (quant.fake_quant) keeps a float weight that happens to lie on the grid; here the
layer holds only the codes q (int8; int4 codes one per byte, `packed_bytes` counts them two per
byte) and per-group (S, Z). With groups of g columns inside a row, S and Z are constant over each
group, so the dequantization moves out of the inner sum (seminar §2.1, "real quantization" vs
simulated; HAWQ-V3's integer-only inference goes further and quantizes x too):

    y_o = Σ_j S_oj · Σ_{c in group j} x_c · (q_oc - Z_oj)          (+ bias)

a batched matmul over the column groups, each partial sum scaled in the epilogue: the dequantized
W = (q - Z)·S is never formed (the codes are widened to x's dtype for torch's matmul; an int8 GEMM
or a fused kernel on a GPU reads them as int8).
Groups spanning m whole rows (Q-BERT's row groups, per-channel, per-tensor) are the case of one
column group with each row's (S, Z) repeated from its group.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from scaletrain.infer.quant import QuantSpec, fake_quant, quantize

__all__ = ["QuantLinear", "quantize_model", "packed_bytes", "LINEAR_NAMES"]

LINEAR_NAMES = ("attn.qkv", "attn.proj", "mlp.0", "mlp.2")  # every Linear of a GPT block


class QuantLinear(nn.Module):
    """A Linear whose weight is int8 codes with per-group scale and zero point."""

    def __init__(self, linear: nn.Linear, spec: QuantSpec):
        super().__init__()
        qt = quantize(linear.weight, spec)
        out_f, in_f = linear.weight.shape
        cols = min(qt.group_size, in_f)  # columns per group inside a row
        per_row = max(qt.group_size // in_f, 1)  # rows per group when a group spans rows
        shape = (out_f, in_f // cols)
        self.register_buffer("q", qt.q)
        self.register_buffer("scale", qt.scale.repeat_interleave(per_row).reshape(shape))
        self.register_buffer("zero", qt.zero.repeat_interleave(per_row).reshape(shape))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())
        self.cols, self.spec, self.quantized = cols, spec, qt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_f, n_groups = self.scale.shape
        xg = x.reshape(*x.shape[:-1], n_groups, self.cols)
        codes = self.q.reshape(out_f, n_groups, self.cols).to(x.dtype) - self.zero[..., None].to(x.dtype)
        partial = torch.einsum("...jc,ojc->...oj", xg, codes)  # Σ over each group's columns
        y = (partial * self.scale.to(x.dtype)).sum(-1)
        return y if self.bias is None else y + self.bias

    @property
    def nbytes(self) -> int:
        """Bytes held: the int8 codes, the per-group scales and zero points (as stored), the bias."""
        bias = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        return sum(t.numel() * t.element_size() for t in (self.q, self.quantized.scale, self.quantized.zero)) + bias


def packed_bytes(numel: int, groups: int, *, bits: int, symmetric: bool, scale_bytes: int = 2) -> int:
    """Weight bytes with codes packed at `bits` per element, an fp16 scale per group and, when
    asymmetric, a `bits`-wide zero point per group."""
    return -(-numel * bits // 8) + groups * scale_bytes + (0 if symmetric else -(-groups * bits // 8))


def _blocks_linears(model):
    for block in model.blocks:
        for name in LINEAR_NAMES:
            parent, _, leaf = name.rpartition(".")
            yield block.get_submodule(parent), leaf


def quantize_model(model: nn.Module, spec: QuantSpec, *, real: bool = True) -> nn.Module:
    """A copy of a scaletrain GPT whose blocks' Linears are quantized: QuantLinear (real) or their
    weights replaced by fake_quant's (fake). The tied embedding / lm_head stays in float (Q-BERT
    finds the embeddings among the most sensitive parts)."""
    model = copy.deepcopy(model)
    for parent, leaf in _blocks_linears(model):
        linear = getattr(parent, leaf)
        if real:
            setattr(parent, leaf, QuantLinear(linear, spec))
        else:
            with torch.no_grad():
                linear.weight.copy_(fake_quant(linear.weight, spec))
    return model
