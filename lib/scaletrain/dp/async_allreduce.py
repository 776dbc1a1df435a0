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
until the bucket was reduced: no overlap. So `RingAllreduceThread` owns a background thread that
takes buckets from a FIFO queue, in launch order, and runs the ring on them while autograd keeps
computing on the main thread; `__call__` only enqueues and returns a `torch.futures.Future`.
The thread has its own process group (`dist.new_group`), so its messages can never be matched
with a collective the main thread runs at the same time (a loss allreduce, a barrier).

GIL caveat: the comm thread needs the GIL only between ring steps (a few µs); gloo's waits and
torch's additions release it, and so does the autograd engine while it computes. The Python
gradient hooks and the ring's loop still take turns on the GIL, and on a CPU machine both threads
and gloo's own threads share the same cores: overlap hides waiting (latency, a slower peer), not
CPU work. On a GPU the compute runs on the device and the overlap is real.
"""

from __future__ import annotations

import datetime
import queue
import threading
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["AsyncAllreduce", "torch_allreduce", "RingAllreduceThread", "make_allreduce", "ALLREDUCE_KINDS",
           "DEFAULT_ALLREDUCE"]

AsyncAllreduce = Callable[[torch.Tensor], Any]  # flat tensor -> handle with .wait() (or None: done)
ALLREDUCE_KINDS = ("ring", "torch")
DEFAULT_ALLREDUCE = "ring"  # every wrapper's default: the ring of assignment a2, what this module builds on


def torch_allreduce(group: Any = None) -> AsyncAllreduce:
    """`dist.all_reduce(tensor, SUM, async_op=True)` on `group`: returns gloo's/NCCL's Work."""
    return lambda tensor: dist.all_reduce(tensor, group=group, async_op=True)


class RingAllreduceThread:
    """Run `ring_allreduce` on a background thread, one tensor at a time, in submission order.

    Every rank of `group` must create it at the same point (creating its process group is a
    collective of `group`'s ranks), submit the same tensors in the same order, and `close()` it.
    """

    def __init__(self, *, group: Any = None, timeout_s: float = 300.0):
        from scaletrain.comm import ring_allreduce  # imported here: comm is only needed for "ring"

        self._ring_allreduce = ring_allreduce
        ranks = None if group is None else dist.get_process_group_ranks(group)
        # a subgroup's members create the copy among themselves: other ranks need not take part
        self.group = dist.new_group(ranks=ranks, timeout=datetime.timedelta(seconds=timeout_s),
                                    use_local_synchronization=ranks is not None)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="ring-allreduce", daemon=True)
        self._thread.start()

    def __call__(self, tensor: torch.Tensor) -> torch.futures.Future:
        if not self._thread.is_alive():
            raise RuntimeError("RingAllreduceThread is closed; create a new one")
        future: torch.futures.Future = torch.futures.Future()
        self._jobs.put((tensor, future))
        return future

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            tensor, future = job
            try:
                self._ring_allreduce(tensor, op="sum", group=self.group)
            except BaseException as exc:  # noqa: BLE001 - hand every failure to the waiting thread
                future.set_exception(exc)
            else:
                future.set_result(tensor)

    def close(self) -> None:
        """Finish the queued work, stop the thread and destroy its process group."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
            if dist.is_initialized():
                dist.destroy_process_group(self.group)


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
