"""The gradient-compression hook point of DataParallel: a bucket's flat gradient in, the
synchronized (mean) gradient out.

DataParallel (scaletrain.dp.data_parallel) takes `allreduce=`: a callable f(flat) that *sums*
the bucket buffer in place over the ranks; DataParallel then divides by dp_world_size. A
compressor needs more than the flat buffer: its bucket's index (state such as PowerSGD's warm
Q or the error-feedback memory is kept per bucket) and the shapes of the parameters in it
(PowerSGD compresses each matrix separately). `CompressedAllreduce` adapts a `CompressionHook`
to the `allreduce=` interface, so DataParallel itself is unchanged:

    hook = PowerSGD(rank=4)                       # or OneBitEF()
    model = compressed_data_parallel(GPT(cfg), hook, bucket_cap_mb=1)
    loss.backward(); model.finish_gradient_synchronization()   # .grad = hook's mean gradient

The hook runs synchronously inside the bucket's launch (the autograd hook that completes the
bucket): its collectives are point-to-point rings (scaletrain.comm, counted by comm_counter),
and compression's compute is on the critical path (torch's DDP comm hooks run the same way,
chained as futures on the reducer's thread). The hook returns the mean; the adapter writes
mean · p back so that DataParallel's division yields the mean again (exact up to one rounding).

Compare torch: `DistributedDataParallel.register_comm_hook(state, hook)` with
`hook(state, dist.GradBucket) -> Future[Tensor]` (torch.distributed.algorithms.ddp_comm_hooks).
Seminar notes §1.2.8.2 ("PowerSGD ... a general DDP communication hook").
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

__all__ = ["CompressionHook", "CompressedAllreduce", "compressed_data_parallel"]


class CompressionHook(Protocol):
    def reduce(self, index: int, flat: torch.Tensor, shapes: Sequence[torch.Size]) -> torch.Tensor:
        """Bucket `index`'s local flat gradient (parameters of `shapes`, concatenated) ->
        the synchronized mean gradient (same numel), identical on every rank."""
        ...


class CompressedAllreduce:
    """`allreduce=` callable for DataParallel that runs `hook.reduce` on each bucket.

    `attach(model)` must be called once after the DataParallel is built (compressed_data_parallel
    does it): it maps every bucket buffer to its (index, parameter shapes)."""

    def __init__(self, hook: CompressionHook, group: Any = None):
        self.hook = hook
        self.group = group
        self._buckets: dict[int, tuple[int, list[torch.Size]]] = {}

    def attach(self, model: nn.Module) -> "CompressedAllreduce":
        self._buckets = {b.buffer.data_ptr(): (b.index, [p.shape for p in b.params]) for b in model.buckets}
        return self

    def __call__(self, buffer: torch.Tensor) -> None:
        key = buffer.data_ptr()
        if key not in self._buckets:
            raise RuntimeError("CompressedAllreduce: unknown bucket buffer; call attach(model) after "
                               "building the DataParallel (or use compressed_data_parallel)")
        index, shapes = self._buckets[key]
        mean = self.hook.reduce(index, buffer, shapes)
        buffer.copy_(mean).mul_(dist.get_world_size(self.group))  # DataParallel divides by p
        return None  # synchronous: Bucket.wait() has nothing to wait for


def compressed_data_parallel(module: nn.Module, hook: CompressionHook, *, group: Any = None, **dp_kwargs: Any):
    """DataParallel(module, allreduce=<hook adapter>, ...) with the adapter attached."""
    from scaletrain.dp.data_parallel import DataParallel

    adapter = CompressedAllreduce(hook, group)
    model = DataParallel(module, group=group, allreduce=adapter, **dp_kwargs)
    adapter.attach(model)
    model.compression_hook = hook
    return model
