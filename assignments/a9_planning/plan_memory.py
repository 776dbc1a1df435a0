# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/plan/memory.py by `python -m autograder release`; edit the source.
"""Memory of one GPU in a 3D-parallel run: model states, in-flight activations, buffers (a9 task 9.1).

With even stages the peak sits on pipeline rank 0 (the first stage): it holds the embedding and,
under 1F1B, the most microbatches whose backward has not run yet; with Megatron's uneven stages
(fewer layers on the ends) it can move to rank 1, so every rank is looked at. A rank's bytes, in
mixed precision with Adam:

  model states   Ψ_rank parameters (1/p of the layers, 1/t of each weight; the embedding V·h/t
                 split over the vocabulary) at 2 + 2 + 12 B each, sharded over the d data-parallel
                 ranks by the ZeRO stage: `scaletrain.memory.zero_memory_per_rank` (ZeRO paper §5);
  activations    (pairs in flight) × (layers per chunk) × (bytes one layer keeps for one microbatch),
                 plus, under full recomputation, one layer's full activations while it is recomputed;
  buffers        the cluster's reserved bytes, the fp32 logits when rank 0 is also the last stage
                 (p = 1), one gathered layer under ZeRO-3.

Bytes one layer keeps per microbatch of b sequences: Korthikanti et al. 2022, §4 (e = 2 bytes;
per layer without parallelism, with tensor parallelism, with sequence parallelism too) and §5
(selective recomputation, and the full recomputation it improves on, which keeps only the
layer's input); a0's `activation_bytes` is the tensor-parallel form. The seed "Techniques for
large-scale training" (memory estimation) works the example; mind its known slip (the printed
formula drops the 10·s·b·h term that its worked example keeps).

Pairs in flight on rank 0 (the seminar notes, §1.2.3.2-3; Narayanan et al. 2021, §2.2): a
(chunk, microbatch) pair is in flight between its forward and its backward. The counts are what
`scaletrain.pipeline.peak_in_flight` finds on rank 0 of the schedules themselves (1F1B and the
interleaved one, a4): derive the closed form from the schedules' warm-up.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from scaletrain.memory import zero_memory_per_rank
from scaletrain.plan.specs import ClusterSpec, Layout, ModelSpec, check_layout

__all__ = ["MemoryEstimate", "params_per_layer", "params_on_rank", "params_on_first_rank", "layer_activation_bytes",
           "in_flight_microbatches", "memory_per_gpu"]

LOGIT_BYTES = 4  # the loss softmax runs in fp32 over the rank's V/t logits


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Bytes on the peak GPU (pipeline rank 0), by what holds them."""
    params: int
    grads: int
    optimizer: int
    activations: int
    buffers: int

    @property
    def states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.states + self.activations + self.buffers


def params_per_layer(model: ModelSpec, tp: int) -> int:
    """Parameters of one layer on one tensor rank (Megatron's split, Shoeybi et al. 2019, §3): the
    QKV and first MLP GEMMs (up, and gate under SwiGLU) split by columns (weights and biases /t),
    the output projection and the MLP's down projection by rows (weights /t, biases whole), both
    norms whole. GPT-3: 12h²/t + 7h/t + 6h; at t = 1 any model's `ModelSpec.layer_params`."""
    h, f = model.hidden, model.ffn
    row_biases = 2 * h if model.biases else 0
    return (model.layer_params - row_biases - 2 * model.norm_params) // tp + row_biases + 2 * model.norm_params


def params_on_rank(model: ModelSpec, layout: Layout, rank: int = 0) -> int:
    """Ψ_rank: parameters on pipeline rank `rank`, tensor rank 0: its stage's layers; on the first
    stage the word embedding split over the vocabulary (V·h/t) and the position table (whole); on
    the last the final norm and, untied, the output head (V·h/t; tied, the head *is* the embedding,
    whose gradient Megatron sums over the first and last stage)."""
    h, t = model.hidden, layout.tp
    total = layout.stage_layers(model)[rank] * params_per_layer(model, t)
    if rank == 0:
        total += model.vocab * h // t + (model.seq * h if model.learned_positions else 0)
    if rank == layout.pp - 1:
        total += model.norm_params + (0 if model.tied_embeddings else model.vocab * h // t)
    return total


def params_on_first_rank(model: ModelSpec, layout: Layout) -> int:
    """Ψ_rank of pipeline rank 0 (`params_on_rank`)."""
    return params_on_rank(model, layout, 0)


def layer_activation_bytes(model: ModelSpec, layout: Layout) -> int:
    """Bytes one layer keeps from its forward to its backward for one microbatch of `layout`
    (module docstring: Korthikanti et al. 2022 §4-5), an int.

    Graded exactly (relative 1e-9) for every recomputation mode, with and without sequence
    parallelism, flash attention and context parallelism, at irregular t, a, s, on GPT-3- and
    Llama-style models. Start from Korthikanti's §4.1 inventory of what a layer keeps (a0's
    `scaletrain.memory.activation_bytes` is its multi-head, 4h-MLP form) and redo it tensor by
    tensor for this model: K and V are h_kv wide under grouped-query attention (`model.kv_hidden`),
    the MLP keeps what its 2 or 3 matrices need at width f (`model.ffn`; under SwiGLU the gate's
    and the up projection's outputs and their product). Then, what each option changes: tensor
    parallelism splits what lies between the column- and row-split GEMMs; sequence parallelism
    splits t ways what tensor parallelism leaves whole (norm inputs, dropout masks, the inputs of
    the first GEMMs); selective recomputation and flash attention keep nothing of the attention
    core's s² scores; full recomputation keeps only the layer's 16-bit input (split t ways under
    sequence parallelism); context parallelism gives each rank s/c of every sequence's tokens.
    Pitfall: masks are 1 byte, everything else 2.
    """
    s, b, h, a, t = model.seq, layout.microbatch, model.hidden, model.heads, layout.tp
    tokens = s * b // layout.cp  # this rank's share of the microbatch's tokens
    raise NotImplementedError('a9 task 9.1: implement `layer_activation_bytes` (see assignments/a9_planning/README.md)')


def in_flight_microbatches(*, pp: int, num_microbatches: int, interleave: int = 1, rank: int = 0) -> int:
    """Most (chunk, microbatch) pairs pipeline rank `rank` holds activations for at once (module
    docstring).

    interleave=1 is 1F1B, interleave=v > 1 the interleaved schedule (a4's `one_f_one_b`,
    `interleaved_1f1b`). Graded: equal to `scaletrain.pipeline.peak_in_flight` of the rank on the
    generated schedule, for every p, m, v and rank, including m < p (GPipe-like fill) and v·m
    below the warm-up; the warm-up depth, the caps and the ranks past 0 are separate checks. A
    closed form: no schedule is built here.
    """
    for name, value in (("pp", pp), ("num_microbatches", num_microbatches), ("interleave", interleave)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"in_flight_microbatches: {name} must be a positive int, got {value!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < pp:
        raise ValueError(f"in_flight_microbatches: rank must be an int in [0, pp={pp}), got {rank!r}")
    p, m, v, r = pp, num_microbatches, interleave, rank
    raise NotImplementedError('a9 task 9.1: implement `in_flight_microbatches` (see assignments/a9_planning/README.md)')


def memory_per_gpu(model: ModelSpec, cluster: ClusterSpec, layout: Layout, *, rank: int | None = None
                   ) -> MemoryEstimate:
    """Bytes on pipeline rank `rank` of `layout` training `model` on `cluster` (module docstring),
    each field an int, graded exactly on held-out configurations. rank=None: the fullest rank,
    which is rank 0 when the stages are even (it holds the embedding and the most pairs in
    flight); with uneven `stages` every rank is looked at.

    params, grads, optimizer   the model states of Ψ_rank = `params_on_rank` parameters in mixed
                               precision with Adam, sharded by the ZeRO stage over the d·c ranks
                               that hold the same weights (ZeRO paper §5; a0's
                               `zero_memory_per_rank`; context-parallel ranks share weights too);
    activations                every (chunk, microbatch) pair in flight on the rank keeps the
                               activations of its chunk's layers; under full recomputation, add
                               the one layer being recomputed, which holds everything
                               recompute="none" keeps for a moment;
    buffers                    the cluster's reserved bytes, plus the fp32 logits of one
                               microbatch over this rank's slice of the vocabulary and of the
                               sequence on the last stage, plus one layer's 16-bit weights
                               gathered whole under ZeRO-3 (`params_per_layer` of this t).
    Pitfall: a chunk holds the stage's layers / v (the largest chunk when they do not divide).
    """
    check_layout(model, layout)
    if rank is None:
        ranks = range(layout.pp) if layout.stages is not None else (0,)
        return max((memory_per_gpu(model, cluster, layout, rank=r) for r in ranks), key=lambda e: e.total)
    t = layout.tp
    layers_per_chunk = -(-layout.stage_layers(model)[rank] // layout.interleave)
    psi = params_on_rank(model, layout, rank)
    raise NotImplementedError('a9 task 9.1: implement `memory_per_gpu` (see assignments/a9_planning/README.md)')
