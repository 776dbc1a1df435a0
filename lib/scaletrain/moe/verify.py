"""The expert-parallel model against one process holding every expert.

Every rank of a data-parallel group runs its own micro-batch (uneven on purpose: rank r has its own
batch size and sequence length, `rank_batch`), with the experts of each MoE layer sharded over its
expert-parallel group. The reference runs, in this process and without any communication, the
whole model (all E experts) on every rank's micro-batch. What must hold, on every rank r:

  forward    logits, cross-entropy and auxiliary loss  == the reference on batch r
  backward   dense gradients                           == the reference's on batch r
             expert gradients of this rank's shard     == Σ over the ep group's batches of the
                                                          reference's, on those experts
  DP sync    every gradient                            == the mean over the dp group's batches
  bytes      comm_counter over forward + backward      == cost.ep_step_bytes, summed over the MoE
                                                          layers, from the reference's counts

Capacity drops happen per rank (each routes its own T tokens against its own C), so a reference that
runs each rank's batch alone drops exactly what the expert-parallel rank drops.
"""

from __future__ import annotations

from typing import Any

import torch

from scaletrain.comm.counter import comm_counter
from scaletrain.models import GPTConfig, make_batch
from scaletrain.moe.cost import ep_step_bytes
from scaletrain.moe.data_parallel import sync_gradients
from scaletrain.moe.expert_parallel import ExpertParallel, apply_expert_parallel
from scaletrain.moe.gpt import MoEGPT
from scaletrain.moe.layer import MoEConfig
from scaletrain.testing import rel_error

__all__ = ["rank_batch", "reference_runs", "expert_parallel_run", "compare"]


def rank_batch(cfg: GPTConfig, rank: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's micro-batch: 1 + r % 2 sequences of block_size - r tokens (at least 2): uneven T."""
    return make_batch(cfg, 1 + rank % 2, seed=seed * 1000 + rank, seq_len=max(2, cfg.block_size - rank))


def _model(cfg: GPTConfig, moe: MoEConfig, seed: int, dtype: torch.dtype) -> MoEGPT:
    return MoEGPT(cfg, moe, seed=seed).to(dtype)


def reference_runs(cfg: GPTConfig, moe: MoEConfig, ranks: list[int], *, seed: int = 0,
                   dtype: torch.dtype = torch.float64) -> dict[int, dict[str, Any]]:
    """One process, every expert: for each rank's batch, its logits, loss, auxiliary loss, gradients
    (by parameter name) and each MoE layer's rows per expert."""
    out = {}
    for r in ranks:
        model = _model(cfg, moe, seed, dtype)
        logits, loss = model(*rank_batch(cfg, r, seed=seed))
        loss.backward()
        out[r] = {"logits": logits.detach(), "loss": loss.detach(), "aux": (loss - model.last_ce).detach(),
                  "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
                  "kept": [layer.stats.kept.tolist() for layer in model.moe_layers()],
                  "dropped": sum(layer.stats.dropped for layer in model.moe_layers())}
    return out


def expert_parallel_run(cfg: GPTConfig, moe: MoEConfig, *, rank: int, ep_group: Any, dp_group: Any = None,
                        edp_group: Any = None, seed: int = 0, dtype: torch.dtype = torch.float64) -> dict[str, Any]:
    """This rank's expert-parallel step on `rank_batch(rank)`: outputs, gradients before and (with
    dp_group) after sync_gradients, the bytes comm_counter saw over forward + backward, and where
    each expert shard starts. Gradients are keyed by the reference's names (a shard's `local.` dropped).
    With `dp_group`, `edp_group` is the experts' replica group (Mesh.edp_group)."""
    model = apply_expert_parallel(_model(cfg, moe, seed, dtype), ep_group)
    with comm_counter() as counted:
        logits, loss = model(*rank_batch(cfg, rank, seed=seed))
        loss.backward()

    def grads():
        return {n.replace("experts.local.", "experts."): p.grad.clone() for n, p in model.named_parameters()}
    out = {"logits": logits.detach(), "loss": loss.detach(), "aux": (loss - model.last_ce).detach(),
           "grads": grads(), "bytes": counted.bytes_sent,
           "first": {n: m.local.first for n, m in model.named_modules() if isinstance(m, ExpertParallel)}}
    if dp_group is not None:
        sync_gradients(model, dp_group=dp_group, edp_group=edp_group)
        out["synced"] = grads()
    return out


def _shard(name: str, full: torch.Tensor, first: dict[str, int], like: torch.Tensor) -> torch.Tensor:
    """The reference's tensor `name` cut to the shard this rank holds (a non-expert tensor: whole)."""
    owner = name.rsplit(".", 1)[0]
    if owner not in first:
        return full
    return full[first[owner]:first[owner] + like.shape[0]]


def compare(run: dict[str, Any], refs: dict[int, dict[str, Any]], *, rank: int, ep_ranks: list[int],
            dp_ranks: list[int] | None = None, row_bytes: int) -> dict[str, float]:
    """Relative errors of `run` (expert_parallel_run on `rank`) against `refs` (reference_runs over
    at least the ep and dp ranks), and the bytes counted against the formula."""
    me, errors = refs[rank], {}
    for key in ("logits", "loss", "aux"):
        errors[key] = rel_error(run[key], me[key])
    first = run["first"]
    dense, expert = 0.0, 0.0
    for name, g in run["grads"].items():
        if name.rsplit(".", 1)[0] in first:  # expert shard: summed over the ep group's batches
            want = sum(_shard(name, refs[r]["grads"][name], first, g) for r in ep_ranks)
            expert = max(expert, rel_error(g, want))
        else:
            dense = max(dense, rel_error(g, me["grads"][name]))
    errors["dense grads"], errors["expert grads"] = dense, expert
    if "synced" in run:
        dp = dp_ranks or ep_ranks
        errors["synced grads"] = max(
            rel_error(g, sum(_shard(name, refs[r]["grads"][name], first, g) for r in dp) / len(dp))
            for name, g in run["synced"].items())
    layers = len(me["kept"])
    position = ep_ranks.index(rank)
    errors["bytes"] = run["bytes"]
    errors["bytes formula"] = sum(ep_step_bytes([refs[r]["kept"][layer] for r in ep_ranks], rank=position,
                                                row_bytes=row_bytes) for layer in range(layers))
    return errors
