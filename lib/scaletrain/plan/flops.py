"""FLOPs of one training iteration of a GPT, as Narayanan et al. 2021 count them (§5.1, eq. 3).

One layer's forward on b sequences does 24·b·s·h² (the QKV, output and two MLP GEMMs) plus
4·b·s²·h (Q·Kᵀ and attention·V) FLOPs; the logit layer 2·b·s·h·V. A backward costs two forwards,
full recomputation runs the layers' forward once more. Over l layers and a batch of B:

    full recompute (4 passes):  96·B·s·l·h² · (1 + s/(6h) + V/(16·l·h))      the paper's eq. (3)
    no recompute   (3 passes):  72·B·s·l·h² · (1 + s/(6h) + V/(12·l·h))      = 6·Ψ·tokens + attention
    selective: 3 passes plus attention's s²-part once more (Korthikanti et al. 2022, §5)

The paper's "achieved teraFLOP/s per GPU" is eq. (3) over time and GPUs: it counts the recompute
(hardware FLOPs). MFU (PaLM, appendix B) counts only what the model needs, the 3-pass line,
which is `scaletrain.memory.training_flops`' 6·N·D with the attention term added.
"""

from __future__ import annotations

from scaletrain.plan.specs import RECOMPUTE, ModelSpec

__all__ = ["layer_forward_flops", "attention_core_forward_flops", "logit_forward_flops", "layer_gemms",
           "iteration_flops", "model_flops"]


def layer_forward_flops(model: ModelSpec, sequences: int) -> float:
    """One transformer layer's forward on `sequences` sequences: 24·b·s·h² + 4·b·s²·h."""
    s, h = model.seq, model.hidden
    return 24.0 * sequences * s * h * h + 4.0 * sequences * s * s * h


def attention_core_forward_flops(model: ModelSpec, sequences: int) -> float:
    """The s²-part of one layer (Q·Kᵀ and attention·V): what selective recomputation redoes."""
    return 4.0 * sequences * model.seq ** 2 * model.hidden


def logit_forward_flops(model: ModelSpec, sequences: int) -> float:
    """The output layer's forward: 2·b·s·h·V."""
    return 2.0 * sequences * model.seq * model.hidden * model.vocab


def layer_gemms(model: ModelSpec, sequences: int, tp: int) -> list[tuple[float, float, float, float]]:
    """The forward GEMMs of one layer on one of t tensor-parallel ranks, as (FLOPs, x, k, y) of
    (x × k)·(k × y), x = b·s tokens (Megatron's split, Shoeybi et al. 2019, §3): QKV (column
    split), Q·Kᵀ and attention·V per head (a/t heads, batched), the output projection (row
    split), the MLP's two GEMMs. Their FLOPs sum to layer_forward_flops / t; the backward runs
    the same shapes transposed, so the same sides."""
    b, s, h, t = sequences, model.seq, model.hidden, tp
    x, hd = b * s, h / model.heads
    return [(6.0 * x * h * h / t, x, h, 3 * h / t),
            (2.0 * x * s * h / t, s, hd, s),
            (2.0 * x * s * h / t, s, s, hd),
            (2.0 * x * h * h / t, x, h / t, h),
            (8.0 * x * h * h / t, x, h, 4 * h / t),
            (8.0 * x * h * h / t, x, 4 * h / t, h)]


def iteration_flops(model: ModelSpec, global_batch: int, *, recompute: str = "full") -> float:
    """FLOPs one iteration executes (hardware FLOPs): eq. (3) for recompute="full"."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"iteration_flops: recompute must be one of {RECOMPUTE}, got {recompute!r}")
    layer = layer_forward_flops(model, global_batch)
    extra = {"full": layer, "selective": attention_core_forward_flops(model, global_batch), "none": 0.0}[recompute]
    return model.layers * (3 * layer + extra) + 3 * logit_forward_flops(model, global_batch)


def model_flops(model: ModelSpec, global_batch: int) -> float:
    """FLOPs the model needs per iteration, whatever is recomputed (the MFU numerator)."""
    return iteration_flops(model, global_batch, recompute="none")
