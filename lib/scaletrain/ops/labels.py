"""The name a call of scaletrain.ops carries in a profiler trace: `scaletrain::<op>`.

A Triton or CUDA kernel launched from Python has no aten op above it, so `torch.profiler` shows
its kernels but no operation to charge them to: module 11's profile of the hand-fused GPT
(`python -m scaletrain.profile --model fused`) would file their time as "between ops".  Each
public op of this package runs its autograd Function inside `labelled(op)`, a `record_function`
range while a profiler records; the profile counts such ranges as operations
(scaletrain/profile/trace.py) and categorises them by the op's name.  With no profiler recording
it is a no-op: a `record_function` costs ~16 µs a call here, half of a small op's whole call, and
the host's share of a call is what the small kernels' timings are about (ops/benchmark.py).
"""

from __future__ import annotations

import contextlib

from torch._C._autograd import _profiler_enabled  # torch's own switch: True while a profiler records
from torch.profiler import record_function

__all__ = ["PREFIX", "labelled"]

PREFIX = "scaletrain::"
_OFF = contextlib.nullcontext()


def labelled(op: str) -> contextlib.AbstractContextManager:
    """The profiler range of one call of scaletrain.ops' `op` (use as a context manager); nothing
    while no profiler records."""
    return record_function(PREFIX + op) if _profiler_enabled() else _OFF
