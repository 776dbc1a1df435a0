"""a5's probes: the student's ZeRO engine run on the models the trusted side names, and measured
from outside the student's code.

- `load`: import the student's file (an import error becomes every check's outcome).
- `shard_views`: the student's `shard_of` on the given buffers: what it returned, and whether that
  shares the buffer's storage (and where in it).
- `run_ranks`: one spawn of gloo ranks running the given jobs in order, each under the run-time
  guard that traps torch's collectives:
  * "unshard": the student's `unshard` on given data, the shard a view of the buffer and a
    separate tensor: the buffers afterwards, and the bytes handed to `isend` by each call;
  * "train": the student's `ZeRO` around a model built from a spec (`build_model`), trained
    step by step on `scaletrain.zero.verify.micro_batch_loss`. Per step: the parameters (stages
    0-2: each parameter as the model holds it; stage 3: each unit's shard, and the frozen
    parameters), the bytes handed to `isend` during forward, backward and step, and (traced jobs)
    the bytes of live storages reachable from the model, the optimizer and the engine after the
    step, with samples taken during backward (after each parameter's gradient hook, the
    engine's hooks having run) and, at stage 3, at each unit module's forward pre-hook. At the
    end: the optimizer state of every unit's shard, the unit layout the engine declares, and its
    own `memory_report` / `comm_report` as text (shown in reasons, never believed).

What is measured here is counted below the student's code: bytes are those of the tensors the
probe's wrapper of `torch.distributed.isend` / `send` saw (installed before the student's file is
imported), not `record_send`'s counter; memory is the probe's own walk over storages (a storage
counted once, however many views), not the engine's report. Nothing here knows an expected
value: the reference run, the layout and the formulas exist only on the trusted side
(autograder/suites/a5_zero/), which also builds its models with `build_model` below.
"""

from __future__ import annotations

import sys
import types

from autograder.checks import forbid_calls, student_module
from autograder.probes.common import SentBytes, install_send_counter, run_jobs, spawn_ranks
from autograder.wire import short

TORCH_COLLECTIVES = ("torch.distributed.all_reduce", "torch.distributed.all_gather",
                     "torch.distributed.all_gather_into_tensor", "torch.distributed.reduce_scatter",
                     "torch.distributed.reduce_scatter_tensor", "torch.distributed.broadcast")
OPTIMIZER_CLASS_NAMES = {"adamw": "AdamW", "sgd_momentum": "SGD"}  # name -> torch.optim class name


# ---------------------------------------------------------------- models (shared with the trusted side)

def build_model(spec: dict, seed: int):
    """(model, param_groups or None) from a spec: {"kind": "gpt", "config": {...}} | {"kind": "mlp",
    "sizes": [...], "frozen_first": bool, "grouped": bool} | {"kind": "one_weight"}. Grouped models:
    weights decay, biases don't and learn at 0.02 (`scaletrain.zero.verify.param_groups`)."""
    import torch
    import torch.nn as nn
    from scaletrain.models import GPT, MLP, GPTConfig
    from scaletrain.zero.verify import exact_key_bias_gradients

    kind = spec["kind"]
    if kind == "gpt":
        model = exact_key_bias_gradients(GPT(GPTConfig(**spec["config"]), seed=seed))
    elif kind == "mlp":
        model = MLP(list(spec["sizes"]), seed=seed)
        if spec.get("frozen_first"):
            model[0].requires_grad_(False)
    elif kind == "one_weight":  # one weight and no bias: fewer parameters than ranks
        model = nn.Sequential(nn.Linear(1, 1, bias=False))
        with torch.no_grad():
            model[0].weight.copy_(torch.randn(1, 1, generator=torch.Generator().manual_seed(seed)))
    else:
        raise ValueError(f"unknown model kind {kind!r}")
    if not spec.get("grouped"):
        return model, None
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return model, [{"params": decay}, {"params": no_decay, "weight_decay": 0.0, "lr": 0.02}]


def unit_modules(model) -> list[tuple[str, object]]:
    """(qualified name, module) of the modules ZeRO gathers one at a time by default: the model's
    children, looking inside ModuleList / ModuleDict (as `scaletrain.zero.layout.default_unit_modules`)."""
    import torch.nn as nn

    names = {id(m): n for n, m in model.named_modules()}
    found = []
    for child in model.children():
        found.extend(child.children() if isinstance(child, (nn.ModuleList, nn.ModuleDict)) else [child])
    return [(names[id(m)], m) for m in found]


# ---------------------------------------------------------------- plain calls

def load(stem: str, ranks: bool = False) -> bool:
    """Import the student's file; with `ranks`, first start the server the ranks fork from, so
    that its imports (torch, torch._dynamo) overlap with this process's."""
    if ranks:
        from multiprocessing import forkserver

        from scaletrain.launch import _context

        if _context().get_start_method() == "forkserver":
            forkserver.ensure_running()
    student_module(stem)
    return True


def shard_views(stem: str, cases: list) -> list:
    """Per (full, rank, size): {"value": tensor or None, "type": ..., "same_storage", "offset"}."""
    import torch

    zm = student_module(stem)
    out = []
    for full, rank, size in cases:
        got = zm.shard_of(full, rank, size)
        if not isinstance(got, torch.Tensor):
            out.append({"value": None, "type": type(got).__name__})
            continue
        out.append({"value": got.detach().clone().as_subclass(torch.Tensor), "type": "Tensor",
                    "same_storage": got.untyped_storage().data_ptr() == full.untyped_storage().data_ptr(),
                    "offset": int(got.storage_offset())})
    return out


# ---------------------------------------------------------------- what the ranks run

_LEAVES = (str, bytes, int, float, complex, bool, type(None), type, types.ModuleType, types.FunctionType,
           types.BuiltinFunctionType, types.MethodType, types.BuiltinMethodType, property, staticmethod,
           classmethod, range, slice)


class _Storages:
    """Distinct non-empty storages reachable from the roots, each counted once under the role of
    the first root that reached it (a view and its base, or a shard viewing a flat buffer, once)."""

    def __init__(self):
        self.found: dict[int, tuple[int, str]] = {}
        self._seen: set[int] = set()

    def tensor(self, t, role: str, grads: bool = True) -> None:
        try:
            storage = t.untyped_storage()
            nbytes, ptr = storage.nbytes(), storage.data_ptr()
        except Exception:  # noqa: BLE001 - a tensor without storage (meta, sparse...) holds nothing here
            return
        if nbytes:
            self.found.setdefault(ptr, (nbytes, role))
        if grads and t.is_leaf and t.grad is not None:
            self.tensor(t.grad, "grads" if role == "params" else role, grads=False)

    def walk(self, obj, role: str, depth: int = 0) -> None:
        import torch

        if isinstance(obj, _LEAVES) or depth > 12 or len(self._seen) > 200_000:
            return
        if isinstance(obj, torch.Tensor):
            self.tensor(obj, role)
            return
        if id(obj) in self._seen:
            return
        self._seen.add(id(obj))
        if isinstance(obj, dict):
            items = list(obj.items())
            for key, value in items:
                self.walk(key, role, depth + 1)
                self.walk(value, role, depth + 1)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for item in list(obj):
                self.walk(item, role, depth + 1)
        else:
            try:
                attrs = vars(obj)
            except TypeError:
                attrs = {}
            for value in list(attrs.values()):
                self.walk(value, role, depth + 1)
            slots = getattr(type(obj), "__slots__", ())
            for slot in (slots,) if isinstance(slots, str) else slots if isinstance(slots, (tuple, list)) else ():
                self.walk(getattr(obj, slot, None), role, depth + 1)

    def summary(self) -> dict:
        roles: dict[str, int] = {}
        for nbytes, role in self.found.values():
            roles[role] = roles.get(role, 0) + nbytes
        return {"total": sum(roles.values()), **roles}


class _Meter:
    """What this rank holds: storages reachable from the model, the optimizer and the engine (and
    the student module's globals), and the parameters' own storages and gradients."""

    def __init__(self, engine, model, sent: SentBytes):
        self.engine, self.model, self.sent = engine, model, sent
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.backward_start = 0
        self.samples: list = []

    def held(self) -> dict:
        walk = _Storages()
        for p in self.model.parameters():
            walk.tensor(p, "params")
        for b in self.model.buffers():
            walk.tensor(b, "buffers")
        optimizer = getattr(self.engine, "optimizer", None)
        if optimizer is not None:
            for group in getattr(optimizer, "param_groups", []):
                for p in group.get("params", []):
                    walk.tensor(p, "params")
            walk.walk(getattr(optimizer, "state", {}), "optimizer")
        walk.walk(self.engine, "engine")
        cls = type(self.engine)
        walk.walk({k: v for k, v in vars(cls).items() if not k.startswith("__")}, "engine")
        module = sys.modules.get(cls.__module__)
        if module is not None:
            walk.walk({k: v for k, v in vars(module).items() if not k.startswith("__")}, "engine")
        return walk.summary()

    def parameters(self) -> tuple[int, int]:
        """(bytes of the trainable parameters' storages, bytes of their gradients' storages)."""
        data, grads = {}, {}
        for p in self.trainable:
            s = p.untyped_storage()
            if s.nbytes():
                data[s.data_ptr()] = s.nbytes()
            if p.grad is not None and p.grad.untyped_storage().nbytes():
                grads[p.grad.untyped_storage().data_ptr()] = p.grad.untyped_storage().nbytes()
        return sum(data.values()), sum(grads.values())

    def sample(self, phase: str, at: str) -> None:
        gathered, grads = self.parameters()
        self.samples.append({"phase": phase, "at": at, "gathered": gathered, "grads": grads,
                             "total": self.held()["total"], "sent": self.sent.total - self.backward_start})


def _snapshot(t):
    import torch

    if t.untyped_storage().nbytes() < (t.storage_offset() + t.numel()) * t.element_size():
        return None  # freed: nothing to read
    return t.detach().clone().as_subclass(torch.Tensor)


def _train(zm, job: dict, group, sent: SentBytes) -> dict:
    import torch
    import torch.distributed as dist
    from scaletrain.zero.verify import micro_batch_loss

    model, groups = build_model(job["model"], job["seed"])
    optimizer_class = getattr(torch.optim, OPTIMIZER_CLASS_NAMES[job["optimizer"]])
    stage, seed, trace = job["stage"], job["seed"], job["trace"]
    engine = zm.ZeRO(model, optimizer_class=optimizer_class, stage=stage, group=group, param_groups=groups,
                     bucket_cap_mb=job["bucket_cap_mb"], **job["options"])
    meter = _Meter(engine, model, sent)
    if trace and stage >= 2:  # registered after the engine's hooks: they run after them
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda _p, name=name: meter.sample("backward", name))
    if trace and stage == 3:
        for name, module in unit_modules(model):
            module.register_forward_pre_hook(lambda _m, _i, name=name: meter.sample("forward", name))
    rank = dist.get_rank(group)
    steps = []
    for step in range(job["steps"]):
        engine.zero_grad()
        meter.samples = []
        with sent.phase() as forward:
            meter.backward_start = sent.total
            loss = micro_batch_loss(model, seed=seed, step=step, rank=rank)
        with sent.phase() as backward:
            meter.backward_start = sent.total
            loss.backward()
        if trace and stage >= 2:
            meter.sample("end", "after backward")
        with sent.phase() as stepped:
            engine.step()
        record = {"sent": {"forward": forward.bytes, "backward": backward.bytes, "step": stepped.bytes}}
        if stage < 3:
            record["params"] = {n: _snapshot(p) for n, p in model.named_parameters()}
        else:
            record["shards"] = [_snapshot(u.shard) for u in engine.units]
            record["params"] = {n: _snapshot(p) for n, p in model.named_parameters() if not p.requires_grad}
        if trace:
            record["held"] = meter.held()
            record["samples"] = meter.samples
        steps.append(record)
    state = []
    for unit in engine.units:
        entry = engine.optimizer.state.get(unit.shard, {})
        state.append({str(k): _snapshot(v) for k, v in entry.items() if isinstance(v, torch.Tensor) and v.dim()})
    layout = [{"names": [str(n) for n in u.names], "numel": int(u.numel), "shard": int(u.shard.numel())}
              for u in engine.units]
    return {"steps": steps, "state": state, "layout": layout, "reports": _reports(engine)}


def _reports(engine) -> dict:
    out = {}
    for name in ("memory_report", "comm_report"):
        try:
            out[name] = short(repr(getattr(engine, name)()), 400)
        except Exception as exc:  # noqa: BLE001 - shown in reasons only
            out[name] = short(f"{type(exc).__name__}: {exc}", 400)
    return out


def _unshard(zm, job: dict, group, sent: SentBytes) -> list:
    import torch
    import torch.distributed as dist

    rank, size = dist.get_rank(group), job["size"]
    rows = []
    for data in job["buffers"]:
        m = data.numel() // size
        mine = data[rank * m:(rank + 1) * m].clone()
        full = torch.zeros(size * m, dtype=data.dtype)
        full[rank * m:(rank + 1) * m] = mine
        with sent.phase() as as_view:
            zm.unshard(full, full[rank * m:(rank + 1) * m], group)  # stages 1-2: the shard is a view
        separate, local = torch.full((size * m,), -1.0, dtype=data.dtype), mine.clone()
        with sent.phase() as as_separate:
            zm.unshard(separate, local, group)  # stage 3: a separate shard
        rows.append({"view": full.clone(), "separate": separate.clone(), "sent": [as_view.bytes, as_separate.bytes]})
    return rows


RUNNERS = {"unshard": _unshard, "train": _train}


def _rank(rank: int, world_size: int, stem: str, jobs: list, pg_timeout_s: float) -> dict:
    """Every job on this rank (`run_jobs`): {job name: {"ok": outputs} | {"error": [type, message]} | {"idle": True}}."""
    import datetime

    import torch.distributed as dist

    sent = install_send_counter()  # before the student's file binds any name of torch.distributed
    zm = student_module(stem)
    timeout = datetime.timedelta(seconds=pg_timeout_s)
    groups = {world_size: dist.new_group(list(range(world_size)), timeout=timeout),
              1: dist.new_group([0], timeout=timeout)}

    guarded = (zm, *(m for m in (sys.modules.get("scaletrain.zero.stage3"),) if m is not None))  # task 5.4's file

    def run(job: dict):
        with forbid_calls(*TORCH_COLLECTIVES, modules=guarded):
            return RUNNERS[job["kind"]](zm, job, groups[job["size"]], sent)

    return run_jobs(rank, jobs, run, size_key="size")  # one rank idles through the N = 1 jobs


def run_ranks(stem: str, jobs: list, world_size: int, pg_timeout_s: float, timeout_s: float) -> list:
    """The jobs on `world_size` spawned ranks: one dict per rank (see `_rank`)."""
    return spawn_ranks(_rank, world_size, stem, jobs, pg_timeout_s, timeout_s=timeout_s, stems=(stem,))
