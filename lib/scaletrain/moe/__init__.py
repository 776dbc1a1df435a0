"""Mixture of Experts and expert parallelism, by hand (module 10).

Seeds: "Mixture of Experts" in *Techniques for large-scale training* ("many more parameters without
increased computation cost ... different experts can be hosted on different GPUs") and the papers
it names: Shazeer et al. 2017, GShard (Lepikhin et al. 2020), Switch Transformers (Fedus et al.
2021), Expert Choice routing (Zhou et al. 2022); MegaBlocks and Megatron-Core's expert parallelism
among its frameworks; the router z-loss of ST-MoE (Zoph et al. 2022).

One idea per file, in the order a token meets them:

    router.py           top-k token choice (Switch k=1, GShard k=2), expert choice
    losses.py           load balance N·Σ fᵢ·Pᵢ (Switch §2.2), router z-loss (ST-MoE)
    capacity.py         C = ⌈k·T·cf/E⌉ slots per expert, GShard's slot order, drops counted
    dropless.py         assignments grouped by expert, dispatch and combine (MegaBlocks)
    grouped_gemm.py     the experts' GEMMs in one grouped call; the loop and padded bmm beside it
    experts.py          E FFNs with stacked weights
    layer.py            MoE = router + dispatch + experts + combine; MoEConfig
    gpt.py              the tiny GPT with an MoE layer every `every` blocks
    all_to_all.py       equal and variable all-to-all on isend/irecv, bytes in comm_counter
    expert_parallel.py  E/ep experts per rank, tokens exchanged by all-to-all
    data_parallel.py    EP × DP: dense gradients over dp, expert gradients over their replicas
    cost.py             parameters, FLOPs and bytes per token; Mixtral's arithmetic
    verify.py           the expert-parallel model against one process holding every expert
    demo.py, benchmark.py   notebook 10's measurements, `python -m scaletrain.bench moe`
"""

from scaletrain.moe.all_to_all import all_to_all, all_to_all_v, exchange_splits
from scaletrain.moe.capacity import apply_capacity, expert_capacity
from scaletrain.moe.data_parallel import sync_gradients
from scaletrain.moe.dropless import combine, dispatch, group_by_expert
from scaletrain.moe.expert_parallel import ExpertParallel, apply_expert_parallel
from scaletrain.moe.experts import Experts
from scaletrain.moe.gpt import MoEGPT
from scaletrain.moe.grouped_gemm import grouped_mm, grouped_mm_loop, grouped_mm_padded
from scaletrain.moe.layer import MoE, MoEConfig, MoEStats
from scaletrain.moe.losses import load_balancing_loss, router_z_loss
from scaletrain.moe.router import Router, expert_choice_routing, top_k_routing

__all__ = ["all_to_all", "all_to_all_v", "exchange_splits", "apply_capacity", "expert_capacity", "sync_gradients",
           "combine", "dispatch", "group_by_expert", "ExpertParallel", "apply_expert_parallel", "Experts", "MoEGPT",
           "grouped_mm", "grouped_mm_loop", "grouped_mm_padded", "MoE", "MoEConfig", "MoEStats",
           "load_balancing_loss", "router_z_loss", "Router", "expert_choice_routing", "top_k_routing"]
