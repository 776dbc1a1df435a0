# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/plan/time_model.py by `python -m autograder release`; edit the source.
"""Time of one training iteration of a 3D-parallel run, term by term (a9 tasks 9.2 and 9.3).

One pipeline rank's work per (chunk, microbatch) pair, on the slowest stage (with even stages the
last one: its layers plus the logit layer; with uneven ones `slowest_stage` says; the whole
pipeline is charged at its pace, since the steady state runs at it):

  compute      FLOPs of `scaletrain.plan.flops` / (t·c), at the layer's rate (`rates.py`: its
               GEMMs on the roofline plus the element-wise kernels' HBM traffic), the logit layer
               too; forward 1 pass, backward 2, full recomputation 1 more forward;
  TP comm      per layer, an allreduce of the b·s·h 16-bit activations for each of attention and
               MLP, in the forward, the backward and the recomputed forward: 4 allreduces
               (6 with full recompute) over t ranks, ring α–β (`scaletrain.comm.cost_model`), on
               NVLink or, when t exceeds a node, InfiniBand (seminar notes §1.2.5.1, eq. 5:
               8·b·s·h·(t-1)/t bytes per layer per pass pair);
  CP ring      with c > 1 context-parallel ranks, per layer c - 1 blocks of K and V to the next
               rank, hidden behind the attention core when overlap_cp (Liu et al. 2023, §3);
  PP message   each forward sends its output and each backward its input gradient to a
               neighbour, 2·b·s·h bytes; split t ways (Megatron's scatter/gather, Narayanan et
               al. 2021, §4.1). Megatron's 2021 send/recv block the rank, so a message is part of
               the action that sends it.

Over the iteration, with m microbatches, v chunks, p stages:

  work         compute + TP comm + PP messages, summed over the rank's m·v pairs
  bubble       the idle time that makes up the fraction f = `scaletrain.pipeline.closed_form_bubble`
               (1F1B or interleaved) of the pipeline's whole time, idle included (seminar notes
               §1.2.3, eq. 1-3: the PBS measures the same idle time against the work instead)
  DP comm      gradient allreduce of the rank's 2-byte gradients over d (ZeRO 1-2: reduce-scatter
               + all-gather, the same ring volume); ZeRO-3: the 16-bit weights all-gathered for
               every forward pass and backward and the gradients reduce-scattered, per microbatch
  overlap      with overlap_dp, the reduction hides behind the last microbatch's backward (buckets,
               module 3); ZeRO-3's gathers prefetch behind all of the compute
  optimizer    Adam reads and writes ~28 B per parameter it owns, at HBM bandwidth

iteration_s = work + bubble + DP comm - overlap + optimizer. `simulate` on the schedule with the
per-pair times of `stage_times` gives the same makespan (the public test of task 9.3).
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.comm.cost_model import predict as ring_seconds
from scaletrain.pipeline import closed_form_bubble
from scaletrain.plan.flops import (attention_core_forward_flops, layer_forward_flops, layer_training_flops,
                                   logit_forward_flops)
from scaletrain.plan.rates import layer_rate
from scaletrain.plan.memory import params_on_rank
from scaletrain.plan.specs import ClusterSpec, Layout, ModelSpec, check_layout

__all__ = ["StageTimes", "TimeBreakdown", "stage_times", "time_breakdown", "slowest_stage", "cp_ring_seconds",
           "OPTIMIZER_BYTES_PER_PARAM"]

# mixed-precision Adam per parameter: read fp32 master, m, v and the 16-bit gradient (14 B), write
# master, m, v and the 16-bit weight (14 B)
OPTIMIZER_BYTES_PER_PARAM = 28
ACT_BYTES = 2  # 16-bit activations and gradients on the wire


@dataclass(frozen=True, kw_only=True)
class StageTimes:
    """Seconds one (chunk, microbatch) pair costs the slowest pipeline rank."""
    forward_s: float      # forward compute (1 pass)
    backward_s: float     # backward compute (2 passes) plus the recomputed forward
    tp_forward_s: float   # tensor-parallel allreduces inside the forward
    tp_backward_s: float  # ... inside the backward and the recomputation
    message_s: float      # one pipeline message (0 without a pipeline, or hidden by overlap_pp)
    cp_forward_s: float = 0.0   # the context-parallel ring's exposed time in the forward
    cp_backward_s: float = 0.0  # ... in the backward and the recomputation

    @property
    def forward_action_s(self) -> float:
        """An F action as the simulator sees it: compute, its collectives, its send."""
        return self.forward_s + self.tp_forward_s + self.cp_forward_s + self.message_s

    @property
    def backward_action_s(self) -> float:
        return self.backward_s + self.tp_backward_s + self.cp_backward_s + self.message_s


@dataclass(frozen=True, kw_only=True)
class TimeBreakdown:
    """Seconds of one iteration, by what the slowest pipeline rank spends them on."""
    compute_s: float
    tp_comm_s: float
    pp_comm_s: float
    bubble_s: float
    dp_comm_s: float      # the whole reduction (or ZeRO-3's gathers)
    dp_overlap_s: float   # the part of it hidden behind compute
    optimizer_s: float
    cp_comm_s: float = 0.0  # the context-parallel rings' exposed time

    @property
    def iteration_s(self) -> float:
        return (self.compute_s + self.tp_comm_s + self.cp_comm_s + self.pp_comm_s + self.bubble_s
                + self.dp_comm_s - self.dp_overlap_s + self.optimizer_s)


def _link(cluster: ClusterSpec, crosses_node: bool):
    return cluster.inter if crosses_node else cluster.intra


def slowest_stage(model: ModelSpec, layout: Layout) -> tuple[int, bool]:
    """(layers, holds the logit layer) of the pipeline stage with the most work per microbatch:
    its layers' forward, backward and recomputation (`layer_training_flops`) and, on the last
    stage, the logit layer's forward and backward (never recomputed). With even stages the last
    one; with Megatron's uneven splits (`scaletrain.plan.stages`) whichever of a full middle stage
    and the lighter last stage plus the logit layer weighs more."""
    stages = layout.stage_layers(model)
    head = 3 * logit_forward_flops(model, 1) / layer_training_flops(
        model, 1, recompute=layout.recompute, flash_attention=layout.flash_attention)
    work = [k + (head if i == len(stages) - 1 else 0.0) for i, k in enumerate(stages)]
    i = max(range(len(stages)), key=lambda j: (work[j], j))
    return stages[i], i == len(stages) - 1


def cp_ring_seconds(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> float:
    """One layer's forward ring of keys and values over c context-parallel ranks (Liu et al. 2023,
    "Ring Attention", §3): c - 1 steps, each sending this rank's K and V blocks (b·(s/c)·h_kv/t
    16-bit values each) to its neighbour; 0 when c = 1. The backward passes K, V and their
    gradients: twice this."""
    if layout.cp == 1:
        return 0.0
    link = _link(cluster, layout.cp_crosses_node(cluster))
    block = ACT_BYTES * 2 * layout.microbatch * model.seq // layout.cp * model.kv_hidden / layout.tp
    return (layout.cp - 1) * (link.alpha_s + block * link.beta_s_per_byte)


def stage_times(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> StageTimes:
    """Per-pair seconds of the slowest stage (module docstring; `slowest_stage` says which): its
    layers spread evenly over the rank's v chunks and, when it is the last stage, the logit layer,
    whose one pass per microbatch is spread the same way. FLOPs come from `flops.py`
    (`layer_forward_flops`, `logit_forward_flops`, `attention_core_forward_flops`: Narayanan et
    al. 2021 §5.1, eq. 3), split over the t·c tensor- and context-parallel ranks and run at
    `rate` (given below). Graded against the reference to 1e-6 on held-out configurations:

        forward_s      one forward pass of the stage's share
        backward_s     its backward (twice a forward's FLOPs) plus what recomputation runs again:
                       the layers' whole forward (full), their attention cores (selective,
                       Korthikanti et al. 2022 §5), nothing (none); flash attention's backward
                       redoes Q·Kᵀ unless selective already redid the core; the logit layer is
                       never recomputed
        tp_forward_s   the forward's allreduces of the layer's 16-bit activations (this rank's
                       b·s/c tokens), one after the attention and one after the MLP of every
                       layer (Shoeybi et al. 2019 §3, the g operator), each a ring allreduce
                       (`ring_seconds`) on the inter-node link when layout.tp_crosses_node(cluster),
                       else intra; 0 if t = 1
        tp_backward_s  the backward's allreduces (the f operator), and the recomputed forward's
                       again under full recomputation
        cp_forward_s   per layer, `cp_ring_seconds`, less the attention core's forward compute it
                       hides behind when layout.overlap_cp (never below 0)
        cp_backward_s  the same for the backward's ring (twice the bytes, behind twice the
                       core's compute), plus the forward's again under full recomputation
        message_s      one α-β message of the stage's 16-bit output on the pipeline link
                       (inter-node when layout.pp_crosses_node(cluster)), scattered t ways
                       (Narayanan et al. 2021 §4.1); 0 without a pipeline (p = 1) or when
                       layout.overlap_pp runs it beside compute
    """
    check_layout(model, layout)
    b, s, h, t, c = layout.microbatch, model.seq, model.hidden, layout.tp, layout.cp
    stage, holds_logits = slowest_stage(model, layout)
    layers = stage / layout.interleave  # per chunk, on average
    rate = layer_rate(model, cluster, layout)  # FLOP/s of this rank's layers: GEMMs and element-wise traffic
    ring = cp_ring_seconds(model, cluster, layout)
    raise NotImplementedError('a9 task 9.2: implement `stage_times` (see assignments/a9_planning/README.md)')


def time_breakdown(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> TimeBreakdown:
    """Seconds of one iteration of `layout` (module docstring), from `stage_times` and the m·v
    (chunk, microbatch) pairs of the slowest rank. Graded against the reference to 1e-6 on
    held-out configurations, with the reference's stage times in place of yours, and its
    pipeline part against `simulate` on the schedule:

        compute_s, tp_comm_s, cp_comm_s   the pairs' compute, tensor- and context-parallel time
        pp_comm_s      the pairs' pipeline messages: one in each forward and one in each backward
        bubble_s       the idle time of the pipeline (module docstring), from
                       closed_form_bubble(layout.schedule, p, m, v) and the work; 0 when p = 1
        dp_comm_s      the gradient traffic over the d·c ranks that hold the same weights, ring
                       α-β (`ring_seconds`) on `dp_link`, of the fullest rank's Ψ_rank 16-bit
                       gradients: one allreduce (ZeRO 1-2 move the same ring volume); under ZeRO-3,
                       per microbatch, the weights all-gathered for every forward pass
                       (recomputation included) and for the backward, and the gradients
                       reduce-scattered, each collective costing half an allreduce (ZeRO paper
                       §7.2); 0 when d·c = 1
        dp_overlap_s   the part hidden behind compute, only with overlap_dp and never more than
                       the traffic: ZeRO-3's gathers hide behind all the compute, the other stages'
                       reduction behind the last microbatch's backward on each of the rank's chunks
        optimizer_s    Adam's memory traffic, OPTIMIZER_BYTES_PER_PARAM per parameter the rank
                       updates (its share of the d·c shards, rounded up, under ZeRO >= 1), at the
                       cluster's HBM bandwidth
    """
    st = stage_times(model, cluster, layout)
    p, m, v, d = layout.pp, layout.num_microbatches, layout.interleave, layout.dp * layout.cp
    pairs = m * v
    psi = max(params_on_rank(model, layout, r) for r in range(p))
    dp_link = _link(cluster, d > 1 and layout.tp * d > cluster.gpus_per_node)
    raise NotImplementedError('a9 task 9.3: implement `time_breakdown` (see assignments/a9_planning/README.md)')
