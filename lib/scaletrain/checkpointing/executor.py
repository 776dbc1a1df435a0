"""Run a checkpointing plan on real stages, and record which F/B operations actually ran.

The plan tree maps onto autograd directly: a Store is a stage run with grad (its tape recorded,
F^e; autograd runs B_s when the gradient of its output arrives), a Split is the `checkpoint`
Function of `function.py` around "run `first`": its forward runs stages s..k-1 under no_grad
(F_s^c keeps x_{s-1} in `save_for_backward`, F^n keep nothing), its backward runs `first` again
with grad, which may itself contain Splits (Rotor's nested recomputations). So

    loss = run_plan(plan, stages, idx); loss.backward()

performs `schedule.ops(plan)` in that order, which `record_ops` checks from the outside with
module hooks, and holds at most `schedule.simulate(plan, chain).peak_bytes` saved bytes, which
`tests/test_checkpointing.py` measures with `scaletrain.memory_measure.track_saved_tensors`.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Sequence

import torch
import torch.nn as nn

from scaletrain.checkpointing.function import checkpoint
from scaletrain.checkpointing.schedule import Op, Plan, Store, span, validate

__all__ = ["run_plan", "record_ops"]


def _run(node: Plan, stages: Sequence[nn.Module], x, ckpt: Callable):
    if not torch.is_grad_enabled():      # the first pass of a Split: F^c F^n … with nothing recorded
        s, t = span(node)
        for i in range(s, t + 1):
            x = stages[i](x)
        return x
    if isinstance(node, Store):
        y = stages[node.stage](x)
        return y if node.rest is None else _run(node.rest, stages, y, ckpt)
    y = ckpt(functools.partial(_run, node.first, stages, ckpt=ckpt), x)
    return _run(node.rest, stages, y, ckpt)


def run_plan(plan: Plan, stages: Sequence[nn.Module], x, *, checkpoint_fn: Callable = checkpoint):
    """The forward of `stages` (the last returns the loss) following `plan`; `.backward()` on the
    result runs the rest of the plan's sequence. `checkpoint_fn(fn, x)` implements the Splits
    (the benchmark passes torch.utils.checkpoint's reentrant mode to compare)."""
    validate(plan, len(stages))
    return _run(plan, stages, x, checkpoint_fn)


@contextlib.contextmanager
def record_ops(stages: Sequence[nn.Module]):
    """Yield a list that fills with the Ops the stages perform while the block runs.

    F: a forward pre-hook on each stage; its mode is "e" with grad enabled, else "c" when the
    stage starts a no-grad pass (its input is the checkpoint: stage 0, or a tensor that requires
    grad), else "n". B: a hook on the stage's output, fired when its gradient arrives (B_i starts).
    """
    seen: list[Op] = []
    handles = []

    def pre(i, _module, args):
        x = args[0] if args else None
        if torch.is_grad_enabled():
            seen.append(Op("F", i, "e"))
        else:
            starts = i == 0 or (isinstance(x, torch.Tensor) and x.requires_grad)
            seen.append(Op("F", i, "c" if starts else "n"))

    def post(i, _module, _args, out):
        if torch.is_grad_enabled() and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g: seen.append(Op("B", i)))

    for i, stage in enumerate(stages):
        handles.append(stage.register_forward_pre_hook(functools.partial(pre, i)))
        handles.append(stage.register_forward_hook(functools.partial(post, i)))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()
