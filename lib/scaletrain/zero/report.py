"""What one ZeRO rank holds and sends, measured, next to what the ZeRO paper's formulas predict.

Memory is counted from the tensors' storages (a view and its base, or a shard viewing the flat
buffer, count once; a stage-3 buffer resized to 0 bytes counts 0), so a forgotten `free` or a
gradient kept whole shows up. The formulas are `scaletrain.memory.zero_memory_per_rank`
(ZeRO paper §5, Figure 1) evaluated at the *padded* count Ψ' = Σ N·⌈n_u/N⌉ over the flat units:
every rank then holds exactly the formula, and `padding` says how many of those bytes are the
zeros that make each unit divisible by N (they sit in the last ranks' shards).

Communication is what `scaletrain.comm.comm_counter` recorded for the hooks and steps: per step
and rank, Σ_u f·(N-1)·m_u·itemsize bytes with f = 2 for stages 0-2 (one reduce-scatter and one
all-gather, or an allreduce) and f = 3 for stage 3 (all-gather in forward, all-gather in
backward, reduce-scatter), i.e. 2Ψ'·(N-1)/N and 3Ψ'·(N-1)/N elements (`StageFacts.comm_factor`).

The functions take what they read (the flat units, the wrapped optimizer, the stage, the bytes
counted), not the engine; notebook 05's measurements over all stages are in demo.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from scaletrain.comm.counter import CommStats
from scaletrain.memory import MemoryBreakdown, zero_memory_per_rank
from scaletrain.memory_measure import storage_bytes
from scaletrain.zero.layout import FlatUnit
from scaletrain.zero.stages import stage_facts

__all__ = ["MemoryReport", "CommReport", "measure_memory", "expected_memory", "comm_report",
           "expected_comm", "optimizer_kind", "padded_params"]


@dataclass(frozen=True, kw_only=True)
class MemoryReport:
    """Bytes on this rank now. `params`, `grads`, `optimizer` include `padding` bytes of zeros;
    `frozen`: parameters ZeRO does not manage (kept whole on every rank), outside the formulas.
    The optimizer's scalar `step` counters (4 B per flat shard) are not counted."""
    params: int
    grads: int
    optimizer: int
    padding: int
    frozen: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def breakdown(self) -> MemoryBreakdown:
        return MemoryBreakdown(params=self.params, grads=self.grads, optimizer=self.optimizer)


@dataclass(frozen=True, kw_only=True)
class CommReport:
    """Bytes and messages this rank sent for training over `steps` steps, and the formula's figure."""
    bytes_sent: int
    messages: int
    steps: int
    expected_bytes_per_step: int
    expected_messages_per_step: int

    @property
    def bytes_per_step(self) -> float:
        return self.bytes_sent / self.steps if self.steps else 0.0


def _per_element(unit: FlatUnit, t: torch.Tensor) -> tuple[int, int]:
    """(bytes, padding bytes) of a buffer laid out like `unit.full` (N·m) or like its shard (m)."""
    if t.numel() == unit.padded_numel:
        pad = unit.padded_numel - unit.numel
    else:
        pad = unit.shard_pad_elements()
    return t.untyped_storage().nbytes(), pad * t.element_size() if t.untyped_storage().nbytes() else 0


def _count(pairs: Iterable[tuple[FlatUnit, torch.Tensor]]) -> tuple[int, int]:
    """Sum (bytes, padding bytes) over distinct storages."""
    seen: dict[int, tuple[int, int]] = {}
    for unit, t in pairs:
        seen.setdefault(t.untyped_storage().data_ptr(), _per_element(unit, t))
    seen.pop(0, None)  # freed (0-byte) storages
    return sum(b for b, _ in seen.values()), sum(p for _, p in seen.values())


def measure_memory(units: Sequence[FlatUnit], optimizer: torch.optim.Optimizer,
                   frozen: Sequence[torch.Tensor] = ()) -> MemoryReport:
    """What this rank holds for the units (and the wrapped `optimizer`'s state of their shards)."""
    params = _count([(u, u.full) for u in units] + [(u, u.shard) for u in units])
    grads = _count([(u, g) for u in units
                    for g in (u.flat_grad, u.shard.grad, *(p.grad for p in u.params)) if g is not None])
    states = _count([(u, v) for u in units for v in optimizer.state.get(u.shard, {}).values()
                     if isinstance(v, torch.Tensor) and v.shape == u.shard.shape])
    return MemoryReport(params=params[0], grads=grads[0], optimizer=states[0],
                        padding=params[1] + grads[1] + states[1], frozen=storage_bytes(list(frozen)))


def optimizer_kind(optimizer: torch.optim.Optimizer) -> str | None:
    """The `scaletrain.memory.OPTIMIZERS` name whose state matches, or None if not modelled."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return "adam"
    if isinstance(optimizer, torch.optim.SGD):
        momentum = any(g.get("momentum", 0) for g in optimizer.param_groups)
        return "sgd_momentum" if momentum else "sgd"
    return None


def padded_params(units: Iterable[FlatUnit]) -> int:
    """Ψ' = Σ N·⌈n_u/N⌉: the parameter count the flat buffers actually hold."""
    return sum(u.padded_numel for u in units)


def expected_memory(units: Sequence[FlatUnit], optimizer: torch.optim.Optimizer, stage: int) -> MemoryBreakdown:
    """The paper's per-rank bytes for these units (stage, N, optimizer) at Ψ' (fp32 only)."""
    kind = optimizer_kind(optimizer)
    if kind is None:
        raise ValueError(f"expected_memory: no formula for {type(optimizer).__name__}; "
                         "scaletrain.memory models Adam(W) and SGD with or without momentum")
    if units[0].full.dtype != torch.float32:
        raise ValueError("expected_memory: the formulas here are for fp32 parameters")
    return zero_memory_per_rank(padded_params(units), units[0].dp_world_size, stage,
                                precision="fp32", optimizer=kind)


def expected_comm(units: Iterable[FlatUnit], world_size: int, stage: int) -> tuple[int, int]:
    """(bytes, messages) one rank sends per training step: f·(N-1) messages of m_u elements per unit."""
    f = stage_facts(stage).comm_factor
    units = list(units)
    nbytes = sum(f * (world_size - 1) * u.shard_numel * u.full.element_size() for u in units)
    return nbytes, f * (world_size - 1) * len(units)


def comm_report(units: Sequence[FlatUnit], stage: int, sent: CommStats, steps: int) -> CommReport:
    """`sent` (what the training steps sent) next to `expected_comm` per step."""
    nbytes, messages = expected_comm(units, units[0].dp_world_size, stage)
    return CommReport(bytes_sent=sent.bytes_sent, messages=sent.messages, steps=steps,
                      expected_bytes_per_step=nbytes, expected_messages_per_step=messages)
