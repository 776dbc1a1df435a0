"""What a plan is about: the model, the cluster, and the layout of one training run.

Three small keyword-only dataclasses, validated when built (STYLE.md, habit 7). Notation of
Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (§3, and the seminar notes "Large-scale DL optimizations", §1.2.5):

    l layers, h hidden size, a heads, s sequence length, V vocabulary   (ModelSpec)
    t tensor-, c context-, p pipeline-, d data-parallel degree, n = t·c·p·d GPUs   (Layout)
    B global batch, b microbatch, m = B / (b·d) microbatches per pipeline, v model chunks per
    pipeline rank (the interleaved schedule)

Ranks are placed the way Megatron places them: tensor-parallel ranks are neighbours (inside a
node), then context-parallel, then data-parallel, then pipeline (outermost). The model's spec
lives in `model_spec.py` (GPT-3- and Llama-style). Whether a group's traffic crosses a node
follows from that order (`tp_crosses_node`, `dp_crosses_node`, `pp_crosses_node`).
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.comm.cost_model import AlphaBeta
from scaletrain.plan.efficiency import GemmEfficiency
from scaletrain.plan.model_spec import ModelSpec, positive_int as _positive_int

__all__ = ["ModelSpec", "ClusterSpec", "Layout", "RECOMPUTE", "check_layout"]

RECOMPUTE = ("full", "selective", "none")


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """One GPU type in nodes of `gpus_per_node`, per GPU:

    peak_flops      dense 16-bit tensor-core FLOP/s (the number MFU divides by)
    hbm_bytes       memory a layout must fit in
    hbm_bandwidth   B/s, which bounds the optimizer step (it reads and writes ~30 B per parameter)
    intra, inter    α–β of one GPU's link inside a node (NVLink) and between nodes (InfiniBand);
                    collectives cost what `scaletrain.comm.cost_model` says about a ring on them
    efficiency      the fraction of peak a transformer layer's GEMMs reach, by their shape
    reserved_bytes  what no formula counts: CUDA context, NCCL and cuBLAS workspaces, allocator
                    fragmentation
    """
    name: str
    gpus_per_node: int
    peak_flops: float
    hbm_bytes: int
    hbm_bandwidth: float
    intra: AlphaBeta
    inter: AlphaBeta
    efficiency: GemmEfficiency
    reserved_bytes: int = 0

    def __post_init__(self):
        _positive_int("ClusterSpec", "gpus_per_node", self.gpus_per_node)
        for f in ("peak_flops", "hbm_bytes", "hbm_bandwidth"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"ClusterSpec: {f} must be a positive number, got {v!r}")
        if self.reserved_bytes < 0 or self.reserved_bytes >= self.hbm_bytes:
            raise ValueError(f"ClusterSpec: reserved_bytes must be in [0, hbm_bytes), got {self.reserved_bytes}")


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How n = tp·pp·dp GPUs train one model (Narayanan et al. 2021, §3; PTD-P).

    microbatch b sequences go through the pipeline at a time; global_batch B sequences make one
    optimizer step, so every pipeline runs m = B / (b·dp) microbatches. interleave v > 1 gives
    each pipeline rank v model chunks (the interleaved 1F1B schedule, §2.2.2). zero is the ZeRO
    stage over the data-parallel group (0: none). recompute: "full" keeps only each layer's input
    and recomputes the layer in the backward (what the paper ran), "selective" recomputes only
    attention's softmax part (Korthikanti et al. 2022, §5), "none" keeps everything.
    sequence_parallel splits the activations outside the tensor-parallel GEMMs t ways (Korthikanti
    §4.2.2). overlap_dp hides the gradient reduction behind the last microbatch's backward
    (module 3's buckets); Megatron in 2021 reduced after the backward, i.e. overlap_dp=False.

    Added for the runs of 2022-2024 (`scaletrain.plan.software` names which generation has what):
    cp, context parallelism: each sequence split over cp ranks, K and V passed around a ring per
    layer (Liu et al. 2023, "Ring Attention"; Megatron-Core's context parallelism), hidden behind
    the attention core when overlap_cp; n = tp·cp·pp·dp. stages, the layers of each pipeline
    stage (None: l/p each); `scaletrain.plan.stages` builds Megatron's uneven splits, which give
    the first and last stage fewer layers for the embedding and the loss. flash_attention: the
    attention core never keeps its s² scores (Dao et al. 2022) and its backward recomputes Q·Kᵀ.
    overlap_pp: pipeline sends and receives run beside compute (Megatron-Core's
    overlap_p2p_comm) instead of blocking the rank.
    """
    tp: int
    pp: int
    dp: int
    microbatch: int
    global_batch: int
    interleave: int = 1
    zero: int = 0
    recompute: str = "full"
    sequence_parallel: bool = False
    overlap_dp: bool = True
    cp: int = 1
    stages: tuple[int, ...] | None = None
    flash_attention: bool = False
    overlap_pp: bool = False
    overlap_cp: bool = True

    def __post_init__(self):
        for f in ("tp", "pp", "dp", "microbatch", "global_batch", "interleave", "cp"):
            _positive_int("Layout", f, getattr(self, f))
        if self.stages is not None:
            object.__setattr__(self, "stages", tuple(self.stages))
            if len(self.stages) != self.pp or any(isinstance(k, bool) or not isinstance(k, int) or k < self.interleave
                                                  for k in self.stages):
                raise ValueError(f"Layout: stages={self.stages} must give each of the pp={self.pp} stages at least "
                                 f"interleave={self.interleave} layers")
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(f"Layout: zero must be a ZeRO stage 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"Layout: recompute must be one of {RECOMPUTE}, got {self.recompute!r}")
        if self.global_batch % (self.microbatch * self.dp):
            raise ValueError(f"Layout: global_batch={self.global_batch} is not a multiple of microbatch·dp = "
                             f"{self.microbatch}·{self.dp} = {self.microbatch * self.dp}: every data-parallel "
                             f"replica must run a whole number of microbatches")
        if self.interleave > 1 and self.pp == 1:
            raise ValueError(f"Layout: interleave={self.interleave} needs a pipeline (pp > 1); "
                             f"with pp=1 use interleave=1")
        if self.interleave > 1 and self.num_microbatches % self.pp:
            raise ValueError(f"Layout: the interleaved schedule needs m = {self.num_microbatches} microbatches to be a "
                             f"multiple of pp={self.pp} (scaletrain.pipeline.interleaved_1f1b)")

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def stage_layers(self, model: ModelSpec) -> tuple[int, ...]:
        """Layers of each pipeline stage: `stages`, or l/p each."""
        return self.stages if self.stages is not None else (model.layers // self.pp,) * self.pp

    @property
    def num_microbatches(self) -> int:
        """m = B / (b·d): microbatches each pipeline runs per iteration."""
        return self.global_batch // (self.microbatch * self.dp)

    @property
    def schedule(self) -> str:
        """The pipeline schedule, by its name in `scaletrain.pipeline.closed_form_bubble`."""
        return "interleaved" if self.interleave > 1 else "1f1b"

    def describe(self) -> str:
        extra = "".join([f" v={self.interleave}" if self.interleave > 1 else "",
                         f" zero={self.zero}" if self.zero else "", " sp" if self.sequence_parallel else "",
                         "" if self.recompute == "full" else f" recompute={self.recompute}",
                         " flash" if self.flash_attention else "",
                         "" if self.stages is None or len(set(self.stages)) == 1 else
                         f" stages={self.stages[0]},{self.stages[1]}..{self.stages[-1]}"])
        cp = f" cp={self.cp}" if self.cp > 1 else ""
        return f"t={self.tp}{cp} p={self.pp} d={self.dp} b={self.microbatch}{extra}"

    def tp_crosses_node(self, cluster: ClusterSpec) -> bool:
        return self.tp > cluster.gpus_per_node

    def cp_crosses_node(self, cluster: ClusterSpec) -> bool:
        # Megatron's order tp-cp-dp-pp: a context-parallel group spans tp·cp consecutive ranks
        return self.cp > 1 and self.tp * self.cp > cluster.gpus_per_node

    def dp_crosses_node(self, cluster: ClusterSpec) -> bool:
        # a data-parallel group is dp ranks tp·cp apart: it spans tp·cp·dp consecutive ranks
        return self.dp > 1 and self.tp * self.cp * self.dp > cluster.gpus_per_node

    def pp_crosses_node(self, cluster: ClusterSpec) -> bool:
        # neighbouring stages are tp·cp·dp ranks apart
        return self.pp > 1 and self.tp * self.cp * self.dp >= cluster.gpus_per_node


def check_layout(model: ModelSpec, layout: Layout, *, gpus: int | None = None) -> None:
    """ValueError, saying what to change, when `layout` cannot run `model` (on `gpus` GPUs)."""
    if gpus is not None and layout.gpus != gpus:
        raise ValueError(f"layout {layout.describe()} uses tp·cp·pp·dp = {layout.tp}·{layout.cp}·{layout.pp}·"
                         f"{layout.dp} = {layout.gpus} GPUs, not the {gpus} asked for")
    if model.heads % layout.tp or model.kv % layout.tp:
        raise ValueError(f"tp={layout.tp} must divide heads={model.heads} and kv_heads={model.kv}: Megatron gives "
                         f"each tensor-parallel rank whole attention heads and whole key/value groups")
    if layout.cp > 1 and model.seq % (2 * layout.cp):
        raise ValueError(f"cp={layout.cp}: seq={model.seq} must split into 2·cp chunks (Megatron balances the "
                         f"causal mask's work by giving each rank two chunks)")
    if layout.stages is not None:
        if sum(layout.stages) != model.layers:
            raise ValueError(f"stages={layout.stages} hold {sum(layout.stages)} layers, the model has {model.layers}")
        return
    chunks = layout.pp * layout.interleave
    if model.layers % chunks:
        raise ValueError(f"layers={model.layers} must be divisible by pp·interleave = {layout.pp}·{layout.interleave} "
                         f"= {chunks}: every model chunk holds the same number of layers (or give uneven `stages`)")
