"""Asynchronous allreduce for DataParallel: start it now, `.wait()` for it later.

DataParallel takes `allreduce=`:
  * "ring"  – `scaletrain.comm.ring_allreduce` (our ring, assignment a2) run by `RingAllreduceThread`;
  * "torch" – `dist.all_reduce(t, async_op=True)`: gloo's own ring on gloo's worker threads
              (NCCL's kernels on a GPU);
  * a callable `f(flat_tensor) -> handle`: sums `flat_tensor` in place over the data-parallel
    ranks; `handle.wait()` blocks until done. A callable that returns something without `.wait`
    (e.g. `lambda t: ring_allreduce(t)`, which returns the tensor) is taken as synchronous.
All of them *sum*; DataParallel divides by the number of ranks itself.

Who drives the ring's progress. Our ring is a loop of blocking point-to-point steps
(2(p-1) of them, ring.py); if the hook that launches a bucket ran that loop, backward would stop
until the bucket was reduced: no overlap. So `RingAllreduceThread` is a `CommThread`
(comm/thread.py, its own process group and its GIL caveat): it takes buckets in launch order and
runs the ring on them while autograd keeps computing on the main thread; `__call__` only enqueues
and returns a `torch.futures.Future`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from scaletrain.comm import ring_allreduce
from scaletrain.comm.thread import CommThread

__all__ = ["AsyncAllreduce", "torch_allreduce", "RingAllreduceThread", "make_allreduce", "ALLREDUCE_KINDS",
           "DEFAULT_ALLREDUCE"]

AsyncAllreduce = Callable[[torch.Tensor], Any]  # flat tensor -> handle with .wait() (or None: done)
ALLREDUCE_KINDS = ("ring", "torch")
DEFAULT_ALLREDUCE = "ring"  # every wrapper's default: the ring of assignment a2, what this module builds on


def torch_allreduce(group: Any = None) -> AsyncAllreduce:
    """`dist.all_reduce(tensor, SUM, async_op=True)` on `group`: returns gloo's/NCCL's Work."""
    return lambda tensor: dist.all_reduce(tensor, group=group, async_op=True)


class RingAllreduceThread(CommThread):
    """Run `ring_allreduce` (sum) on a background thread, one tensor at a time, in submission order.

    Every rank of `group` must create it at the same point, submit the same tensors in the same
    order, and `close()` it (CommThread's contract).
    """

    def __init__(self, *, group: Any = None, timeout_s: float = 300.0):
        super().__init__(group=group, timeout_s=timeout_s, name="ring-allreduce")

    def __call__(self, tensor: torch.Tensor) -> torch.futures.Future:
        return self.submit(lambda group: ring_allreduce(tensor, op="sum", group=group))


def make_allreduce(allreduce: str | AsyncAllreduce, *, group: Any = None,
                   timeout_s: float = 300.0) -> tuple[AsyncAllreduce, Callable[[], None]]:
    """(allreduce function, close function) for a DataParallel's `allreduce=` argument."""
    if callable(allreduce):
        return allreduce, lambda: None
    if allreduce == "torch":
        return torch_allreduce(group), lambda: None
    if allreduce == "ring":
        runner = RingAllreduceThread(group=group, timeout_s=timeout_s)
        return runner, runner.close
    raise ValueError(f"allreduce must be one of {ALLREDUCE_KINDS} or a callable "
                     f"f(flat_tensor) -> handle with .wait(), got {allreduce!r}")
