"""Memory and communication audits of a trained ZeRO engine against the ZeRO paper's formulas.

Used by the repository tests and the a5 grader. Each audit is collective (every rank of the
engine's group calls it) and `agreed`: a failure on any rank is raised on all of them.
"""

from __future__ import annotations

import torch.distributed as dist

from scaletrain.memory import bytes_per_param
from scaletrain.zero.report import expected_memory, optimizer_kind
from scaletrain.zero.stages import stage_facts
from scaletrain.zero.verify import Case, agreed, train_steps

__all__ = ["check_memory", "check_comm", "check_stage3_gathers"]


@agreed
def check_memory(engine) -> None:
    """Collective. `memory_report()` (after a step, before zero_grad) equals the paper's formula at
    the padded Ψ', and the padding it names is exactly the padding: summed over ranks, total -
    padding is the formula at the real Ψ with Ψ/N read as an exact fraction (the shards of all
    ranks together hold Ψ real elements)."""
    size, stage = engine.dp_world_size, engine.stage
    got, want = engine.memory_report(), expected_memory(engine.units, engine.optimizer, stage)
    psi = sum(u.numel for u in engine.units)
    real = [None] * size
    dist.all_gather_object(real, got.total - got.padding, group=engine.group)  # before any assert
    assert got.breakdown() == want, (f"stage {stage}, N={size}: measured {got.breakdown()}, formula at "
                                     f"padded Ψ' {want}")
    p, g, k = bytes_per_param(precision="fp32", optimizer=optimizer_kind(engine.optimizer))
    facts = stage_facts(stage)  # bytes per parameter each rank keeps 1/N of
    sharded = k * facts.optimizer_state + g * facts.gradients + p * facts.parameters
    assert sum(real) == (p + g + k - sharded) * psi * size + sharded * psi, \
        f"stage {stage}: Σ(total - padding) over ranks = {sum(real)}, Ψ = {psi}: padding miscounted"
    frozen = sum(q.numel() * q.element_size() for q in engine.model.parameters() if not q.requires_grad)
    assert got.frozen == frozen, f"frozen parameters: reported {got.frozen} B, they hold {frozen} B"


@agreed
def check_comm(engine) -> None:
    """Bytes sent per step = 2Ψ'(N-1)/N elements (stages 0-2) or 3Ψ'(N-1)/N (stage 3), exactly."""
    size = engine.dp_world_size
    psi_padded = sum(size * -(-u.numel // size) for u in engine.units)
    comm = engine.comm_report()
    f = stage_facts(engine.stage).comm_factor
    itemsize = engine.units[0].full.element_size()
    assert comm.bytes_sent * size == comm.steps * f * itemsize * psi_padded * (size - 1), (
        f"stage {engine.stage}, N={size}: sent {comm.bytes_sent} B in {comm.steps} steps; expected "
        f"{f}Ψ'(N-1)/N = {f * itemsize * psi_padded * (size - 1) // size} B per step (Ψ' = {psi_padded})")
    assert comm.bytes_sent == comm.steps * comm.expected_bytes_per_step


@agreed
def check_stage3_gathers(engine, case: Case) -> None:
    """GPT at stage 3: inside block i's forward only the root unit (the tied embedding) and block i
    hold memory; after a training step every unit is back to 0 bytes."""
    by_module = {u.module: u for u in engine.units}
    freed_before = all(u.full.untyped_storage().nbytes() == 0 for u in engine.units)
    seen = []

    def record(module, _inputs):
        seen.append((sum(u.full.untyped_storage().nbytes() for u in engine.units),
                     (by_module[engine.model].padded_numel + by_module[module].padded_numel) * 4))

    hooks = [block.register_forward_pre_hook(record) for block in engine.model.blocks]
    train_steps(engine, case, engine.group, range(case.steps, case.steps + 1))  # after ZeRO's gather
    for h in hooks:
        h.remove()
    assert freed_before, "parameters still gathered after the step: free every unit after its backward"
    assert len(seen) == len(engine.model.blocks)
    for gathered, expected in seen:
        assert gathered == expected, (f"{gathered} bytes of parameters gathered inside a block, expected "
                                      f"{expected} (the root unit + this block): free each unit after its forward")
    assert all(u.full.untyped_storage().nbytes() == 0 for u in engine.units), \
        "parameters still gathered after the step: free every unit after its backward"
