"""peak_allocated(fn): the most bytes the ops inside fn() held at once, on a CPU as on a GPU.

    loss, peak = peak_allocated(lambda: criterion(h, w, y).backward())

On a GPU it is the caching allocator's own figure (torch.cuda.max_memory_allocated, less what was
allocated before).  A CPU has no such counter, so every aten op is watched (a TorchDispatchMode,
as traffic.count_traffic does): a storage an op returns that none of its inputs owns is a new
allocation, counted until Python frees it (a weakref finalizer on the storage, which fires when
the last view or saved copy of it goes, autograd's included).  Views and in-place results share
an input's storage and count nothing; tensors made before the call count nothing.  What is not
seen: an op's internal workspace freed before it returns, and allocator caching.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["peak_allocated"]


class _LiveStorages(TorchDispatchMode):
    """Bytes of the storages ops created and Python still holds; `peak` is their maximum."""

    def __init__(self):
        super().__init__()
        self.bytes = self.peak = 0
        self.live: set[int] = set()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # else torch wraps __torch_dispatch__ and imports dynamo (~2.5 s)
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        owned = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in owned:
                self._allocated(t.untyped_storage())
        return out

    def _allocated(self, storage: torch.UntypedStorage) -> None:
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if key in self.live or nbytes == 0:
            return
        self.live.add(key)
        self.bytes += nbytes
        self.peak = max(self.peak, self.bytes)
        weakref.finalize(storage, self._freed, key, nbytes)

    def _freed(self, key: int, nbytes: int) -> None:
        self.live.discard(key)
        self.bytes -= nbytes


def peak_allocated(fn: Callable[[], Any], device: str = "cpu") -> tuple[Any, int]:
    """(fn(), the peak bytes allocated while it ran beyond what was allocated before)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        result = fn()
        torch.cuda.synchronize()
        return result, torch.cuda.max_memory_allocated() - before
    with _LiveStorages() as watch:
        result = fn()
    return result, watch.peak
