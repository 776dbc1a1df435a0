"""Which layers each pipeline stage holds: even splits and Megatron's uneven ones.

A pipeline runs at its slowest stage's pace. The first stage also runs the embedding and the last
the output layer and the loss, so an even split of l layers over p stages leaves the last stage
the slowest (and, for a large vocabulary, the first the fullest). Megatron-LM offers two remedies,
both here as stage maps (`Layout.stages`):

- `first_last_stages(l, p, first=, last=)`: fixed layer counts on the first and last stage, the
  rest split evenly (Megatron-Core's `--decoder-first-pipeline-num-layers` / `--decoder-last-...`).
- `balanced_stages(l, p)`: count the embedding and the loss as one layer each and split the l + 2
  evenly (`--account-for-embedding-in-pipeline-split`, `--account-for-loss-in-pipeline-split`):
  Llama 3 405B's 126 layers on 16 stages are 7, 8 × 14, 7 (Dubey et al. 2024, §3.3.2), BLOOM's
  70 on 12 are 5, 6 × 10, 5 (Le Scao et al. 2022, §3.4; Megatron-DeepSpeed's
  `type:transformer|embedding` partition).

Padding, the alternative, rounds l up to a multiple of p with idle layers: every stage then
costs ⌈l/p⌉ layers, the last one a logit layer more.
"""

from __future__ import annotations

__all__ = ["even_stages", "first_last_stages", "balanced_stages", "stage_options"]


def even_stages(layers: int, pp: int) -> tuple[int, ...] | None:
    """l/p layers each, or None when p does not divide l."""
    return None if layers % pp else (layers // pp,) * pp


def first_last_stages(layers: int, pp: int, *, first: int, last: int) -> tuple[int, ...] | None:
    """`first` and `last` layers on the end stages, the rest evenly; None when that cannot be."""
    if pp == 1:
        return (layers,) if first == last == layers else None
    rest, middle = layers - first - last, pp - 2
    if first < 1 or last < 1 or rest < middle or (middle and rest % middle) or (not middle and rest):
        return None
    return (first, *([rest // middle] * middle), last)


def balanced_stages(layers: int, pp: int) -> tuple[int, ...] | None:
    """The l + 2 'layers' (embedding and loss counted as one each) split as evenly as can be, the
    end stages giving up the slot their extra work takes; None when a stage would be empty."""
    if pp == 1:
        return (layers,)
    q, r = divmod(layers + 2, pp)
    slots = [q + (1 if 0 < i <= r else 0) for i in range(pp)]  # remainders go to the middle stages
    slots[0] -= 1
    slots[-1] -= 1
    return tuple(slots) if min(slots) >= 1 and sum(slots) == layers else None


def stage_options(layers: int, pp: int, interleave: int = 1) -> list[tuple[int, ...] | None]:
    """The stage maps the search tries for p stages of v chunks: None (even) when p·v divides l,
    and the balanced split when p divides l + 2 exactly (Megatron's case; otherwise it only moves
    a remainder onto some middle stage); each stage must hold at least v layers."""
    options: list[tuple[int, ...] | None] = []
    if layers % (pp * interleave) == 0:
        options.append(None)
    balanced = balanced_stages(layers, pp) if pp > 1 and (layers + 2) % pp == 0 else None
    if balanced is not None and min(balanced) >= interleave:
        options.append(balanced)
    return options
