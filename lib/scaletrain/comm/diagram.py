"""The ring drawn step by step: which chunk every rank receives, and whose data it then holds.

`ring_steps(p)` replays ring.py's schedule on sets of rank ids instead of numbers (chunk c of rank
r "holds {0, 2}" = the sum of ranks 0 and 2's chunk c), so the picture can be checked: after the
reduce-scatter rank r holds chunk r summed over all p ranks, after the all-gather every rank holds
every chunk complete. `ring_table(p)` is the text the handout prints; the notebook plots the same.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Transfer", "ring_steps", "ring_table"]


@dataclass(frozen=True, kw_only=True)
class Transfer:
    """At `step` of `phase`, `rank` received `chunk` from rank-1 and now holds it summed over `holds`."""
    phase: str          # "reduce-scatter" or "all-gather"
    step: int
    rank: int
    chunk: int
    holds: frozenset


def ring_steps(world_size: int) -> list[Transfer]:
    """Every receive of the ring allreduce on `world_size` ranks, in order (p-1 steps per phase)."""
    if world_size < 1:
        raise ValueError(f"ring_steps: world_size must be >= 1, got {world_size}")
    p = world_size
    holds = [[frozenset({r}) for _ in range(p)] for r in range(p)]  # holds[rank][chunk]
    transfers = []
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(p - 1):
            # rank r sends chunk (r-s-1) [reduce-scatter] or (r-s) [all-gather] to r+1, all at once
            offset = 1 if phase == "reduce-scatter" else 0
            sent = [(r, (r - step - offset) % p, holds[r][(r - step - offset) % p]) for r in range(p)]
            for sender, chunk, data in sent:
                rank = (sender + 1) % p
                holds[rank][chunk] = holds[rank][chunk] | data if phase == "reduce-scatter" else data
                transfers.append(Transfer(phase=phase, step=step, rank=rank, chunk=chunk, holds=holds[rank][chunk]))
    return transfers


def ring_table(world_size: int) -> str:
    """One line per step, one column per rank: `c2 ← {0,1,3}` = received chunk 2, now the sum of
    ranks 0, 1 and 3's chunk 2 (`= all` once all p ranks are in)."""
    p = world_size
    width = max(12, 3 * p + 8)
    lines = ["step".ljust(18) + "".join(f"rank {r}".ljust(width) for r in range(p))]
    transfers = ring_steps(p)
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(p - 1):
            row = {t.rank: t for t in transfers if t.phase == phase and t.step == step}
            cells = []
            for r in range(p):
                t = row[r]
                who = "all" if len(t.holds) == p else "{" + ",".join(map(str, sorted(t.holds))) + "}"
                cells.append(f"c{t.chunk} <- {who}".ljust(width))
            lines.append(f"{'RS' if phase == 'reduce-scatter' else 'AG'} step {step}".ljust(18) + "".join(cells))
    return "\n".join(lines)
