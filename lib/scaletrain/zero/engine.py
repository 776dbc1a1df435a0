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

How the pieces run in one training step `zero_grad(); loss = model(x); loss.backward(); step()`:
  stage 0  step: ring-allreduce every flat gradient, update every parameter.
  stage 1  step: reduce-scatter every flat gradient (task 5.2), update my shard, all-gather the
           updated shards back into the parameters (task 5.1's `unshard`).
  stage 2  backward: as soon as a bucket's gradients are all accumulated, reduce-scatter the
           bucket and drop the full gradients (task 5.3); step: update my shard, all-gather.
  stage 3  forward: gather a unit's parameters just before its module runs, free them right after
           (task 5.4); backward: gather them again before the module's backward, reduce-scatter
           its gradients and free them as soon as they are accumulated; step: update my shard (no
           all-gather: the next forward gathers).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterable, Iterator, Sequence

import torch
import torch.nn as nn
from torch.autograd import Variable

from scaletrain.comm.counter import CommStats, comm_counter
from scaletrain.comm.ring import ring_all_gather_chunks, ring_allreduce, ring_of, ring_reduce_scatter
from scaletrain.zero import checkpoint, report
from scaletrain.zero.layout import FlatUnit, bucket_units, default_unit_modules, module_units, resolve_param_groups

__all__ = ["ZeRO", "shard_of", "unshard", "STAGES"]

STAGES = (0, 1, 2, 3)


# ------------------------------------------------------------------ task 5.1: the flat buffer

def shard_of(full: torch.Tensor, dp_rank: int, dp_world_size: int) -> torch.Tensor:
    """This rank's shard of a padded flat buffer, as a *view* (no copy).

    full: 1-D, N·m elements (already padded to a multiple of N = dp_world_size).
    Returns elements [r·m, (r+1)·m) with r = dp_rank, sharing memory with `full`, so that an
    optimizer updating the shard updates the buffer (and the model parameters viewing it).
    Hint: `Tensor.narrow` or slicing return views.
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
    Sends N-1 messages of m·itemsize bytes (a ring all-gather). Use the a2 ring: either
    `ring_all_gather(local, full.numel(), group)` and copy its result into `full`, or, without
    that extra copy, `ring_all_gather_chunks(list(full.split(m)), ring_of(group))`.
    Never call torch.distributed's own collectives here.
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

class ZeRO:
    """Shard a data-parallel model's states across the ranks of `group`: ZeRO stage 0-3.

    `ZeRO(model, torch.optim.AdamW, stage=2, lr=1e-3)` on every rank, with the same model (same
    seed); then train with `zero_grad()`, `model(x).backward()`, `step()`, each rank on its own
    data. After every step all ranks hold the parameters a single process would have with the
    averaged gradient (elementwise optimizers only: Adam(W), SGD with momentum; the padding
    stays 0). Options:
      param_groups:  torch's list of dicts (params + lr, weight_decay...); default: one group.
      bucket_cap_mb: stages 0-2, the size of a flat buffer (DDP's default 25 MB).
      unit_modules:  stage 3, the modules gathered one at a time (default: the model's children,
                     each transformer block separately; what they do not own stays with the root).
    Frozen parameters are neither sharded nor updated: every rank keeps them whole. Every rank
    must use the same parameters in its forward (as DDP without find_unused_parameters): the
    reduce-scatters are issued as gradients arrive, and ranks must issue them in the same order.
    """

    def __init__(self, model: nn.Module, optimizer_cls: type, stage: int, group: Any = None, *,
                 param_groups: Iterable[dict] | None = None, bucket_cap_mb: float = 25.0,
                 unit_modules: Sequence[nn.Module] | None = None, **optimizer_kwargs: Any):
        if stage not in STAGES or isinstance(stage, bool):
            raise ValueError(f"ZeRO: stage must be one of {STAGES}, got {stage!r}")
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise TypeError(f"ZeRO: optimizer_cls must be a torch.optim.Optimizer class such as "
                            f"torch.optim.AdamW (not an instance), got {optimizer_cls!r}")
        if bucket_cap_mb <= 0:
            raise ValueError(f"ZeRO: bucket_cap_mb must be > 0, got {bucket_cap_mb}")
        ring = ring_of(group)  # raises a clear error outside a process group
        self.model, self.stage, self.group = model, stage, group
        self.dp_rank, self.dp_world_size = ring.rank, ring.world_size
        groups = resolve_param_groups(model, param_groups)
        where = dict(dp_rank=self.dp_rank, dp_world_size=self.dp_world_size)
        if stage == 3:
            modules = default_unit_modules(model) if unit_modules is None else list(unit_modules)
            self.units = module_units(model, groups, modules, **where)
        else:
            self.units = bucket_units(groups, bucket_cap_bytes=int(bucket_cap_mb * 2**20), **where)
        if not self.units:
            raise ValueError("ZeRO: the model has no trainable parameters")
        for unit in self.units:
            self._make_shard(unit)
        self.optimizer = optimizer_cls(
            [{**g.options, "params": [u.shard for u in self.units if u.group_index == i]}
             for i, g in enumerate(groups)], **optimizer_kwargs)
        self.frozen = [p for p in model.parameters() if not p.requires_grad]
        self.sent = CommStats()  # bytes this rank sent for training (hooks + step), not checkpoints
        self.steps = 0
        self._finish_queued = False
        self._register_hooks()

    def _make_shard(self, unit: FlatUnit) -> None:
        if self.stage == 0:
            unit.shard = nn.Parameter(unit.full)  # no sharding: the optimizer sees every element
        elif self.stage in (1, 2):
            unit.shard = nn.Parameter(shard_of(unit.full, self.dp_rank, self.dp_world_size))
        else:
            unit.shard = nn.Parameter(shard_of(unit.full, self.dp_rank, self.dp_world_size).clone())
            self._free(unit)
        if self.stage <= 1:
            unit.attach_flat_grad()
        if self.stage == 0:
            unit.shard.grad = unit.flat_grad
        unit.pending = len(unit.params)

    # -------------------------------------------------------------- the step

    @torch.no_grad()
    def step(self) -> None:
        """One optimizer step on this rank's shard, with the communication its stage needs."""
        with self._counting():
            if self.stage == 0:
                for unit in self.units:
                    ring_allreduce(unit.sync_flat_grad(), op="avg", group=self.group)
                self.optimizer.step()
            elif self.stage == 1:
                self._step_stage1()
            elif self.stage == 2:
                self._step_stage2()
            else:
                self.optimizer.step()  # params stay sharded: the next forward gathers them
        self.steps += 1

    def _step_stage1(self) -> None:
        """Task 5.2. For every unit: average `unit.sync_flat_grad()` (N·m elements) over the ranks
        with a ring reduce-scatter, keeping this rank's m elements as `unit.shard.grad`; then
        `self.optimizer.step()`; then drop the shard gradients (set to None: they are only needed
        for the step) and all-gather the updated shards into `unit.full` with `unshard`.
        Average, don't sum: each rank's gradient is the mean over its own micro-batch.
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
        """Task 5.3. Called (through a hook) each time autograd has accumulated one parameter's
        gradient into `p.grad`. Count it off `unit.pending`; when the unit's last gradient has
        arrived, reduce-scatter the unit with `_reduce_scatter_unit`. Stage 3 then also frees the
        unit's gathered parameters (`_free`): its backward is over.
        """
        # BEGIN SOLUTION
        unit.pending -= 1
        if unit.pending == 0:
            self._reduce_scatter_unit(unit)
            if self.stage == 3:
                self._free(unit)
        # END SOLUTION

    def _reduce_scatter_unit(self, unit: FlatUnit) -> None:
        """Task 5.3. Average the unit's gradients over the ranks, keep this rank's shard, free the rest.

        `unit.flatten_grads()` gives a new (N·m,) buffer of the `p.grad`s; ring-reduce-scatter it
        with op="avg"; add the m-element result to `unit.shard.grad` (or set it when None: like
        `.grad`, it accumulates over backward passes until `zero_grad`); then set every `p.grad`
        of the unit to None, so the full gradients (4Ψ bytes) never outlive their bucket.
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
        """Task 5.3. The gradients were reduce-scattered during backward: update this rank's
        shard, then all-gather the shards into the parameters (as in stage 1)."""
        # BEGIN SOLUTION
        self.optimizer.step()
        for unit in self.units:
            unshard(unit.full, unit.shard.detach(), self.group)
        # END SOLUTION

    # -------------------------------------------------------------- stage 3: parameters

    def _gather(self, unit: FlatUnit) -> None:
        """Task 5.4. Make the unit's parameters usable: give `unit.full` its N·m elements of storage
        back (`unit.full.untyped_storage().resize_(nbytes)`) and all-gather every rank's shard into
        it with `unshard`. The parameters are views of `full`, so they see the values at once.
        Already gathered (a module called twice, or the root during its children): do nothing.
        """
        if unit.gathered:
            return
        # BEGIN SOLUTION
        unit.full.untyped_storage().resize_(unit.padded_numel * unit.full.element_size())
        unshard(unit.full, unit.shard.detach(), self.group)
        # END SOLUTION
        unit.gathered = True

    def _free(self, unit: FlatUnit) -> None:
        """Task 5.4. Release the memory of the gathered parameters: resize `unit.full`'s storage to
        0 bytes. The views stay valid objects (autograd keeps them for the backward, which
        gathers again first); reading them before the next `_gather` is an error, not stale data.
        """
        # BEGIN SOLUTION
        unit.full.untyped_storage().resize_(0)
        # END SOLUTION
        unit.gathered = False

    def _pre_forward(self, module: nn.Module, _inputs: Any) -> None:
        for unit in self._units_of[module]:
            self._gather(unit)

    def _post_forward(self, module: nn.Module, _inputs: Any, output: Any) -> None:
        for unit in self._units_of[module]:
            self._free(unit)
        if torch.is_grad_enabled():  # gather again when the gradient reaches this module's output
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(functools.partial(self._counted_hook, self._pre_backward, module))

    def _pre_backward(self, module: nn.Module, _grad: torch.Tensor | None = None) -> None:
        self._queue_finish()
        for unit in self._units_of[module]:
            self._gather(unit)

    # -------------------------------------------------------------- hooks and bookkeeping

    def _register_hooks(self) -> None:
        if self.stage >= 2:
            for unit in self.units:
                for p in unit.params:
                    p.register_post_accumulate_grad_hook(
                        lambda _p, unit=unit: self._counted_hook(self._on_grad, unit))
        if self.stage == 3:
            self._units_of: dict[nn.Module, list[FlatUnit]] = {}
            for unit in self.units:
                self._units_of.setdefault(unit.module, []).append(unit)
            for module in self._units_of:
                module.register_forward_pre_hook(functools.partial(self._counted_hook, self._pre_forward))
                module.register_forward_hook(functools.partial(self._counted_hook, self._post_forward))

    def _on_grad(self, unit: FlatUnit) -> None:
        self._queue_finish()
        self._grad_ready(unit)

    def _queue_finish(self) -> None:
        """Run `_finish_backward` once the whole backward is over (autograd's final callback)."""
        if not self._finish_queued:
            self._finish_queued = True
            Variable._execution_engine.queue_callback(
                functools.partial(self._counted_hook, self._finish_backward))

    def _finish_backward(self) -> None:
        """Units whose gradients only partly arrived (a parameter unused in this forward) are
        reduce-scattered now, missing gradients counting as 0; every rank walks the units in the
        same order, so the collectives match. Units that got no gradient at all are left alone
        (like torch, their parameters are skipped by the step). Stage 3 frees what is gathered."""
        for unit in self.units:
            if 0 < unit.pending < len(unit.params):
                self._reduce_scatter_unit(unit)
            if self.stage == 3 and unit.gathered:
                self._free(unit)
            unit.pending = len(unit.params)
        self._finish_queued = False

    def _counted_hook(self, fn, *args):
        with self._counting():
            return fn(*args)

    @contextlib.contextmanager
    def _counting(self) -> Iterator[None]:
        with comm_counter() as stats:
            yield
        self.sent.bytes_sent += stats.bytes_sent
        self.sent.messages += stats.messages

    def zero_grad(self) -> None:
        """Clear the gradients: zero the flat buffers in place (stages 0-1, so `p.grad` stays a view
        of them) or drop them (stages 2-3, shards included)."""
        for unit in self.units:
            if unit.flat_grad is not None:
                unit.flat_grad.zero_()
                unit.sync_flat_grad()
            else:
                unit.shard.grad = None
                for p in unit.params:
                    p.grad = None

    # -------------------------------------------------------------- reports and checkpoints

    def memory_report(self) -> "report.MemoryReport":
        """Bytes this rank holds now for parameters, gradients and optimizer state (storages)."""
        return report.measure_memory(self)

    def comm_report(self) -> "report.CommReport":
        """Bytes this rank sent for training since it was built, and what the formula expects."""
        return report.comm_report(self)

    def state_dict(self) -> dict | None:
        """A full, unpadded checkpoint (model + optimizer) on dp rank 0; None on the others."""
        return checkpoint.full_state_dict(self)

    def load_state_dict(self, state: dict) -> None:
        """Re-shard a `state_dict()` checkpoint (from any world size) onto this run's ranks."""
        checkpoint.load_full_state_dict(self, state)


def _tensors(output: Any) -> Iterator[torch.Tensor]:
    """The tensors inside a module's output (a tensor, or tuples / lists / dicts of them)."""
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (tuple, list)):
        for item in output:
            yield from _tensors(item)
    elif isinstance(output, dict):
        for item in output.values():
            yield from _tensors(item)
