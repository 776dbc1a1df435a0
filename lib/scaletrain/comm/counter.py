"""Count what this rank sends: the evidence behind "the ring sends 2(p-1)/p·n bytes per rank".

Every point-to-point send in scaletrain calls `record_send(nbytes)`; `comm_counter()` collects those
calls made by *this process* (one rank) while the `with` block runs, from any thread (a background
comm thread's sends included). Counters nest: an outer counter sees everything an inner one sees.
`comm_counter(this_thread=True)` sees only the sends of the thread that opened it: an engine that
sends from two threads counts each byte once by opening one such counter on each.

What one "message" is: one logical chunk handed to the peer. The ring splits a chunk into segments
to overlap transfer and reduction (ring.py), but records the chunk once, with its full byte count,
so the figures match the unsegmented analysis: allreduce sends 2(p-1) messages of ⌈n/p⌉·itemsize
bytes per rank, however it is segmented ("Large scale deep learning optimizations" seminar, §1.2.5.2).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Iterator

__all__ = ["CommStats", "comm_counter", "record_send"]


@dataclass
class CommStats:
    """Bytes and messages this rank sent inside one `comm_counter()` block."""
    bytes_sent: int = 0
    messages: int = 0
    thread: int | None = field(default=None, repr=False, compare=False)  # None: every thread's sends


_active: list[CommStats] = []  # open counters of this process, outermost first


def record_send(nbytes: int, messages: int = 1) -> None:
    """Record `messages` logical messages carrying `nbytes` payload bytes in total (call once per send)."""
    if nbytes < 0 or messages < 0:
        raise ValueError(f"record_send: nbytes and messages must be >= 0, got {nbytes}, {messages}")
    me = threading.get_ident()
    for stats in [s for s in _active if s.thread in (None, me)]:
        stats.bytes_sent += int(nbytes)
        stats.messages += int(messages)


@contextlib.contextmanager
def comm_counter(*, this_thread: bool = False) -> Iterator[CommStats]:
    """`with comm_counter() as c: ring_allreduce(x)` then `c.bytes_sent`, `c.messages` (this rank only;
    with this_thread=True, only what the calling thread sends)."""
    stats = CommStats(thread=threading.get_ident() if this_thread else None)
    _active.append(stats)
    try:
        yield stats
    finally:  # by identity: two counters with equal counts are still different counters
        del _active[next(i for i, s in enumerate(_active) if s is stats)]
