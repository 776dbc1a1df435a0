"""A communication thread: run collectives in the background, in submission order, on a group of its own.

Our collectives are loops of blocking point-to-point steps (ring.py). To overlap one with compute
(DDP's bucket allreduce during backward, ZeRO-3's prefetch of the next unit's parameters), a
background thread runs the loop while the main thread keeps computing; the caller gets a
`torch.futures.Future` and waits on it when it needs the result. The thread's process group is
its own (`dist.new_group`), so its messages can never be matched with a collective the main thread
runs at the same time on the original group: this is the CPU analogue of NCCL's separate
communication stream.

GIL caveat: the thread needs the GIL only between ring steps; gloo's waits and torch's kernels
release it. On a CPU machine both threads share the cores, so overlap hides waiting (latency, a
slower peer), not CPU work; on a GPU the compute runs on the device and the overlap is real.
"""

from __future__ import annotations

import datetime
import queue
import threading
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["CommThread"]

# process groups of closed CommThreads, by the ranks they span, for the next CommThread to reuse
_IDLE: dict[tuple[int, ...] | None, list[Any]] = {}


def _thread_group(group: Any, timeout_s: float) -> Any:
    """A process group over `group`'s ranks for a comm thread: one a closed CommThread gave back
    (every rank runs the same program, so all of them take the same one), else a new one.

    Why closed threads give their group back instead of destroying it: torch names a subgroup made
    with `use_local_synchronization` by hashing its ranks with the number of live groups, so a
    group destroyed and another created would share a name, and the new one would find the old
    one's socket addresses in the store ("Connection refused")."""
    ranks = None if group is None else tuple(dist.get_process_group_ranks(group))
    idle = _IDLE.setdefault(ranks, [])
    while idle:
        reused = idle.pop()
        try:
            dist.get_process_group_ranks(reused)  # still alive (the world was not torn down since)?
            return reused
        except (KeyError, ValueError, RuntimeError):
            continue
    # a subgroup's members create the copy among themselves: other ranks need not take part
    return dist.new_group(ranks=None if ranks is None else list(ranks),
                          timeout=datetime.timedelta(seconds=timeout_s), use_local_synchronization=ranks is not None)


class CommThread:
    """Run `job(group)` callables on a background thread, one at a time, in submission order.

    Every rank of `group` must create it at the same point (creating its process group is a
    collective of `group`'s ranks), submit matching jobs in the same order, and `close()` it.
    Its group keeps the timeout it was created with when a later CommThread reuses it.
    """

    def __init__(self, *, group: Any = None, timeout_s: float = 300.0, name: str = "comm"):
        self._parent = None if group is None else tuple(dist.get_process_group_ranks(group))
        self.group = _thread_group(group, timeout_s)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[Any], Any]) -> torch.futures.Future:
        """Queue `job(self.group)`; the future holds its return value or its exception."""
        if not self._thread.is_alive():
            raise RuntimeError(f"{self._thread.name} thread is closed; create a new one")
        future: torch.futures.Future = torch.futures.Future()
        self._jobs.put((job, future))
        return future

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, future = item
            try:
                result = job(self.group)
            except BaseException as exc:  # noqa: BLE001 - hand every failure to the waiting thread
                future.set_exception(exc)
            else:
                future.set_result(result)

    def close(self) -> None:
        """Finish the queued work, stop the thread and give its process group back for reuse."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
            _IDLE.setdefault(self._parent, []).append(self.group)
