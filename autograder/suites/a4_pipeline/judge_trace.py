"""a4 task 4.4: reading the executor's trace. The probe's wrappers around the stage modules record
every forward (its stage and input), every gradient reaching a stage output and every
weight-gradient accumulation; here that trace is turned back into actions and compared with the
schedule the executor was given, so a reason can say what ran instead."""

from __future__ import annotations

from .inputs_executor import _Case


def _microbatch_of(case: _Case, stage: int, x) -> int | None:
    """Which microbatch's input `x` is, for `stage` (the trace holds inputs, not indices)."""
    import torch
    if not isinstance(x, torch.Tensor) or not 0 <= stage < len(case.inputs):
        return None
    for i, ref in enumerate(case.inputs[stage]):
        if x.shape == ref.shape and x.dtype == ref.dtype and torch.allclose(x, ref, rtol=1e-4, atol=1e-5):
            return i
    return None


def _tokens(case: _Case, events: list) -> list[tuple]:
    """The trace as (kind, stage, microbatch): F a forward, G a gradient reaching a stage's
    output (B or I), A one weight-gradient accumulation (B or W; microbatch unknown)."""
    tokens, forward_of = [], {}
    for n, event in enumerate(events):
        kind, stage = event[0], event[1]
        if kind == "F":
            forward_of[n] = _microbatch_of(case, stage, event[2])
            tokens.append(("F", stage, forward_of[n]))
        elif kind == "G":
            tokens.append(("G", stage, forward_of.get(event[2])))
        elif kind == "A":
            tokens.append(("A", stage, None))
        else:
            raise ValueError(f"unknown event {kind!r}")
    return tokens


def _shown(case: _Case, tokens: list[tuple], split: bool) -> list[str]:
    """The trace as actions, for a reason: G + its accumulations = B (I, then W, when the step
    splits the backward; a W's microbatch is not in the trace)."""
    shown, k = [], 0

    def accumulations(stage, k):  # one action's weight gradients: one per parameter of the stage
        for _ in range(case.n_params[stage] if isinstance(stage, int) and 0 <= stage < len(case.n_params) else 1):
            if k < len(tokens) and tokens[k][:2] == ("A", stage):
                k += 1
        return k

    while k < len(tokens):
        kind, stage, i = tokens[k]
        mb = "?" if i is None else i
        k += 1
        if kind == "A":
            k = accumulations(stage, k - 1)
            shown.append(f"W?@s{stage}" if split else f"(weight gradients of s{stage})")
        elif kind == "G":
            if not split:
                k = accumulations(stage, k)
            shown.append(f"{'I' if split else 'B'}{mb}@s{stage}")
        else:
            shown.append(f"F{mb}@s{stage}")
    return shown


def _order_problem(case: _Case, rank: int, events: list) -> str | None:
    """Whether rank `rank` ran its schedule's actions in the schedule's order, read from the trace."""
    from scaletrain.pipeline import B, F, I
    tokens = _tokens(case, events)
    actions = case.schedule[rank]
    split = any(a.kind == I for a in actions)
    k = 0
    for pos, a in enumerate(actions):
        want = ("F" if a.kind == F else "G" if a.kind in (B, I) else "A", a.stage,
                None if a.kind not in (F, B, I) else a.microbatch)
        ok = k < len(tokens) and tokens[k] == want
        if ok:
            k += 1
            if a.kind not in (F, I):  # B and W: this stage's weight gradients (one per parameter)
                for _ in range(case.n_params[a.stage] - (a.kind != B)):
                    if k < len(tokens) and tokens[k][:2] == ("A", a.stage):
                        k += 1
            continue
        ran = _shown(case, tokens, split)
        done = len(_shown(case, tokens[:k], split))
        return (f"{case.label}, rank {rank}, action #{pos}: the schedule has {[str(b) for b in actions[pos:pos + 4]]}, "
                f"the executor ran {ran[done:done + 4] or 'nothing more'} (it must run the actions of the "
                f"schedule it is given, in its order)")
    if k < len(tokens):
        extra = _shown(case, tokens[k:], split)
        return f"{case.label}, rank {rank}: after its last action the executor still ran {extra[:4]}"
    return None
