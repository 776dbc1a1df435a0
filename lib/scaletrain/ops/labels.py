"""The name a call of scaletrain.ops carries in a profiler trace: `scaletrain::<op>`.

A Triton or CUDA kernel launched from Python has no aten op above it, so `torch.profiler` shows
its kernels but no operation to charge them to: module 11's profile of the hand-fused GPT
(`python -m scaletrain.profile --model fused`) would file their time as "between ops".  Each
public op of this package runs its autograd Function inside `record_function(PREFIX + op)`; the
profile counts such ranges as operations (scaletrain/profile/trace.py) and categorises them by the
op's name.  With the profiler off a range costs about a microsecond.
"""

from __future__ import annotations

from torch.profiler import record_function

__all__ = ["PREFIX", "labelled"]

PREFIX = "scaletrain::"


def labelled(op: str) -> record_function:
    """The profiler range of one call of scaletrain.ops' `op` (use as a context manager)."""
    return record_function(PREFIX + op)
