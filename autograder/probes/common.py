"""What several probes share: `call(stem, function, *args, **kwargs)` (the probe of every suite that
only calls functions), `as_data`, and the byte counter of the ranks (`install_send_counter`)."""

from __future__ import annotations

import contextlib
import dataclasses
import types

from autograder.checks import student_module


def as_data(value):
    """A dataclass becomes {"__dataclass__": name, "fields": {...}}: the trusted side rebuilds the
    *reference* class from the fields, so no student property ever runs there."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__dataclass__": type(value).__name__,
                "fields": {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}}
    return value


def call(stem: str, function: str, *args, **kwargs):
    return as_data(getattr(student_module(stem), function)(*args, **kwargs))


class SentBytes:
    """Bytes of the tensors this rank hands to torch.distributed.isend / send."""

    def __init__(self):
        self.total = 0

    def since(self, mark: int) -> int:
        return self.total - mark

    @contextlib.contextmanager
    def phase(self):
        """`with sent.phase() as box:` ... `box.bytes` is what the block sent."""
        box = types.SimpleNamespace(start=self.total, bytes=0)
        try:
            yield box
        finally:
            box.bytes = self.total - box.start


def install_send_counter() -> SentBytes:
    """Count below the student's code: install before the student's files bind any name of
    torch.distributed (a name bound earlier would skip the wrapper)."""
    import torch.distributed as dist

    sent = SentBytes()
    for name in ("isend", "send"):
        original = getattr(dist, name)

        def wrapper(tensor, *args, __original=original, **kwargs):
            sent.total += tensor.numel() * tensor.element_size()
            return __original(tensor, *args, **kwargs)

        wrapper.__name__ = wrapper.__qualname__ = name
        wrapper.__doc__ = original.__doc__
        setattr(dist, name, wrapper)
    return sent
