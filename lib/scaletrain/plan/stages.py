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

Which of them a run should use follows from how heavy the ends are. The last stage's extra work
is the output layer, 2·b·s·h·V FLOPs against a layer's (Narayanan et al. 2021, eq. 3's last
term against its first): `head_layers` says how many layers its forward is worth, 0.34 for
GPT-3 175B, 0.6 for Llama 3 405B, 1.4 for BLOOM (V = 250,880), 1.8 for Llama 3 8B. Per
microbatch it weighs less, since the head is never recomputed (3 passes against a layer's 4
under full recomputation: `time_model.slowest_stage`). The search (`stage_options`) tries every
first/last map whose end stages give up at most ⌈head_layers⌉ layers (giving up more only moves
work onto the middle stages) and lets the time model pick: BLOOM's head, 1.07 layers per
microbatch, is what the balanced split takes off its last stage (6 × 11, 4 is 0.3 % faster, for
4.8 GB more on the first stage); a head worth several layers (a large vocabulary, few layers per
stage) wants a last stage lighter still (tests/test_plan_stages.py).

Padding, the alternative, rounds l up to a multiple of p with idle layers: every stage then
costs ⌈l/p⌉ layers, the last one a logit layer more.
"""

from __future__ import annotations

from math import ceil

from scaletrain.plan.flops import layer_forward_flops, logit_forward_flops
from scaletrain.plan.model_spec import ModelSpec

__all__ = ["even_stages", "first_last_stages", "balanced_stages", "head_layers", "first_last_options",
           "stage_options"]


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


def head_layers(model: ModelSpec) -> float:
    """The output layer's forward FLOPs in layers: 2·b·s·h·V over one layer's (`flops.py`); what
    the time model adds to the last stage (`time_model.slowest_stage`)."""
    return logit_forward_flops(model, 1) / layer_forward_flops(model, 1)


def first_last_options(layers: int, pp: int, shed: int) -> list[tuple[int, ...]]:
    """Megatron's first/last maps (`first_last_stages`) whose end stages hold q - shed to q layers,
    q the middle stages' count; with p = 2, the splits whose two stages differ by at most shed.
    The even split is left out (it is `None`)."""
    if pp == 1:
        return []
    if pp == 2:
        return [(f, layers - f) for f in range(1, layers) if 0 < abs(2 * f - layers) <= shed]
    found = []
    for q in range(ceil(layers / pp), (layers - 2) // (pp - 2) + 1):
        rest = layers - (pp - 2) * q
        for first in range(max(1, q - shed, rest - q), min(q, rest - max(1, q - shed)) + 1):
            if (first, rest - first) != (q, q):
                found.append(first_last_stages(layers, pp, first=first, last=rest - first))
    return found


def stage_options(model: ModelSpec, pp: int, interleave: int = 1) -> list[tuple[int, ...] | None]:
    """The stage maps the search tries for p stages of v chunks: None (even) when p·v divides l;
    the balanced split when p divides l + 2 exactly (Megatron's case; otherwise it only moves a
    remainder onto some middle stage); the first/last maps whose end stages give up at most
    ⌈head_layers⌉ layers (at least 1; module docstring). Each stage must hold at least v layers;
    each map once."""
    layers = model.layers
    options: list[tuple[int, ...] | None] = []
    if layers % (pp * interleave) == 0:
        options.append(None)
    balanced = balanced_stages(layers, pp) if pp > 1 and (layers + 2) % pp == 0 else None
    shed = max(1, ceil(head_layers(model)))
    for stages in (balanced, *first_last_options(layers, pp, shed)):
        if stages is not None and len(set(stages)) > 1 and min(stages) >= interleave and stages not in options:
            options.append(stages)
    return options
