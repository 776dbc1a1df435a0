"""Checkpoints that do not depend on the world size: gather everything whole, re-shard on load.

A sharded run's state is scattered: rank r holds elements [r·m, (r+1)·m) of every flat unit's
parameters (stage 3) and optimizer state (stages 1-3), padding included. `full_state_dict`
all-gathers each flat buffer, cuts the padding off and hands back, on dp rank 0, what a single
process would have saved:

    {"model":     model.state_dict() with full tensors (frozen parameters and buffers too),
     "optimizer": {"state": {param name: {"exp_avg": tensor shaped like the param, "step": ...}},
                   "param_groups": [{"lr": ..., ..., "params": [param names]}]},
     "zero":      {"stage": s, "world_size": N}}

Keys are parameter *names*, not positions in a flat buffer, so `load_full_state_dict` can pack
them into a different layout: another N (other padding, other shard bounds), another stage, or
a plain model (`model.load_state_dict(ckpt["model"])`). Like FSDP's full state dict, this costs
one all-gather per unit and state tensor; sharded checkpoints (each rank saves its shard) avoid
it but only reload at the same N.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from scaletrain.comm.ring import ring_all_gather
from scaletrain.zero.layout import FlatUnit

if TYPE_CHECKING:
    from scaletrain.zero.engine import ZeRO

__all__ = ["full_state_dict", "load_full_state_dict"]


def _whole(engine: "ZeRO", unit: FlatUnit, local: torch.Tensor) -> torch.Tensor:
    """(N·m,) buffer from every rank's `local` (m elements); stage 0 holds it whole already."""
    if local.numel() == unit.padded_numel:
        return local.detach()
    return ring_all_gather(local.detach(), unit.padded_numel, engine.group)


@torch.no_grad()
def full_state_dict(engine: "ZeRO") -> dict | None:
    """Collective: every rank must call it. Returns the checkpoint on dp rank 0, None elsewhere."""
    values: dict[str, torch.Tensor] = {}
    opt_state: dict[str, dict[str, Any]] = {}
    for unit in engine.units:
        full = unit.full if engine.stage < 3 else _whole(engine, unit, unit.shard)
        for name, view in zip(unit.names, unit.views(full)):
            values[name] = view.clone()
            opt_state[name] = {}
        state = engine.optimizer.state.get(unit.shard, {})
        for key in sorted(state):  # same keys in the same order on every rank
            v = state[key]
            if isinstance(v, torch.Tensor) and v.shape == unit.shard.shape:
                for name, view in zip(unit.names, unit.views(_whole(engine, unit, v))):
                    opt_state[name][key] = view.clone()
            else:
                for name in unit.names:
                    opt_state[name][key] = v.clone() if isinstance(v, torch.Tensor) else v
    if engine.dp_rank != 0:
        return None
    names = _names_by_id(engine)
    model = {key: values[names[id(t)]] if id(t) in names else t.detach().clone()
             for key, t in engine.model.state_dict(keep_vars=True).items()}
    groups = [{**{k: v for k, v in g.items() if k != "params"},
               "params": [n for u in engine.units if u.group_index == i for n in u.names]}
              for i, g in enumerate(engine.optimizer.param_groups)]
    return {"model": model, "optimizer": {"state": opt_state, "param_groups": groups},
            "zero": {"stage": engine.stage, "world_size": engine.dp_world_size}}


@torch.no_grad()
def load_full_state_dict(engine: "ZeRO", checkpoint: dict) -> None:
    """Load a `full_state_dict` checkpoint (saved at any world size and stage) on every rank.

    Each rank needs the whole checkpoint (e.g. `torch.load` of rank 0's file); nothing is sent.
    """
    for key in ("model", "optimizer"):
        if key not in checkpoint:
            raise KeyError(f"ZeRO.load_state_dict: checkpoint has no {key!r} entry; pass what "
                           "ZeRO.state_dict() returned on rank 0")
    model_sd, opt_sd = checkpoint["model"], checkpoint["optimizer"]
    names = _names_by_id(engine)
    own = engine.model.state_dict(keep_vars=True)
    missing = sorted(set(own) - set(model_sd))
    if missing:
        raise KeyError(f"ZeRO.load_state_dict: checkpoint lacks {missing[:5]}; was it saved from this model?")
    for key, t in own.items():
        if id(t) not in names:  # frozen parameters and buffers: whole on every rank
            t.data.copy_(model_sd[key])
    if len(opt_sd["param_groups"]) != len(engine.optimizer.param_groups):
        raise ValueError(f"ZeRO.load_state_dict: checkpoint has {len(opt_sd['param_groups'])} param "
                         f"groups, this optimizer {len(engine.optimizer.param_groups)}")
    index = {id(p): i for i, p in enumerate(p for g in engine.optimizer.param_groups for p in g["params"])}
    state: dict[int, dict[str, Any]] = {}
    for unit in engine.units:
        _local(engine, unit, [model_sd[n] for n in unit.names], unit.shard.data)
        saved = opt_sd["state"].get(unit.names[0], {})
        entry = {}
        for key, v in saved.items():
            if isinstance(v, torch.Tensor) and v.shape == unit.params[0].shape and v.dim() > 0:
                entry[key] = _local(engine, unit, [opt_sd["state"][n][key] for n in unit.names])
            else:
                entry[key] = v
        if entry:
            state[index[id(unit.shard)]] = entry
    groups = [{**{k: v for k, v in saved.items() if k != "params"}, "params": [index[id(p)] for p in g["params"]]}
              for saved, g in zip(opt_sd["param_groups"], engine.optimizer.param_groups)]
    engine.optimizer.load_state_dict({"state": state, "param_groups": groups})


def _local(engine: "ZeRO", unit: FlatUnit, tensors: list[torch.Tensor],
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Pack per-parameter tensors into the unit's padded layout and keep this rank's part."""
    flat = unit.full.new_zeros(unit.padded_numel)
    for view, t in zip(unit.views(flat), tensors):
        view.copy_(t.reshape(view.shape))
    if engine.stage == 0:
        part = flat
    else:
        m = unit.shard_numel
        part = flat[engine.dp_rank * m:(engine.dp_rank + 1) * m]
    if out is None:
        return part.clone()
    if engine.stage in (1, 2):  # the shard views `full`, and the other ranks' parts are known here
        unit.full.copy_(flat)
    else:
        out.copy_(part)
    return out


def _names_by_id(engine: "ZeRO") -> dict[int, str]:
    return {id(p): n for u in engine.units for n, p in zip(u.names, u.params)}
