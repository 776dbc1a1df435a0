"""ZeRO-DP stages 0-3 on the hand-written ring collectives (assignment a5, tasks 5.1-5.4).

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
§5 (seminar notes, "Efficient memory management: ZeRO papers"; "Fully sharded data parallel").
Per rank, with Ψ parameters, N ranks and fp32 Adam (4 B weights, 4 B gradients, K = 8 B state):

    stage 0  plain data parallel      4Ψ + 4Ψ + 8Ψ     = 16Ψ        allreduce          2Ψ·(N-1)/N
    stage 1  optimizer state sharded  4Ψ + 4Ψ + 8Ψ/N                reduce-scatter +
                                                                    all-gather         2Ψ·(N-1)/N
    stage 2  + gradients sharded      4Ψ + (4 + 8)Ψ/N               same, per bucket   2Ψ·(N-1)/N
    stage 3  + parameters sharded     (4 + 4 + 8)Ψ/N                2 all-gathers + RS 3Ψ·(N-1)/N

(elements sent per rank on the right; Ψ is the padded count, see layout.py). Stages 1-2 cost no
more communication than data parallelism: an allreduce *is* a reduce-scatter followed by an
all-gather, and ZeRO runs the optimizer between the two halves, on the shard each rank owns.

`ZeRO` is a `torch.optim.Optimizer`: torch's loop, LR schedulers and closures drive it as they
drive the optimizer it wraps, and it does the communication its stage needs around that
optimizer's step on this rank's shard (what each stage shards: stages.py).

How the pieces run in one training step `zero_grad(); loss = model(x); loss.backward(); step()`:
  stage 0  step: ring-allreduce every flat gradient, update every parameter.
  stage 1  step: reduce-scatter every flat gradient (task 5.2), update my shard, all-gather the
           updated shards back into the parameters (task 5.1's `unshard`).
  stage 2  backward: as soon as a bucket's gradients are all accumulated, reduce-scatter the
           bucket and drop the full gradients (task 5.3); step: update my shard, all-gather.
  stage 3  forward: gather a unit's parameters just before its module runs, free them right after
           (task 5.4, stage3.py's coordinator); backward: gather them again before the module's
           backward, reduce-scatter its gradients and free them as soon as they are accumulated;
           step: update my shard (no all-gather: the next forward gathers).

What a stage partitions is read from stages.py (`self.facts`), never from the stage's number;
when stage 3 gathers, frees and prefetches (FSDP's prefetch) is stage3.py's `ParameterCoordinator`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch.nn as nn
from torch.autograd import Variable

from scaletrain.comm.counter import CommStats, comm_counter
from scaletrain.comm.ring import ring_all_gather_chunks, ring_allreduce, ring_of, ring_reduce_scatter
from scaletrain.dp.bucket import bucket_cap_bytes
from scaletrain.zero import checkpoint, report
from scaletrain.zero.layout import (FlatUnit, ParamGroup, bucket_units, default_unit_modules, module_units,
                                    named_groups, resolve_param_groups, torch_param_groups)
from scaletrain.zero.stage3 import ParameterCoordinator
from scaletrain.zero.stages import STAGES, stage_facts

__all__ = ["ZeRO", "shard_of", "unshard", "STAGES"]


# ------------------------------------------------------------------ task 5.1: the flat buffer

def shard_of(full: torch.Tensor, dp_rank: int, dp_world_size: int) -> torch.Tensor:
    """This rank's shard of a padded flat buffer, as a *view* (no copy).

    full: 1-D, N·m elements (already padded to a multiple of N = dp_world_size).
    Returns elements [r·m, (r+1)·m) with r = dp_rank, sharing memory with `full`, so that an
    optimizer updating the shard updates the buffer (and the model parameters viewing it).
    Graded: the values, and that the result shares `full`'s storage at element r·m.
    """
    if full.dim() != 1 or full.numel() % dp_world_size:
        raise ValueError(f"shard_of: expected a 1-D buffer padded to a multiple of {dp_world_size}, "
                         f"got shape {tuple(full.shape)}")
    # BEGIN SOLUTION
    m = full.numel() // dp_world_size
    return full.narrow(0, dp_rank * m, m)
    # END SOLUTION


def unshard(full: torch.Tensor, local: torch.Tensor, group: Any = None) -> torch.Tensor:
    """All-gather every rank's shard into `full`, in place; return `full`.

    full:  1-D, contiguous, N·m elements; on return chunk i (elements [i·m, (i+1)·m)) holds
           rank i's `local`.
    local: this rank's m elements: either `full`'s own chunk (stages 1-2, `shard_of`'s view:
           nothing to copy) or a separate tensor (stage 3: copy it into your chunk first).
    Graded: `full` on every rank (N = 1, 2; fewer elements than ranks) and the bytes each call
    hands to `isend`: N-1 messages of m·itemsize, a ring all-gather (your a2 ring, `scaletrain.comm`;
    torch.distributed's own collectives are forbidden). Pitfall: when `local` already is your
    chunk of `full`, a copy into it is a copy onto itself.
    """
    ring = ring_of(group)
    if full.dim() != 1 or local.numel() * ring.world_size != full.numel():
        raise ValueError(f"unshard: full has {full.numel()} elements, local {local.numel()}, on "
                         f"{ring.world_size} ranks; full must be 1-D with N·m elements")
    # BEGIN SOLUTION
    chunks = list(full.split(local.numel()))
    mine = chunks[ring.rank]
    if mine.data_ptr() != local.data_ptr():
        mine.copy_(local.reshape(-1))
    ring_all_gather_chunks(chunks, ring)
    return full
    # END SOLUTION


# ------------------------------------------------------------------ the engine

class ZeRO(torch.optim.Optimizer):
    """Shard a data-parallel model's states across the ranks of `group`: ZeRO stage 0-3.

    `ZeRO(model, optimizer_class=torch.optim.AdamW, stage=2, lr=1e-3)` on every rank, with the
    same model (same seed); then train as with any torch optimizer, `zero_grad()`,
    `model(x).backward()`, `step()`, each rank on its own data. After every step all ranks hold
    the parameters a single process would have with the averaged gradient (elementwise
    optimizers only: Adam(W), SGD with momentum; the padding stays 0).

    First argument: the model, or (stages 0-2, as torch's `ZeroRedundancyOptimizer(params,
    optimizer_class, ...)`) what a torch optimizer takes: parameters, (name, parameter) pairs or
    param-group dicts. Stage 3 needs the model: it gathers parameters around its modules' calls.
    Options (keyword-only):
      optimizer_class: the torch.optim.Optimizer class that steps each rank's shard.
      stage:         0-3 (`STAGES`).
      group:         the data-parallel process group (None: all ranks).
      param_groups:  with a model, torch's list of dicts (params + lr, weight_decay...); default:
                     one group of all its parameters.
      bucket_cap_mb: stages 0-2, the size of a flat buffer (DDP's default 25 MB; None: one buffer
                     per param group).
      unit_modules:  stage 3, the modules gathered one at a time (default: the model's children,
                     each transformer block separately; what they do not own stays with the root).
      prefetch:      stage 3, how many units may be gathered ahead on the communication thread
                     (0: none, every gather waits for its module; call `close()` when done).
      **defaults:    the optimizer's options (lr=...), as `optimizer_class` takes them.

    As a torch optimizer: `param_groups` hold the parameters as given (LR schedulers change their
    options, which `step` hands to the wrapped optimizer, `self.optimizer`, before it steps);
    `state` is that optimizer's, keyed by this rank's flat shards; `step(closure)`,
    `zero_grad(set_to_none=True)` and `add_param_group` (stages 0-2) behave as torch's;
    `state_dict()` is torch's shape with the whole state, gathered from every rank (collective),
    and `load_state_dict` re-shards it. `full_state_dict()` / `load_full_state_dict()` add the
    model's parameters, for a checkpoint that reloads at any world size and stage.
    Frozen parameters are neither sharded nor updated: every rank keeps them whole. Every rank
    must use the same parameters in its forward (as DDP without find_unused_parameters): the
    reduce-scatters are issued as gradients arrive, and ranks must issue them in the same order.
    """

    def __init__(self, params: nn.Module | Iterable, *, optimizer_class: type, stage: int, group: Any = None,
                 param_groups: Iterable[dict] | None = None, bucket_cap_mb: float | None = 25.0,
                 unit_modules: Sequence[nn.Module] | None = None, prefetch: int = 0, **defaults: Any):
        self.facts = stage_facts(stage)  # raises a clear error for anything but 0-3
        if not isinstance(prefetch, int) or prefetch < 0 or (prefetch and not self.facts.parameters):
            raise ValueError(f"ZeRO: prefetch gathers stage 3's parameters ahead; it takes an int >= 0 "
                             f"at stage 3 and 0 otherwise, got prefetch={prefetch!r} at stage {stage}")
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"ZeRO: optimizer_class must be a torch.optim.Optimizer class such as "
                            f"torch.optim.AdamW (not an instance), got {optimizer_class!r}")
        self.model = params if isinstance(params, nn.Module) else None
        if self.model is None and self.facts.parameters:
            raise TypeError("ZeRO: stage 3 gathers parameters around their modules' forward and backward; "
                            "pass the model, not its parameters")
        groups = resolve_param_groups(params, param_groups)
        ring = ring_of(group)  # raises a clear error outside a process group
        self.stage, self.group, self.bucket_cap_mb = stage, group, bucket_cap_mb
        self.dp_rank, self.dp_world_size = ring.rank, ring.world_size
        named = (list(self.model.named_parameters()) if self.model is not None
                 else [pair for g in groups for pair in g.all_named])
        self._names = {id(p): n for n, p in named}
        self.sent = CommStats()  # bytes this rank sent for training (hooks + step), not checkpoints
        self.prefetch = prefetch
        self.coordinator = (ParameterCoordinator(group=group, prefetch=prefetch, unshard=unshard,
                                                 counted=self._counted_hook, on_backward=self._queue_finish,
                                                 sent=self.sent)
                            if self.facts.parameters else None)  # stage 3: gathers around the modules
        self.units = self._build_units(groups, unit_modules)
        if not self.units:
            raise ValueError("ZeRO: the model has no trainable parameters")
        self.optimizer = optimizer_class(
            [{**g.options, "params": [u.shard for u in self.units if u.group_index == i]}
             for i, g in enumerate(groups)], **defaults)
        self._built = False  # torch.optim.Optimizer.__init__ adds the groups the units already hold
        super().__init__([{**g.options, "params": [p for _, p in g.all_named]} for g in groups],
                         self.optimizer.defaults)
        self._built = True
        self.frozen = [p for _, p in named if not p.requires_grad]
        self.steps = 0
        self._finish_queued = False
        self._register_hooks()

    def _build_units(self, groups: Sequence[ParamGroup], unit_modules: Sequence[nn.Module] | None,
                     first_group: int = 0) -> list[FlatUnit]:
        """The flat units of `groups` (optimizer groups first_group, first_group + 1, ...), sharded."""
        where = dict(dp_rank=self.dp_rank, dp_world_size=self.dp_world_size)
        if self.facts.parameters:
            modules = default_unit_modules(self.model) if unit_modules is None else list(unit_modules)
            units = module_units(self.model, groups, modules, **where)
        else:
            cap = bucket_cap_bytes(self.bucket_cap_mb, [p for g in groups for _, p in g.named])
            units = bucket_units(groups, bucket_cap_bytes=cap, first_group=first_group, **where)
        for unit in units:
            self._make_shard(unit)
        return units

    def _make_shard(self, unit: FlatUnit) -> None:
        if not self.facts.optimizer_state:
            unit.shard = nn.Parameter(unit.full)  # no sharding: the optimizer sees every element
        elif not self.facts.parameters:
            unit.shard = nn.Parameter(shard_of(unit.full, self.dp_rank, self.dp_world_size))
        else:
            unit.shard = nn.Parameter(shard_of(unit.full, self.dp_rank, self.dp_world_size).clone())
            self.coordinator.free(unit)
        if not self.facts.gradients:
            unit.attach_flat_grad()
        unit.pending = len(unit.params)

    @property
    def state(self) -> dict:
        """This rank's optimizer state: the wrapped optimizer's, keyed by the flat shards it steps."""
        return self.optimizer.state

    @state.setter
    def state(self, value: dict) -> None:  # torch.optim.Optimizer.__init__ and unpickling assign it
        self.optimizer.state = value

    def add_param_group(self, param_group: dict) -> None:
        """torch's `add_param_group` (e.g. layers unfrozen to fine-tune), stages 0-2; collective:
        every rank adds the same group. Its trainable parameters get flat units of their own."""
        if not self._built:
            return super().add_param_group(param_group)
        if self.facts.parameters:
            raise NotImplementedError("ZeRO: stage 3 assigns parameters to module units once, when it is "
                                      "built; pass every param group to the constructor")
        (param_group,), numbered = torch_param_groups([param_group], first=len(self._names))
        # without a model, new parameters are numbered on, as torch's state_dict numbers them
        names = self._names if self.model is not None else {**numbered, **self._names}
        group, = named_groups([param_group], names, where="a parameter of the model")
        super().add_param_group(param_group)  # torch's checks (a parameter in two groups) and defaults
        self._names = names
        units = self._build_units([group], None, first_group=len(self.param_groups) - 1)
        self.units.extend(units)
        self.optimizer.add_param_group({**group.options, "params": [u.shard for u in units]})
        for unit in units:
            self._hook_grads(unit)

    # -------------------------------------------------------------- the step

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One optimizer step on this rank's shard, with the communication its stage needs.

        `closure` (torch's contract): re-evaluates the model, runs its backward and returns the
        loss; it runs first, with gradients enabled, and its loss is returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_options()
        with self._counting():
            self._stage_step()()
        self.steps += 1
        return loss

    def _stage_step(self) -> Callable[[], None]:
        """The step of what this stage partitions (stages.py): parameters, gradients, state, nothing."""
        facts = self.facts
        return (self._step_stage3 if facts.parameters else self._step_stage2 if facts.gradients
                else self._step_stage1 if facts.optimizer_state else self._step_stage0)

    def _sync_options(self) -> None:
        """Hand the options of `param_groups` (lr, weight decay...: what LR schedulers and users
        change) to the wrapped optimizer's groups, as torch's ZeroRedundancyOptimizer does."""
        for mine, inner in zip(self.param_groups, self.optimizer.param_groups):
            inner.update({k: v for k, v in mine.items() if k not in ("params", "param_names")})

    def _step_stage0(self) -> None:
        """Plain data parallelism: average every flat gradient over the ranks, update everything."""
        for unit in self.units:
            unit.shard.grad = ring_allreduce(unit.sync_flat_grad(), op="avg", group=self.group)
        self.optimizer.step()

    def _step_stage1(self) -> None:
        """Task 5.2 (ZeRO §5.1, P_os). Contract: after it, every rank's parameters equal one
        process's step on the mean of the ranks' gradients (`unit.sync_flat_grad()` is this
        rank's, N·m elements per unit); the wrapped optimizer (`self.optimizer`) steps only this
        rank's shards (`unit.shard`), so it holds state for 1/N of the parameters; no gradient of a
        shard outlives the step; per step the rank sends 2Ψ'(N-1)/N elements, what an allreduce
        sends (`_step_stage0` above is the plain version). Graded: equality with one process
        (Adam and SGD with momentum), the bytes held after the step, the bytes sent. Pitfall: each
        rank's gradient is already the mean over its own micro-batch.
        """
        # BEGIN SOLUTION
        for unit in self.units:
            unit.shard.grad = ring_reduce_scatter(unit.sync_flat_grad(), op="avg", group=self.group)
        self.optimizer.step()
        for unit in self.units:
            unit.shard.grad = None
            unshard(unit.full, unit.shard.detach(), self.group)
        # END SOLUTION

    # -------------------------------------------------------------- stage 2: gradients

    def _grad_ready(self, unit: FlatUnit) -> None:
        """Task 5.3. Called (through a hook) each time autograd has accumulated one of `unit`'s
        gradients into `p.grad` (`unit.pending` counts the unit's parameters, reset after each
        backward). Contract: a unit is reduce-scattered (`_reduce_scatter_unit`) as soon as, and
        only once, all its gradients are in, during backward (the grader samples the memory after
        every gradient hook); at stage 3 (`self.coordinator` is not None) the unit's gathered
        parameters are then freed, its backward being over.
        """
        # BEGIN SOLUTION
        unit.pending -= 1
        if unit.pending == 0:
            self._reduce_scatter_unit(unit)
            if self.coordinator is not None:
                self.coordinator.free(unit)
        # END SOLUTION

    def _reduce_scatter_unit(self, unit: FlatUnit) -> None:
        """Task 5.3 (ZeRO §5.2, P_os+g). Average the unit's gradients over the ranks, keep this rank's shard.

        Contract: `unit.shard.grad` holds this rank's m elements of the mean gradient, and it
        accumulates over backward passes until `zero_grad`, as `.grad` does; after it, the unit's
        full gradients (`p.grad`, 4 bytes per parameter) hold no memory; `unit.flatten_grads()`
        gives them as one (N·m,) buffer. Graded: equality with one process, the bytes held (no
        full gradient survives its bucket) and sent.
        """
        # BEGIN SOLUTION
        grad_shard = ring_reduce_scatter(unit.flatten_grads(), op="avg", group=self.group)
        if unit.shard.grad is None:
            unit.shard.grad = grad_shard
        else:
            unit.shard.grad.add_(grad_shard)
        for p in unit.params:
            p.grad = None
        # END SOLUTION

    def _step_stage2(self) -> None:
        """Task 5.3. The gradients were reduce-scattered during backward. Contract: as stage 1's
        step, every rank ends with the parameters one process would have."""
        # BEGIN SOLUTION
        self.optimizer.step()
        for unit in self.units:
            unshard(unit.full, unit.shard.detach(), self.group)
        # END SOLUTION

    def _step_stage3(self) -> None:
        """The gradients were reduce-scattered during backward: update this rank's shard only (no
        all-gather: the next forward gathers the parameters it needs)."""
        self.optimizer.step()

    def close(self) -> None:
        """Stop stage 3's prefetch thread and destroy its process group (collective; a no-op
        without prefetch)."""
        if self.coordinator is not None:
            self.coordinator.close()

    # -------------------------------------------------------------- hooks and bookkeeping

    def _register_hooks(self) -> None:
        for unit in self.units:
            self._hook_grads(unit)
        if self.coordinator is not None:
            self.coordinator.register(self.units)

    def _hook_grads(self, unit: FlatUnit) -> None:
        """Sharded gradients (stages 2-3): count each of the unit's gradients as autograd finishes it."""
        if self.facts.gradients:
            for p in unit.params:
                p.register_post_accumulate_grad_hook(lambda _p, unit=unit: self._counted_hook(self._on_grad, unit))

    def _on_grad(self, unit: FlatUnit) -> None:
        self._queue_finish()
        self._grad_ready(unit)

    def _queue_finish(self) -> None:
        """Run `_finish_backward` once the whole backward is over (autograd's final callback)."""
        if not self._finish_queued:
            self._finish_queued = True
            Variable._execution_engine.queue_callback(lambda: self._counted_hook(self._finish_backward))

    def _finish_backward(self) -> None:
        """Units whose gradients only partly arrived (a parameter unused in this forward) are
        reduce-scattered now, missing gradients counting as 0; every rank walks the units in the
        same order, so the collectives match. Units that got no gradient at all are left alone
        (like torch, their parameters are skipped by the step). Stage 3's coordinator frees what
        is gathered, prefetched units included (`finish_backward`)."""
        if self.coordinator is not None:
            self.coordinator.finish_backward()
        for unit in self.units:
            if 0 < unit.pending < len(unit.params):
                self._reduce_scatter_unit(unit)
            unit.pending = len(unit.params)
        self._finish_queued = False

    def _counted_hook(self, fn, *args):
        with self._counting():
            return fn(*args)

    @contextlib.contextmanager
    def _counting(self) -> Iterator[None]:
        with comm_counter(this_thread=True) as stats:  # the prefetch thread's sends: `_wait`
            yield
        self.sent.bytes_sent += stats.bytes_sent
        self.sent.messages += stats.messages

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's `zero_grad` on the parameters, and the same for the gradient shards (held from
        backward to step): set to None, or zeroed in place (stages 0-1 then keep every `p.grad` a
        view of the flat buffer, so the next backward accumulates straight into it)."""
        super().zero_grad(set_to_none)
        for unit in self.units:
            if set_to_none or unit.shard.grad is None:
                unit.shard.grad = None
            else:
                unit.shard.grad.zero_()

    # -------------------------------------------------------------- reports and checkpoints

    def memory_report(self) -> "report.MemoryReport":
        """Bytes this rank holds now for parameters, gradients and optimizer state (storages)."""
        return report.measure_memory(self.units, self.optimizer, self.frozen)

    def comm_report(self) -> "report.CommReport":
        """Bytes this rank sent for training since it was built, and what the formula expects."""
        return report.comm_report(self.units, self.stage, self.sent, self.steps)

    def state_dict(self) -> dict:
        """Collective: torch's optimizer state_dict, whole, on every rank: what a plain
        `optimizer_class` over `param_groups` in one process would return (parameters numbered
        across the groups, each one's state shaped like it), so either can load it."""
        self._sync_options()
        return checkpoint.indexed(checkpoint.named_optimizer_state(self.units, self.optimizer, self.group,
                                                                   self._group_names()))

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a torch-shaped optimizer state_dict (ours from any world size and stage, or a plain
        optimizer's over the same param groups) on every rank, keeping this rank's shard."""
        named = checkpoint.by_name(state_dict, self._group_names())
        checkpoint.load_optimizer_state(self.units, self.optimizer, self.stage, named)
        self._adopt_options(named)

    def full_state_dict(self) -> dict | None:
        """Collective: a full, unpadded checkpoint (model + optimizer, by name) on dp rank 0;
        None on the others."""
        self._sync_options()
        return checkpoint.full_state_dict(self.units, self.optimizer, self.stage, self.group,
                                          group_names=self._group_names(), tensors=self._checkpoint_tensors())

    def load_full_state_dict(self, state: dict) -> None:
        """Re-shard a `full_state_dict()` checkpoint (from any world size and stage) onto this run's ranks."""
        checkpoint.load_full_state_dict(self.units, self.optimizer, self.stage, self._checkpoint_tensors(), state)
        self._adopt_options(state["optimizer"])

    def _adopt_options(self, named: dict) -> None:
        """The saved groups' options (lr, a scheduler's initial_lr...) become `param_groups`'."""
        for mine, saved in zip(self.param_groups, named["param_groups"]):
            mine.update({k: v for k, v in saved.items() if k != "params"})

    def _group_names(self) -> list[list[str]]:
        return [[self._names[id(p)] for p in g["params"]] for g in self.param_groups]

    def _checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """What the checkpoint's model part holds: the model's state_dict, or the parameters by name."""
        if self.model is not None:
            return self.model.state_dict(keep_vars=True)
        return {self._names[id(p)]: p for g in self.param_groups for p in g["params"]}

