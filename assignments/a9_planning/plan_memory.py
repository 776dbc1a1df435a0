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

Bytes one layer keeps per microbatch of b sequences (Korthikanti et al. 2022, §4, e = 2 bytes;
the seed "Techniques for large-scale training", memory estimation, with its known slip fixed):

    recompute="none"        s·b·h·(10 + 24/t + 5·a·s/(h·t))      with sequence parallelism s·b·h·(34/t + 5·a·s/(h·t))
    recompute="selective"   s·b·h·(10 + 24/t)                     with sequence parallelism s·b·h·34/t
    recompute="full"        2·s·b·h  (the layer's input)          with sequence parallelism 2·s·b·h/t

Pairs in flight on rank 0 (the seminar notes, §1.2.3.2; Narayanan et al. 2021, §2.2): a
(chunk, microbatch) pair is in flight between its forward and its backward. 1F1B keeps
min(p, m); the interleaved schedule warms up with 2(p - 1) + (v - 1)·p forwards before its first
backward, so it keeps min(2(p - 1) + (v - 1)·p + 1, v·m) chunk-sized pairs. These are the counts
`scaletrain.pipeline.peak_in_flight` finds on the schedules themselves.
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
    """Bytes one layer keeps from its forward to its backward for one microbatch (table above).

    Start from `scaletrain.memory.activation_bytes` (a0: s·b·h·(10 + 24/t + 5·a·s/(h·t)), e = 2):
    sequence parallelism splits its 10·s·b·h of LayerNorm and dropout inputs t ways too;
    selective recomputation drops the 5·a·s²·b/t of softmax and dropout; full recomputation
    keeps only the layer's input, 2·s·b·h (split t ways under sequence parallelism).
    """
    s, b, h, a, t = model.seq, layout.microbatch, model.hidden, model.heads, layout.tp
    raise NotImplementedError('a9 task 9.1: implement `layer_activation_bytes` (see assignments/a9_planning/README.md)')


def in_flight_microbatches(*, pp: int, num_microbatches: int, interleave: int = 1) -> int:
    """Most (chunk, microbatch) pairs rank 0 holds activations for at once (module docstring).

    interleave=1 is 1F1B: min(p, m). interleave=v > 1 is the interleaved schedule: its warm-up
    of 2(p - 1) + (v - 1)·p forwards plus the first steady forward, at most all v·m pairs.
    """
    for name, value in (("pp", pp), ("num_microbatches", num_microbatches), ("interleave", interleave)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"in_flight_microbatches: {name} must be a positive int, got {value!r}")
    p, m, v = pp, num_microbatches, interleave
    raise NotImplementedError('a9 task 9.1: implement `in_flight_microbatches` (see assignments/a9_planning/README.md)')


def memory_per_gpu(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> MemoryEstimate:
    """Bytes on pipeline rank 0 of `layout` training `model` on `cluster` (module docstring):

    params, grads, optimizer   `zero_memory_per_rank(Ψ_rank, dp, zero, precision="mixed",
                               optimizer="adam")` with Ψ_rank = `params_on_first_rank`;
    activations                in_flight_microbatches(p, m, v) × (l/(p·v) layers per chunk) ×
                               layer_activation_bytes(model, layout); under recompute="full" plus
                               one layer_activation_bytes of the same layout with recompute="none"
                               (the layer being recomputed, whole for a moment);
    buffers                    cluster.reserved_bytes; + 4·s·b·V/t (fp32 logits of one microbatch)
                               when p = 1; + 2·params_per_layer(model, t) (one layer's 16-bit
                               weights gathered whole) when zero = 3.
    """
    check_layout(model, layout)
    t = layout.tp
    layers_per_chunk = model.layers // (layout.pp * layout.interleave)
    psi = params_on_first_rank(model, layout)
    raise NotImplementedError('a9 task 9.1: implement `memory_per_gpu` (see assignments/a9_planning/README.md)')
