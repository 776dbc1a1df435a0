"""The starting point of data parallelism: one allreduce per parameter, after backward.

Data parallelism (seminar notes, "Data parallel"; techniques notes, "Data Parallelism"): every
rank holds the whole model, runs forward and backward on its own slice of the batch, and the ranks
average their gradients so that every replica takes the same optimizer step. Averaging gradients
(not parameters) keeps optimizers with local state (Adam's moments) identical across ranks.
With the mean-reduced loss on each rank's b examples, the average over p ranks of the local
gradients is exactly the gradient of the mean loss over the concatenated p·b examples:

    g = (1/p) Σ_r ∇ (1/b) Σ_{i ∈ batch_r} ℓ_i  =  ∇ (1/(p·b)) Σ_{i ∈ all} ℓ_i

`NaiveDataParallel` does the obvious thing: after `loss.backward()` returns, allreduce each
parameter's gradient, one at a time. It pays the per-message latency α once per parameter
(~2(p-1)·α each on a ring) and communicates only after backward is over. `DataParallel`
(data_parallel.py) removes both costs: buckets and overlap.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn

from scaletrain.dp.async_allreduce import DEFAULT_ALLREDUCE, AsyncAllreduce, make_allreduce
from scaletrain.dp.trace import Trace

__all__ = ["broadcast_module", "Replicated", "NaiveDataParallel"]


def broadcast_module(module: nn.Module, group: Any = None) -> None:
    """Copy group rank 0's parameters and buffers to every rank of `group`, in place.

    Replicas must start identical, else the same averaged gradient moves them to different
    places. One `dist.broadcast` per tensor (a collective, not the lesson here: it runs once).
    """
    if not dist.is_initialized():
        raise RuntimeError("data parallelism needs a process group: run inside "
                           "scaletrain.launch.spawn(fn, p) or call dist.init_process_group first")
    src = dist.get_global_rank(group or dist.group.WORLD, 0)
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=src, group=group)


class Replicated(nn.Module):
    """What every data-parallel wrapper shares: `module` copied from group rank 0 on every rank,
    a forward that is the module's, `no_sync()`, inside which backward passes only accumulate
    into .grad (`require_backward_grad_sync` is False: the subclass's synchronization skips), and
    torch DDP's answer for parameters a step did not use (`_used_here`, `_unused_to_none`)."""

    def __init__(self, module: nn.Module, group: Any = None):
        super().__init__()
        broadcast_module(module, group)  # first: it says clearly when there is no process group
        self.module = module
        self.group = group
        self.dp_rank, self.dp_world_size = dist.get_rank(group), dist.get_world_size(group)
        self.require_backward_grad_sync = True
        # parameters() yields a tied parameter once; frozen ones need no synchronization
        self._params = [p for p in module.parameters() if p.requires_grad]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally: no hook work, no communication inside."""
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def _used_here(self) -> torch.Tensor:
        """1 for each synchronized parameter that has a .grad on this rank, i.e. that some backward
        since the last synchronization used (after `zero_grad(set_to_none=True)`, torch's default)."""
        device = self._params[0].device if self._params else None
        return torch.tensor([p.grad is not None for p in self._params], dtype=torch.int32, device=device)

    def _unused_to_none(self, used_here: torch.Tensor) -> None:
        """Collective, after the gradients are averaged: a parameter no rank used gets `.grad = None`
        back, as torch DDP with find_unused_parameters=True leaves it, so an optimizer skips it
        (a zero gradient would still move it: AdamW's weight decay, momentum). One used on some
        ranks only keeps the mean, the others counting zeros. Like torch's local_used_map, the map
        is one extra allreduce per step, on the group itself (control data, not gradients)."""
        if not self._params:
            return
        dist.all_reduce(used_here, group=self.group)
        for p, used in zip(self._params, used_here.tolist()):
            if not used:
                p.grad = None


class NaiveDataParallel(Replicated):
    """Per-parameter allreduce after backward: no buckets, no overlap (the baseline).

    Usage, on every rank:
        model = NaiveDataParallel(GPT(cfg))
        loss = model(x_local, y_local)[1]; loss.backward()
        model.finish_gradient_synchronization()   # every .grad is now the average over ranks
        optimizer.step()
    """

    def __init__(self, module: nn.Module, *, group: Any = None,
                 allreduce: str | AsyncAllreduce = DEFAULT_ALLREDUCE, timeout_s: float = 300.0,
                 trace: Trace | None = None):
        super().__init__(module, group)
        self._allreduce, self._close = make_allreduce(allreduce, group=group, timeout_s=timeout_s)
        self.trace = trace  # "launch" and "done" per parameter index, as DataParallel per bucket

    def finish_gradient_synchronization(self) -> None:
        if not self.require_backward_grad_sync:
            return
        used_here = self._used_here()
        for i, p in enumerate(self._params):
            if p.grad is None:  # unused in this step on this rank: it contributes zeros
                p.grad = torch.zeros_like(p)
            if self.trace is not None:
                self.trace.record("launch", i)
            handle = self._allreduce(p.grad)  # p.grad is contiguous: autograd allocates it so
            if hasattr(handle, "wait"):
                handle.wait()
            if self.trace is not None:
                self.trace.record("done", i)
            p.grad.div_(self.dp_world_size)
        self._unused_to_none(used_here)

    def close(self) -> None:
        self._close()
