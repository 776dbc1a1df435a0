"""Checkpoints that do not depend on the world size: gather everything whole, re-shard on load.

A sharded run's state is scattered: rank r holds elements [r·m, (r+1)·m) of every flat unit's
parameters (stage 3) and optimizer state (stages 1-3), padding included. Gathering each flat
buffer and cutting the padding off gives what a single process would have saved, keyed by
parameter *name* (`named_optimizer_state`):

    {"state":        {param name: {"exp_avg": tensor shaped like the param, "step": ...}},
     "param_groups": [{"lr": ..., ..., "params": [param names]}]}

`full_state_dict` adds the model, on dp rank 0:

    {"model": model.state_dict() with full tensors (frozen parameters and buffers too),
     "optimizer": the named optimizer state, "zero": {"stage": s, "world_size": N}}

and `indexed` / `by_name` translate the optimizer part to and from torch's own `state_dict` shape,
parameters numbered across the groups. Names, not positions in a flat buffer, let the loaders
pack the tensors into another layout: another N (other padding, other shard bounds), another
stage, or a plain model (`model.load_state_dict(ckpt["model"])`) and a plain optimizer. Like
FSDP's full state dict, this costs one all-gather per unit and state tensor; sharded checkpoints
(each rank saves its shard) avoid it but only reload at the same N.

Every function takes what it reads: the flat units, the wrapped optimizer (over the units'
shards), the stage, the process group and the names, never the engine.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from scaletrain.comm.ring import ring_all_gather
from scaletrain.zero.layout import FlatUnit
from scaletrain.zero.stages import stage_facts

__all__ = ["named_optimizer_state", "load_optimizer_state", "indexed", "by_name", "full_state_dict",
           "load_full_state_dict"]

Units = Sequence[FlatUnit]


def _whole(unit: FlatUnit, local: torch.Tensor, group: Any) -> torch.Tensor:
    """(N·m,) buffer from every rank's `local` (m elements); a whole one (stage 0, N = 1) as it is."""
    if local.numel() == unit.padded_numel:
        return local.detach()
    return ring_all_gather(local.detach(), unit.padded_numel, group)


def _options(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


@torch.no_grad()
def named_optimizer_state(units: Units, optimizer: torch.optim.Optimizer, group: Any,
                          group_names: Sequence[Sequence[str]]) -> dict:
    """Collective: every rank must call it, and every rank gets the whole state by name.
    `group_names[i]`: the names of the parameters of `optimizer.param_groups[i]`'s group as the
    user gave it (frozen ones too), which the saved groups list."""
    state: dict[str, dict[str, Any]] = {}
    for unit in units:
        unit_state = optimizer.state.get(unit.shard, {})
        for name in unit.names:
            state[name] = {}
        for key in sorted(unit_state):  # same keys in the same order on every rank
            v = unit_state[key]
            if isinstance(v, torch.Tensor) and v.shape == unit.shard.shape:
                for name, view in zip(unit.names, unit.views(_whole(unit, v, group))):
                    state[name][key] = view.clone()
            else:
                for name in unit.names:
                    state[name][key] = v.clone() if isinstance(v, torch.Tensor) else v
    groups = [{**_options(g), "params": list(names)} for g, names in zip(optimizer.param_groups, group_names)]
    return {"state": state, "param_groups": groups}


@torch.no_grad()
def load_optimizer_state(units: Units, optimizer: torch.optim.Optimizer, stage: int, named: dict) -> None:
    """Re-shard a `named_optimizer_state` (saved at any world size and stage) into `optimizer`."""
    if len(named["param_groups"]) != len(optimizer.param_groups):
        raise ValueError(f"ZeRO.load_state_dict: checkpoint has {len(named['param_groups'])} param "
                         f"groups, this optimizer {len(optimizer.param_groups)}")
    index = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    state: dict[int, dict[str, Any]] = {}
    for unit in units:
        saved = named["state"].get(unit.names[0], {})
        entry = {}
        for key, v in saved.items():
            if isinstance(v, torch.Tensor) and v.shape == unit.params[0].shape and v.dim() > 0:
                entry[key] = _local(unit, stage, [named["state"][n][key] for n in unit.names])
            else:  # a scalar (Adam's step): each shard its own copy, stepped in place
                entry[key] = v.clone() if isinstance(v, torch.Tensor) else v
        if entry:
            state[index[id(unit.shard)]] = entry
    groups = [{**_options(saved), "params": [index[id(p)] for p in g["params"]]}
              for saved, g in zip(named["param_groups"], optimizer.param_groups)]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def indexed(named: dict) -> dict:
    """torch's `Optimizer.state_dict` shape of a named optimizer state: parameters numbered in
    the order of the groups, parameters without state left out."""
    index = {n: i for i, n in enumerate(n for g in named["param_groups"] for n in g["params"])}
    return {"state": {index[n]: s for n, s in sorted(named["state"].items(), key=lambda item: index[item[0]]) if s},
            "param_groups": [{**_options(g), "params": [index[n] for n in g["params"]]}
                             for g in named["param_groups"]]}


def by_name(state_dict: dict, group_names: Sequence[Sequence[str]]) -> dict:
    """The named optimizer state of torch's `state_dict` shape, for an optimizer whose groups hold
    the parameters called `group_names` (torch's checks: as many groups, each as long)."""
    groups = state_dict["param_groups"]
    if len(groups) != len(group_names) or any(len(g["params"]) != len(n) for g, n in zip(groups, group_names)):
        raise ValueError("ZeRO.load_state_dict: the state dict's param groups do not match this optimizer's "
                         f"(sizes {[len(g['params']) for g in groups]}, expected {[len(n) for n in group_names]})")
    names = {i: n for g, ns in zip(groups, group_names) for i, n in zip(g["params"], ns)}
    return {"state": {names[i]: s for i, s in state_dict["state"].items()},
            "param_groups": [{**_options(g), "params": list(ns)} for g, ns in zip(groups, group_names)]}


@torch.no_grad()
def full_state_dict(units: Units, optimizer: torch.optim.Optimizer, stage: int, group: Any, *,
                    group_names: Sequence[Sequence[str]], tensors: dict[str, torch.Tensor]) -> dict | None:
    """Collective. The checkpoint on dp rank 0, None elsewhere. `tensors`: what the model part
    holds (`model.state_dict(keep_vars=True)`, or the parameters by name without a model)."""
    values = {}
    for unit in units:
        full = _whole(unit, unit.shard, group) if stage_facts(stage).parameters else unit.full
        values.update({name: view.clone() for name, view in zip(unit.names, unit.views(full))})
    optimizer_state = named_optimizer_state(units, optimizer, group, group_names)
    if units[0].dp_rank != 0:
        return None
    names = _names_by_id(units)
    model = {key: values[names[id(t)]] if id(t) in names else t.detach().clone() for key, t in tensors.items()}
    return {"model": model, "optimizer": optimizer_state,
            "zero": {"stage": stage, "world_size": units[0].dp_world_size}}


@torch.no_grad()
def load_full_state_dict(units: Units, optimizer: torch.optim.Optimizer, stage: int,
                         tensors: dict[str, torch.Tensor], checkpoint: dict) -> None:
    """Load a `full_state_dict` checkpoint (saved at any world size and stage) on every rank.

    Each rank needs the whole checkpoint (e.g. `torch.load` of rank 0's file); nothing is sent.
    """
    for key in ("model", "optimizer"):
        if key not in checkpoint:
            raise KeyError(f"ZeRO.load_full_state_dict: checkpoint has no {key!r} entry; pass what "
                           "ZeRO.full_state_dict() returned on rank 0")
    model_sd = checkpoint["model"]
    missing = sorted(set(tensors) - set(model_sd))
    if missing:
        raise KeyError(f"ZeRO.load_full_state_dict: checkpoint lacks {missing[:5]}; was it saved from this model?")
    names = _names_by_id(units)
    for key, t in tensors.items():
        if id(t) not in names:  # frozen parameters and buffers: whole on every rank
            t.data.copy_(model_sd[key])
    for unit in units:
        _local(unit, stage, [model_sd[n] for n in unit.names], unit.shard.data)
    load_optimizer_state(units, optimizer, stage, checkpoint["optimizer"])


def _local(unit: FlatUnit, stage: int, tensors: list[torch.Tensor],
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Pack per-parameter tensors into the unit's padded layout and keep this rank's part."""
    facts = stage_facts(stage)
    flat = unit.full.new_zeros(unit.padded_numel)
    for view, t in zip(unit.views(flat), tensors):
        view.copy_(t.reshape(view.shape))
    m = unit.shard_numel
    part = flat[unit.dp_rank * m:(unit.dp_rank + 1) * m] if facts.optimizer_state else flat
    if out is None:
        return part.clone()
    if not facts.parameters:  # the shard views `full` (all of it at stage 0): every rank's part is here
        unit.full.copy_(flat)
    else:
        out.copy_(part)
    return out


def _names_by_id(units: Units) -> dict[int, str]:
    return {id(p): n for u in units for n, p in zip(u.names, u.params)}
