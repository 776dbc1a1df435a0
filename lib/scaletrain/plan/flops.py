"""FLOPs of one training iteration, as Narayanan et al. 2021 count them (§5.1, eq. 3), for GPT-3- and
Llama-style models.

One layer's forward on b sequences multiplies every token by each of its matrices (2 FLOPs per
weight per token) and runs the attention core, Q·Kᵀ and attention·V over all s² pairs:

    2·b·s·(2h² + 2h·h_kv + k·h·f)  +  4·b·s²·h        k = 2 matrices (GPT) or 3 (SwiGLU)

For GPT-3 (h_kv = h, f = 4h, k = 2) the first term is the paper's 24·b·s·h². For Llama-style models
it is the same accounting with their matrices: Kaplan et al. 2020 (§2.1, Table 1: 2·N per token
plus 2·l·s·h for attention) and Hoffmann et al. 2022 (Chinchilla, appendix F, which counts the
key/query logits and the softmax·V the same way); grouped-query attention shrinks only the K and V
projections, SwiGLU adds the third matrix (Touvron et al. 2023 §2.2). Like Megatron, the causal
mask is not discounted. The logit layer costs 2·b·s·h·V. A backward costs two forwards, full
recomputation runs the layers' forward once more. Over l layers and a batch of B (GPT-3):

    full recompute (4 passes):  96·B·s·l·h² · (1 + s/(6h) + V/(16·l·h))      the paper's eq. (3)
    no recompute   (3 passes):  72·B·s·l·h² · (1 + s/(6h) + V/(12·l·h))      = 6·Ψ·tokens + attention
    selective: 3 passes plus attention's s²-part once more (Korthikanti et al. 2022, §5)
    flash attention: its backward recomputes Q·Kᵀ (Dao et al. 2022, §3.1): half the s²-part again

The paper's "achieved teraFLOP/s per GPU" is eq. (3) over time and GPUs: it counts the recompute
(hardware FLOPs). MFU (PaLM, appendix B) counts only what the model needs, the 3-pass line,
which is `scaletrain.memory.training_flops`' 6·N·D with the attention term added; the published
runs since 2022 quote that (Korthikanti et al. 2022 §6.3; Dubey et al. 2024 Table 4).
"""

from __future__ import annotations

from scaletrain.plan.specs import RECOMPUTE, ModelSpec

__all__ = ["layer_forward_flops", "attention_core_forward_flops", "logit_forward_flops", "layer_gemms",
           "iteration_flops", "layer_training_flops", "model_flops"]


def layer_forward_flops(model: ModelSpec, sequences: int) -> float:
    """One transformer layer's forward on `sequences` sequences (module docstring; 24·b·s·h² +
    4·b·s²·h for GPT-3)."""
    s, h = model.seq, model.hidden
    return 2.0 * sequences * s * model.layer_matrix_params + 4.0 * sequences * s * s * h


def attention_core_forward_flops(model: ModelSpec, sequences: int) -> float:
    """The s²-part of one layer (Q·Kᵀ and attention·V): what selective recomputation redoes."""
    return 4.0 * sequences * model.seq ** 2 * model.hidden


def logit_forward_flops(model: ModelSpec, sequences: int) -> float:
    """The output layer's forward: 2·b·s·h·V."""
    return 2.0 * sequences * model.seq * model.hidden * model.vocab


def layer_gemms(model: ModelSpec, sequences: int, tp: int, cp: int = 1) -> list[tuple[float, float, float, float]]:
    """The forward GEMMs of one layer on one of t·c tensor- and context-parallel ranks, as (FLOPs,
    x, k, y) of (x × k)·(k × y), x = b·s/c tokens (Megatron's split, Shoeybi et al. 2019, §3):
    QKV (column split, K and V h_kv wide), Q·Kᵀ and attention·V per head (a/t heads batched, the
    rank's s/c queries against all s keys), the output projection (row split), the MLP's up (and
    gate) and down GEMMs. Their FLOPs sum to layer_forward_flops / (t·c); the backward runs the
    same shapes transposed, so the same sides."""
    b, s, h, t, f = sequences, model.seq, model.hidden, tp, model.ffn
    x, hd, q = b * s / cp, h / model.heads, s / cp
    up = (model.mlp_matrices - 1) * f
    return [(2.0 * x * h * (h + 2 * model.kv_hidden) / t, x, h, (h + 2 * model.kv_hidden) / t),
            (2.0 * x * s * h / t, q, hd, s),
            (2.0 * x * s * h / t, q, s, hd),
            (2.0 * x * h * h / t, x, h / t, h),
            (2.0 * x * h * up / t, x, h, up / t),
            (2.0 * x * f * h / t, x, f / t, h)]


def iteration_flops(model: ModelSpec, global_batch: int, *, recompute: str = "full",
                    flash_attention: bool = False) -> float:
    """FLOPs one iteration executes (hardware FLOPs): eq. (3) for recompute="full"."""
    layer = layer_training_flops(model, global_batch, recompute=recompute, flash_attention=flash_attention)
    return model.layers * layer + 3 * logit_forward_flops(model, global_batch)


def layer_training_flops(model: ModelSpec, sequences: int, *, recompute: str = "full",
                         flash_attention: bool = False) -> float:
    """One layer's forward, backward (two forwards) and what is recomputed (module docstring)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"flops: recompute must be one of {RECOMPUTE}, got {recompute!r}")
    layer = layer_forward_flops(model, sequences)
    core = attention_core_forward_flops(model, sequences)
    extra = {"full": layer, "selective": core, "none": 0.0}[recompute]
    if flash_attention and recompute != "selective":  # selective already redoes the whole core
        extra += core / 2
    return 3 * layer + extra


def model_flops(model: ModelSpec, global_batch: int) -> float:
    """FLOPs the model needs per iteration, whatever is recomputed (the MFU numerator)."""
    return iteration_flops(model, global_batch, recompute="none")
