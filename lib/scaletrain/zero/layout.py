"""Flat buffers: which parameters ZeRO packs together, and where each element of a shard lives.

ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", §5; seminar notes "Efficient memory management: ZeRO papers") partitions the model
states of data parallelism across the N ranks. Partitioning a list of oddly shaped tensors is
awkward, so every implementation first *flattens* them: the parameters of one unit are copied
end to end into one 1-D buffer of n elements, padded with zeros to N·m, m = ⌈n/N⌉, and rank r
owns elements [r·m, (r+1)·m) — the layout of `scaletrain.comm.ring_reduce_scatter`:

    unit of 3 tensors, n = 10, N = 4, m = 3     a a a a | b b b b | c c | 0 0     (12 elements)
                                                 rank 0: a a a   rank 1: a b b   rank 2: b b c
                                                 rank 3: c 0 0   (the padding sits at the end)

A `FlatUnit` owns that buffer (`full`), the model's parameters as views into it (so an all-gather
into `full` *is* the parameter update), and this rank's shard (`shard`, the tensor the optimizer
steps). Which parameters share a unit:
  * stages 0-2: buckets of at most `bucket_cap_mb`, last parameter first, as DDP does
    (`scaletrain.dp.bucket.assign_buckets`): backward produces them in roughly that order, so
    stage 2 can reduce-scatter a bucket as soon as its gradients are complete;
  * stage 3: one unit per *module unit* (a transformer block, an embedding...), because a layer's
    parameters are gathered just before that layer runs (FSDP's "wrapping", seminar notes §1.2.6).
Each unit also belongs to one optimizer parameter group (a flat shard can only have one lr).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch
import torch.nn as nn

from scaletrain.comm.ring import shard_numel
from scaletrain.dp.bucket import assign_buckets

__all__ = ["FlatUnit", "ParamGroup", "resolve_param_groups", "named_groups", "torch_param_groups", "bucket_units",
           "module_units", "default_unit_modules", "pad_range"]


@dataclass(kw_only=True, eq=False)
class FlatUnit:
    """One padded flat buffer of parameters and this rank's shard of it.

    names, params: the parameters packed here, in buffer order (each `p.data` is a view of `full`).
    offsets:       where each parameter starts in `full`.
    numel:         n, real elements; `padded_numel` = N·m and `shard_numel` = m.
    full:          (N·m,) the whole buffer. Stage 3 keeps its storage resized to 0 bytes except
                   while the unit is gathered, so the views stay valid objects without memory.
    shard:         (m,) nn.Parameter the optimizer updates. Stages 0-2: a view of `full`
                   (stage 0: all of it); stage 3: its own storage.
    flat_grad:     (N·m,) stages 0-1 only: every `p.grad` is a view of it, like DDP's
                   `gradient_as_bucket_view`, so a reduce-scatter reads it without a copy.
    module:        stage 3: the module whose hooks gather and free this unit.
    pending:       gradients still expected in the current backward (stages 2-3).
    gathered:      stage 3: `full` currently holds the parameters.
    """
    names: tuple[str, ...]
    params: tuple[nn.Parameter, ...]
    offsets: tuple[int, ...]
    group_index: int
    dp_rank: int
    dp_world_size: int
    full: torch.Tensor
    shard: nn.Parameter | None = None
    flat_grad: torch.Tensor | None = None
    module: nn.Module | None = None
    pending: int = 0
    gathered: bool = True
    _numel: int = field(default=0, repr=False)

    def __post_init__(self):
        if not self.params or not len(self.names) == len(self.params) == len(self.offsets):
            raise ValueError("FlatUnit: needs one name and one offset per parameter, and at least one")
        if not 0 <= self.dp_rank < self.dp_world_size:
            raise ValueError(f"FlatUnit: dp_rank {self.dp_rank} outside 0..{self.dp_world_size - 1}")
        self._numel = sum(p.numel() for p in self.params)
        if self.full.numel() != self.padded_numel:
            raise ValueError(f"FlatUnit: full has {self.full.numel()} elements, expected {self.padded_numel}")

    @property
    def numel(self) -> int:
        return self._numel

    @property
    def shard_numel(self) -> int:
        return shard_numel(self._numel, self.dp_world_size)

    @property
    def padded_numel(self) -> int:
        return self.shard_numel * self.dp_world_size

    @classmethod
    def pack(cls, named: Sequence[tuple[str, nn.Parameter]], *, group_index: int, dp_rank: int,
             dp_world_size: int) -> "FlatUnit":
        """Copy the parameters into a new zero-padded buffer and make each `p.data` a view of it."""
        params = [p for _, p in named]
        if len({p.dtype for p in params}) > 1 or len({p.device for p in params}) > 1:
            raise ValueError(f"FlatUnit: parameters {[n for n, _ in named]} mix dtypes or devices; "
                             "one flat buffer has one dtype: cast the model first (model.float())")
        offsets, total = [], 0
        for p in params:
            offsets.append(total)
            total += p.numel()
        m = shard_numel(total, dp_world_size)
        full = params[0].new_zeros(m * dp_world_size)
        with torch.no_grad():
            for p, off in zip(params, offsets):
                full[off:off + p.numel()].copy_(p.detach().reshape(-1))
                p.data = full[off:off + p.numel()].view(p.shape)  # the old storage is released
        return cls(names=tuple(n for n, _ in named), params=tuple(params), offsets=tuple(offsets),
                   group_index=group_index, dp_rank=dp_rank, dp_world_size=dp_world_size, full=full)

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's slice of a (padded_numel,) buffer laid out like `full`, shaped like it."""
        return [flat[off:off + p.numel()].view(p.shape) for p, off in zip(self.params, self.offsets)]

    def attach_flat_grad(self) -> None:
        """Stages 0-1: allocate `flat_grad` (zeros). The `p.grad`s are left as they are, as torch
        leaves them when an optimizer is built; `sync_flat_grad` makes them views of it."""
        self.flat_grad = self.full.new_zeros(self.padded_numel)

    def sync_flat_grad(self) -> torch.Tensor:
        """Stages 0-1: make sure `flat_grad` holds every `p.grad` and return it.

        Autograd accumulates into the views in place, so normally nothing moves. If user code
        replaced or dropped a `.grad` (e.g. `model.zero_grad()` sets them to None), copy the new
        gradient in (None counts as zero) and point `.grad` back at the view.
        """
        for p, view in zip(self.params, self.views(self.flat_grad)):
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
            p.grad = view
        return self.flat_grad

    def flatten_grads(self) -> torch.Tensor:
        """Stages 2-3: a new (padded_numel,) buffer with every `p.grad` (None as zeros), padding 0."""
        flat = self.full.new_zeros(self.padded_numel)
        for p, view in zip(self.params, self.views(flat)):
            if p.grad is not None:
                view.copy_(p.grad)
        return flat

    def pad_elements(self, lo: int, hi: int) -> int:
        """How many padding elements (index >= numel) lie in [lo, hi)."""
        return pad_range(self.numel, lo, hi)

    def shard_pad_elements(self) -> int:
        """Padding elements inside this rank's shard (only the last ranks have any)."""
        m = self.shard_numel
        return self.pad_elements(self.dp_rank * m, (self.dp_rank + 1) * m)


def pad_range(numel: int, lo: int, hi: int) -> int:
    return max(0, hi - max(lo, numel))


@dataclass(frozen=True, kw_only=True)
class ParamGroup:
    """One optimizer parameter group: its options (lr, weight_decay...) and parameters.

    all_named: every parameter given, in order, frozen ones too (what torch's `param_groups` list);
    named:     the trainable ones, which ZeRO packs into flat units.
    """
    options: dict[str, Any]
    all_named: tuple[tuple[str, torch.Tensor], ...]

    @property
    def named(self) -> tuple[tuple[str, torch.Tensor], ...]:
        return tuple((n, p) for n, p in self.all_named if p.requires_grad)


def resolve_param_groups(params: nn.Module | Iterable, param_groups: Iterable[dict] | None = None) -> list[ParamGroup]:
    """Name every parameter and check the groups (torch's format: dicts with "params" and options).

    `params` is either a model, with `param_groups` None (one group of all its parameters) or
    torch's list of dicts over its parameters, every trainable one in exactly one group; or what a
    torch optimizer takes (tensors, (name, tensor) pairs, or dicts of them), named by their
    position across the groups (the numbering of torch's `state_dict`) unless the pairs name them.
    Frozen parameters (requires_grad=False) stay in `all_named`: ZeRO neither packs nor updates them.
    """
    if not isinstance(params, nn.Module):
        if param_groups is not None:
            raise TypeError("ZeRO: param_groups= goes with a model; parameters already come as torch's param groups")
        return named_groups(*torch_param_groups(params))
    names = {id(p): n for n, p in params.named_parameters()}  # tied weights appear once
    dicts = [{"params": list(params.parameters())}] if param_groups is None else param_groups
    groups = named_groups(dicts, names, where="a parameter of the model")
    grouped = {id(p) for g in groups for _, p in g.all_named}
    missing = [n for n, p in params.named_parameters() if p.requires_grad and id(p) not in grouped]
    if missing:
        raise ValueError(f"ZeRO: trainable parameters {missing} are in no param group; add them to one "
                         "or set requires_grad=False")
    return groups


def named_groups(param_groups: Iterable[dict], names: dict[int, str], *,
                 where: str = "one of the parameters") -> list[ParamGroup]:
    """ParamGroups from torch-style dicts whose tensors all have a name in `names` (by id), each once."""
    groups, seen = [], set()
    for i, group in enumerate(param_groups):
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError(f"ZeRO: param_groups[{i}] must be a dict with a 'params' list, as for torch.optim")
        named = []
        for entry in _entries(group["params"]):
            p = entry[1] if _is_pair(entry) else entry  # torch's (name, tensor) pairs
            if id(p) not in names:
                raise ValueError(f"ZeRO: param_groups[{i}] holds a tensor that is not {where}")
            if id(p) in seen:
                raise ValueError(f"ZeRO: parameter {names[id(p)]!r} appears in two param groups")
            seen.add(id(p))
            named.append((names[id(p)], p))
        groups.append(ParamGroup(options={k: v for k, v in group.items() if k != "params"}, all_named=tuple(named)))
    return groups


def torch_param_groups(params: Iterable, *, first: int = 0) -> tuple[list[dict], dict[int, str]]:
    """torch.optim's forms of `params` (tensors, (name, tensor) pairs, or dicts of them) as new
    group dicts over lists of tensors, and a name per tensor: the pair's, else its position
    across the groups counted from `first`."""
    items = list(params)
    if not items:
        raise ValueError("ZeRO: got an empty parameter list")
    dicts = [dict(g) for g in items] if isinstance(items[0], dict) else [{"params": items}]
    names: dict[int, str] = {}
    position = first
    for group in dicts:
        if "params" not in group:
            continue  # named_groups says what is missing
        tensors = []
        for entry in _entries(group["params"]):
            name, p = entry if _is_pair(entry) else (str(position), entry)
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"ZeRO: parameters must be tensors, got {type(p).__name__}")
            names.setdefault(id(p), name)
            tensors.append(p)
            position += 1
        group["params"] = tensors
    return dicts, names


def _entries(params: Any) -> list:
    """A group's "params" as a list: torch takes one tensor, one (name, tensor) pair or an ordered
    iterable of them (a set has no order, so ranks could disagree on the layout)."""
    if isinstance(params, torch.Tensor) or _is_pair(params):
        return [params]
    if isinstance(params, set):
        raise TypeError("ZeRO: a param group's parameters must be in an ordered collection (a list), not a set")
    return list(params)


def _is_pair(entry: Any) -> bool:
    return (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)
            and isinstance(entry[1], torch.Tensor))


def bucket_units(groups: Sequence[ParamGroup], *, bucket_cap_bytes: int, dp_rank: int,
                 dp_world_size: int, first_group: int = 0) -> list[FlatUnit]:
    """Stages 0-2: each group's parameters in buckets of at most `bucket_cap_bytes`, last first.
    `first_group`: the index of `groups[0]` among the optimizer's groups (one added later)."""
    units = []
    for g, group in enumerate(groups, start=first_group):
        trainable = group.named
        if not trainable:
            continue
        for bucket in assign_buckets([p for _, p in trainable], bucket_cap_bytes):
            named = [trainable[i] for i in reversed(bucket)]  # buffer in registration order
            units.append(FlatUnit.pack(named, group_index=g, dp_rank=dp_rank, dp_world_size=dp_world_size))
    return units


def default_unit_modules(model: nn.Module) -> list[nn.Module]:
    """The model's children, looking inside ModuleList / ModuleDict (GPT: wte, wpe, each Block,
    ln_f, lm_head; an nn.Sequential MLP: each Linear). What no unit owns stays with the root."""
    found = []
    for child in model.children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            found.extend(child.children())
        else:
            found.append(child)
    return found


def module_units(model: nn.Module, groups: Sequence[ParamGroup], unit_modules: Sequence[nn.Module],
                 *, dp_rank: int, dp_world_size: int) -> list[FlatUnit]:
    """Stage 3: one unit per (module, param group). A parameter belongs to the unit module that
    holds it; one held by several (a tied embedding and output head) or by none goes to the root,
    which stays gathered for its whole forward and backward."""
    members: list[set[int]] = []
    for i, module in enumerate(unit_modules):
        inside = [j for j, other in enumerate(unit_modules) if j != i and any(m is other for m in module.modules())]
        if module is model or inside:
            raise ValueError(f"ZeRO: unit_modules[{i}] contains the model or another unit module; pass "
                             "disjoint submodules (the root is a unit of its own already)")
        members.append({id(p) for p in module.parameters()})
    owners = list(unit_modules) + [model]
    units = []
    for module_index, module in enumerate(owners):
        for g, group in enumerate(groups):
            named = [(n, p) for n, p in group.named if _owner(p, members) == module_index]
            if named:
                unit = FlatUnit.pack(named, group_index=g, dp_rank=dp_rank, dp_world_size=dp_world_size)
                unit.module = module
                units.append(unit)
    return units


def _owner(p: nn.Parameter, members: list[set[int]]) -> int:
    holders = [i for i, ids in enumerate(members) if id(p) in ids]
    return holders[0] if len(holders) == 1 else len(members)  # len(members): the root
