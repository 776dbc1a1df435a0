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
backward, reduce-scatter), i.e. 2Ψ'·(N-1)/N and 3Ψ'·(N-1)/N elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

import torch

from scaletrain.memory import MemoryBreakdown, zero_memory_per_rank
from scaletrain.memory_measure import storage_bytes
from scaletrain.zero.layout import FlatUnit

if TYPE_CHECKING:
    from scaletrain.zero.engine import ZeRO

__all__ = ["MemoryReport", "CommReport", "measure_memory", "expected_memory", "comm_report",
           "expected_comm", "optimizer_kind", "padded_params", "measure_stages"]


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


def measure_memory(engine: "ZeRO") -> MemoryReport:
    units = engine.units
    params = _count([(u, u.full) for u in units] + [(u, u.shard) for u in units])
    grads = _count([(u, g) for u in units
                    for g in (u.flat_grad, u.shard.grad, *(p.grad for p in u.params)) if g is not None])
    states = _count([(u, v) for u in units for v in engine.optimizer.state.get(u.shard, {}).values()
                     if isinstance(v, torch.Tensor) and v.shape == u.shard.shape])
    return MemoryReport(params=params[0], grads=grads[0], optimizer=states[0],
                        padding=params[1] + grads[1] + states[1], frozen=storage_bytes(engine.frozen))


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


def expected_memory(engine: "ZeRO") -> MemoryBreakdown:
    """The paper's per-rank bytes for this engine (stage, N, optimizer) at Ψ' (fp32 only)."""
    kind = optimizer_kind(engine.optimizer)
    if kind is None:
        raise ValueError(f"expected_memory: no formula for {type(engine.optimizer).__name__}; "
                         "scaletrain.memory models Adam(W) and SGD with or without momentum")
    if engine.units[0].full.dtype != torch.float32:
        raise ValueError("expected_memory: the formulas here are for fp32 parameters")
    return zero_memory_per_rank(padded_params(engine.units), engine.dp_world_size, engine.stage,
                                precision="fp32", optimizer=kind)


def expected_comm(units: Iterable[FlatUnit], world_size: int, stage: int) -> tuple[int, int]:
    """(bytes, messages) one rank sends per training step: f·(N-1) messages of m_u elements per unit."""
    f = 3 if stage == 3 else 2
    units = list(units)
    nbytes = sum(f * (world_size - 1) * u.shard_numel * u.full.element_size() for u in units)
    return nbytes, f * (world_size - 1) * len(units)


def comm_report(engine: "ZeRO") -> CommReport:
    nbytes, messages = expected_comm(engine.units, engine.dp_world_size, engine.stage)
    return CommReport(bytes_sent=engine.sent.bytes_sent, messages=engine.sent.messages, steps=engine.steps,
                      expected_bytes_per_step=nbytes, expected_messages_per_step=messages)


def measure_stages(world_size: int, *, cfg=None, steps: int = 2, stages=(0, 1, 2, 3)) -> list[dict]:
    """Train the tiny GPT (AdamW) `steps` steps at each stage on `world_size` spawned ranks.

    Returns one row per (stage, rank): the measured `MemoryReport` after the last step, the
    formula at Ψ' (`expected_memory`), the `CommReport`, Ψ and Ψ'. For notebooks and plots.
    """
    from scaletrain.launch import spawn
    return [row for rows in spawn(_measure_rank, world_size, cfg, steps, tuple(stages), timeout_s=120)
            for row in rows]


def _measure_rank(rank: int, world_size: int, cfg, steps: int, stages) -> list[dict]:
    from scaletrain.models import GPT, GPTConfig, make_batch
    from scaletrain.zero.engine import ZeRO

    cfg = cfg or GPTConfig()
    rows = []
    for stage in stages:
        model = GPT(cfg, seed=0)
        zero = ZeRO(model, torch.optim.AdamW, stage, lr=1e-3)
        for step in range(steps):
            zero.zero_grad()
            model(*make_batch(cfg, 2, seed=1000 * step + rank))[1].backward()
            zero.step()
        rows.append(dict(stage=stage, rank=rank, world_size=world_size, memory=zero.memory_report(),
                         formula=expected_memory(zero), comm=zero.comm_report(),
                         psi=sum(u.numel for u in zero.units), psi_padded=padded_params(zero.units)))
    return rows
