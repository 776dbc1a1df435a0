"""What each ZeRO stage partitions and what it sends: the one table the engine, the checkpoints and
the reports read, so "stage 2 shards gradients" is written down once.

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
§5.1-5.2 (seminar notes, "Efficient memory management: ZeRO papers"): the stages partition the
model states cumulatively, P_os (stage 1), then P_os+g (stage 2), then P_os+g+p (stage 3); stage 0
is plain data parallelism. Per training step a rank sends 2Ψ(N-1)/N elements at stages 0-2 (an
allreduce, or its two halves around the optimizer) and 3Ψ(N-1)/N at stage 3 (the parameters are
all-gathered twice, for forward and for backward, and the gradients reduce-scattered), §7.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["STAGES", "StageFacts", "stage_facts"]

STAGES = (0, 1, 2, 3)


@dataclass(frozen=True, kw_only=True)
class StageFacts:
    """Which model states a stage partitions across the N ranks (each rank keeps 1/N of them)."""
    optimizer_state: bool
    gradients: bool
    parameters: bool

    @property
    def comm_factor(self) -> int:
        """f in f·Ψ(N-1)/N elements sent per rank and step: 3 when the parameters are sharded."""
        return 3 if self.parameters else 2


_FACTS = {0: StageFacts(optimizer_state=False, gradients=False, parameters=False),
          1: StageFacts(optimizer_state=True, gradients=False, parameters=False),
          2: StageFacts(optimizer_state=True, gradients=True, parameters=False),
          3: StageFacts(optimizer_state=True, gradients=True, parameters=True)}


def stage_facts(stage: int) -> StageFacts:
    """The facts of `stage` (one of STAGES); a clear error for anything else."""
    if isinstance(stage, bool) or stage not in _FACTS:
        raise ValueError(f"ZeRO: stage must be one of {STAGES}, got {stage!r}")
    return _FACTS[stage]
