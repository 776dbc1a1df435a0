"""What a plan is about: the model, the cluster, and the layout of one training run.

Three small keyword-only dataclasses, validated when built (STYLE.md, habit 7). Notation of
Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (§3, and the seminar notes "Large-scale DL optimizations", §1.2.5):

    l layers, h hidden size, a heads, s sequence length, V vocabulary   (ModelSpec)
    t tensor-, p pipeline-, d data-parallel degree, n = t·p·d GPUs       (Layout)
    B global batch, b microbatch, m = B / (b·d) microbatches per pipeline, v model chunks per
    pipeline rank (the interleaved schedule)

Ranks are placed the way Megatron places them: tensor-parallel ranks are neighbours (inside a
node), then data-parallel, then pipeline (outermost). Whether a group's traffic crosses a node
follows from that order (`tp_crosses_node`, `dp_crosses_node`, `pp_crosses_node`).
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.comm.cost_model import AlphaBeta
from scaletrain.memory import gpt_num_params
from scaletrain.plan.efficiency import GemmEfficiency

__all__ = ["ModelSpec", "ClusterSpec", "Layout", "RECOMPUTE", "check_layout"]

RECOMPUTE = ("full", "selective", "none")


def _positive_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A GPT: `layers` transformer layers of width `hidden` with `heads` heads, sequences of `seq`
    tokens, a vocabulary of `vocab` (tied input/output embedding, learned positions)."""
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    name: str = ""

    def __post_init__(self):
        for f in ("layers", "hidden", "heads", "seq", "vocab"):
            _positive_int("ModelSpec", f, getattr(self, f))
        if self.hidden % self.heads:
            raise ValueError(f"ModelSpec: hidden={self.hidden} must be divisible by heads={self.heads}")

    @property
    def num_params(self) -> int:
        """Ψ, counted by the course's a0 formula (12·h² + 13·h per layer, embeddings V·h + s·h)."""
        return gpt_num_params(vocab_size=self.vocab, block_size=self.seq, n_layer=self.layers,
                              hidden=self.hidden, tied_embeddings=True)


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

    def __post_init__(self):
        for f in ("tp", "pp", "dp", "microbatch", "global_batch", "interleave"):
            _positive_int("Layout", f, getattr(self, f))
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
        return self.tp * self.pp * self.dp

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
                         "" if self.recompute == "full" else f" recompute={self.recompute}"])
        return f"t={self.tp} p={self.pp} d={self.dp} b={self.microbatch}{extra}"

    def tp_crosses_node(self, cluster: ClusterSpec) -> bool:
        return self.tp > cluster.gpus_per_node

    def dp_crosses_node(self, cluster: ClusterSpec) -> bool:
        # a data-parallel group is dp ranks tp apart: it spans tp·dp consecutive ranks
        return self.dp > 1 and self.tp * self.dp > cluster.gpus_per_node

    def pp_crosses_node(self, cluster: ClusterSpec) -> bool:
        # neighbouring stages are tp·dp ranks apart
        return self.pp > 1 and self.tp * self.dp >= cluster.gpus_per_node


def check_layout(model: ModelSpec, layout: Layout, *, gpus: int | None = None) -> None:
    """ValueError, saying what to change, when `layout` cannot run `model` (on `gpus` GPUs)."""
    if gpus is not None and layout.gpus != gpus:
        raise ValueError(f"layout {layout.describe()} uses tp·pp·dp = {layout.tp}·{layout.pp}·{layout.dp} = "
                         f"{layout.gpus} GPUs, not the {gpus} asked for")
    if model.heads % layout.tp:
        raise ValueError(f"tp={layout.tp} must divide heads={model.heads}: Megatron gives each tensor-parallel "
                         f"rank whole attention heads")
    chunks = layout.pp * layout.interleave
    if model.layers % chunks:
        raise ValueError(f"layers={model.layers} must be divisible by pp·interleave = {layout.pp}·{layout.interleave} "
                         f"= {chunks}: every model chunk holds the same number of layers")
