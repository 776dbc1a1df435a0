"""Timestamps of one training step: when each gradient arrived, each bucket launched and finished.

This is the evidence for overlap: if bucket 0's allreduce is *launched* before the last gradient
of backward arrives, communication ran while autograd was still computing (Li et al., 2020,
PyTorch DDP §3.2.3, Fig. 3; seminar notes, "Data parallel", overlap). `plot_timeline` draws it.

Events are (kind, key, t) with t from `time.perf_counter()` (one clock per process):
  "backward_start" / "backward_end"  – recorded by the training loop around `loss.backward()`
  "grad"   key = parameter index     – its post-accumulate-grad hook ran
  "launch" key = bucket index        – its allreduce was started
  "done"   key = bucket index        – its allreduce completed (callback on the handle's future;
                                       may run on a communication thread, hence the lock)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Event", "Trace", "plot_timeline"]


@dataclass(frozen=True)
class Event:
    kind: str
    key: Any
    t: float


class Trace:
    """A thread-safe list of `Event`s of one process; `clear()` it at the start of each step."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def __getstate__(self):  # picklable, so a rank can return its trace to the parent
        with self._lock:
            return {"events": list(self.events)}

    def __setstate__(self, state):
        self.events, self._lock = list(state["events"]), threading.Lock()

    def copy(self) -> "Trace":
        clone = Trace()
        clone.__setstate__(self.__getstate__())
        return clone

    def record(self, kind: str, key: Any = None) -> None:
        with self._lock:
            self.events.append(Event(kind, key, time.perf_counter()))

    def on_done(self, handle: Any, kind: str, key: Any) -> None:
        """Record `kind` when `handle` (torch Work or torch Future) completes; anything else
        (None, a tensor: the allreduce ran synchronously) is done already and recorded now."""
        future = handle.get_future() if hasattr(handle, "get_future") else handle
        if isinstance(future, torch.futures.Future):
            future.add_done_callback(lambda _: self.record(kind, key))
        else:  # a synchronous allreduce returned a tensor or None: it is already done
            self.record(kind, key)

    def clear(self) -> None:
        with self._lock:
            self.events.clear()

    def of(self, kind: str) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e.kind == kind]

    def first(self, kind: str, key: Any = None) -> float:
        hits = [e.t for e in self.of(kind) if key is None or e.key == key]
        if not hits:
            raise KeyError(f"Trace: no {kind!r} event" + (f" for {key!r}" if key is not None else ""))
        return hits[0]

    def launches_before_last_grad(self) -> int:
        """How many bucket launches happened while gradients were still arriving (overlap)."""
        grads = self.of("grad")
        if not grads:
            return 0
        last_grad = grads[-1].t
        return sum(1 for e in self.of("launch") if e.t < last_grad)


def plot_timeline(ax, trace: Trace, *, row: float = 0.0, label: str = "", t0: float | None = None):
    """Draw one step on `ax` (a matplotlib Axes): backward as a grey bar, each bucket's allreduce
    from launch to done as a coloured bar, gradient arrivals as ticks, and the step's end (when
    `finish_gradient_synchronization()` returned) as a black bar across the row. Times in ms from `t0`."""
    t0 = trace.first("backward_start") if t0 is None else t0
    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    bwd0, bwd1 = ms(trace.first("backward_start")), ms(trace.first("backward_end"))
    ax.broken_barh([(bwd0, bwd1 - bwd0)], (row + 0.5, 0.3), color="0.75")
    ax.vlines([ms(e.t) for e in trace.of("grad")], row + 0.5, row + 0.8, color="0.3", lw=0.6)
    done = {e.key: e.t for e in trace.of("done")}
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    for e in trace.of("launch"):
        end = ms(done.get(e.key, e.t))
        ax.broken_barh([(ms(e.t), max(end - ms(e.t), 0.05))], (row + 0.1, 0.35),
                       color=colors[e.key % len(colors)])
    finish = [e.t for e in trace.of("finish_end")]
    if finish:  # the step ends here: everything right of backward's end up to this line is exposed
        ax.vlines(ms(finish[0]), row + 0.05, row + 0.85, color="black", lw=2.5)
    ax.text(0, row + 0.84, label, fontsize=11, va="bottom")
    return ax
