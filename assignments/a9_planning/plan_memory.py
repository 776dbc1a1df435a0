# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/plan/memory.py by `python -m autograder release`; edit the source.
"""Memory of one GPU in a 3D-parallel run: model states, in-flight activations, buffers (a9 task 9.1).

The peak sits on pipeline rank 0 (the first stage): it holds the embedding and, under 1F1B, the
most microbatches whose backward has not run yet. Its bytes, in mixed precision with Adam:

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

from scaletrain.memory import activation_bytes, zero_memory_per_rank
from scaletrain.plan.specs import ClusterSpec, Layout, ModelSpec, check_layout

__all__ = ["MemoryEstimate", "params_per_layer", "params_on_first_rank", "layer_activation_bytes",
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
    QKV and first MLP GEMMs split by columns (weights and biases /t), the output projection and
    second MLP by rows (weights /t, biases whole), both LayerNorms whole: 12h²/t + 7h/t + 6h.
    At t = 1 this is a0's 12h² + 13h."""
    h = model.hidden
    return (12 * h * h + 7 * h) // tp + 6 * h


def params_on_first_rank(model: ModelSpec, layout: Layout) -> int:
    """Ψ_rank: parameters on pipeline rank 0, tensor rank 0. The word embedding is split over the
    vocabulary (V·h/t), positions (s·h) are whole; with p = 1 the rank also holds the final
    LayerNorm (the output layer is the tied embedding)."""
    embedding = model.vocab * model.hidden // layout.tp + model.seq * model.hidden
    final_norm = 2 * model.hidden if layout.pp == 1 else 0
    return model.layers // layout.pp * params_per_layer(model, layout.tp) + embedding + final_norm


def layer_activation_bytes(model: ModelSpec, layout: Layout) -> int:
    """Bytes one layer keeps from its forward to its backward for one microbatch of `layout`
    (module docstring: Korthikanti et al. 2022 §4-5), an int.

    Graded exactly (relative 1e-9) for every recomputation mode, with and without sequence
    parallelism, at irregular t, a, s. What each option changes: sequence parallelism splits
    the activations that tensor parallelism leaves whole (LayerNorm and dropout inputs) t ways;
    selective recomputation drops what the attention core keeps (softmax and its dropout);
    full recomputation keeps only the layer's 16-bit input (split t ways under sequence
    parallelism). a0's `scaletrain.memory.activation_bytes` is the starting point.
    """
    s, b, h, a, t = model.seq, layout.microbatch, model.hidden, model.heads, layout.tp
    raise NotImplementedError('a9 task 9.1: implement `layer_activation_bytes` (see assignments/a9_planning/README.md)')


def in_flight_microbatches(*, pp: int, num_microbatches: int, interleave: int = 1) -> int:
    """Most (chunk, microbatch) pairs rank 0 holds activations for at once (module docstring).

    interleave=1 is 1F1B, interleave=v > 1 the interleaved schedule (a4's `one_f_one_b`,
    `interleaved_1f1b`). Graded: equal to `scaletrain.pipeline.peak_in_flight` of rank 0 on the
    generated schedule, for every p, m, v, including m < p (GPipe-like fill) and v·m below the
    warm-up. A closed form: no schedule is built here.
    """
    for name, value in (("pp", pp), ("num_microbatches", num_microbatches), ("interleave", interleave)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"in_flight_microbatches: {name} must be a positive int, got {value!r}")
    p, m, v = pp, num_microbatches, interleave
    raise NotImplementedError('a9 task 9.1: implement `in_flight_microbatches` (see assignments/a9_planning/README.md)')


def memory_per_gpu(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> MemoryEstimate:
    """Bytes on pipeline rank 0 of `layout` training `model` on `cluster` (module docstring),
    each field an int, graded exactly on held-out configurations:

    params, grads, optimizer   the model states of Ψ_rank = `params_on_first_rank` parameters in
                               mixed precision with Adam, sharded by the ZeRO stage over the d
                               data-parallel ranks (ZeRO paper §5; a0's `zero_memory_per_rank`);
    activations                every (chunk, microbatch) pair in flight keeps the activations of
                               its chunk's layers; under full recomputation, add the one layer
                               being recomputed, which holds everything recompute="none" keeps
                               for a moment;
    buffers                    the cluster's reserved bytes, plus the fp32 logits of one
                               microbatch over this rank's slice of the vocabulary when rank 0 is
                               also the last stage (p = 1), plus one layer's 16-bit weights
                               gathered whole under ZeRO-3 (`params_per_layer` of this t).
    Pitfall: the layers per chunk are l/(p·v), not l/p.
    """
    check_layout(model, layout)
    t = layout.tp
    layers_per_chunk = model.layers // (layout.pp * layout.interleave)
    psi = params_on_first_rank(model, layout)
    raise NotImplementedError('a9 task 9.1: implement `memory_per_gpu` (see assignments/a9_planning/README.md)')
