"""The allreduces the ring replaces, on the same isend/irecv: the baselines of the benchmark.

simple_ring_allreduce  the textbook ring: one blocking exchange per step, one message per chunk,
                 a fresh buffer for every receive, a padded copy of the tensor (ring.py's
                 optimized ring is this plus pipelined segments, views and reused buffers).
naive_allreduce  every rank sends its whole tensor to rank 0, which sums and sends the result back:
                 rank 0 moves 2(p-1)·n bytes through one link, so time grows linearly with p.
tree_allreduce   binomial-tree reduce to rank 0, then binomial-tree broadcast: ⌈log2 p⌉ rounds
                 each way, every round moving the whole n bytes (latency-optimal, not bandwidth-optimal).

Both sum in place, count their sends with `record_send` (one message per isend) and take the same
`group` argument as the ring. Costs: cost_model.py; "Large scale deep learning optimizations"
seminar, §1.2.2.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from scaletrain.comm.counter import record_send
from scaletrain.comm.ring import ring_of, shard_numel

__all__ = ["simple_ring_allreduce", "naive_allreduce", "tree_allreduce"]


def _send(t: torch.Tensor, group_rank: int, group: Any):
    record_send(t.numel() * t.element_size())
    return dist.isend(t, dst=_global(group, group_rank), group=group)


def _recv(t: torch.Tensor, group_rank: int, group: Any):
    return dist.irecv(t, src=_global(group, group_rank), group=group)


def _global(group: Any, group_rank: int) -> int:
    return dist.get_global_rank(dist.group.WORLD if group is None else group, group_rank)


def _in_place(tensor: torch.Tensor, group: Any, body) -> torch.Tensor:
    """Run `body(flat, rank, p)` on a contiguous flat copy-or-view, then write it back if needed."""
    ring = ring_of(group)
    if ring.world_size == 1 or tensor.numel() == 0:
        return tensor
    flat = tensor.contiguous().view(-1)
    body(flat, ring.rank, ring.world_size)
    if not tensor.is_contiguous():
        tensor.copy_(flat.view(tensor.shape))
    return tensor


def naive_allreduce(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum `tensor` over `group` in place through rank 0 (reduce, then broadcast); return it."""

    def body(flat: torch.Tensor, rank: int, p: int) -> None:
        if rank == 0:
            inbox = [torch.empty_like(flat) for _ in range(p - 1)]  # (p-1)·n elements at the root
            for handle in [_recv(buf, src, group) for src, buf in enumerate(inbox, start=1)]:
                handle.wait()
            for buf in inbox:
                flat.add_(buf)
            for handle in [_send(flat, dst, group) for dst in range(1, p)]:
                handle.wait()
        else:
            _send(flat, 0, group).wait()
            _recv(flat, 0, group).wait()

    return _in_place(tensor, group, body)


def tree_allreduce(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum `tensor` over `group` in place by a binomial tree rooted at rank 0; return it.

    Reduce: in round k (mask = 2^k) rank r with bit k set sends its partial sum to r - mask and
    leaves; ranks without it receive from r + mask. Broadcast: the same rounds in reverse."""

    def body(flat: torch.Tensor, rank: int, p: int) -> None:
        inbox = torch.empty_like(flat)
        masks = [1 << k for k in range((p - 1).bit_length())]
        for mask in masks:
            if rank & mask:
                _send(flat, rank - mask, group).wait()
                break
            if rank + mask < p:
                _recv(inbox, rank + mask, group).wait()
                flat.add_(inbox)
        for mask in reversed(masks):
            if rank % (2 * mask) == mask:
                _recv(flat, rank - mask, group).wait()
            elif rank % (2 * mask) == 0 and rank + mask < p:
                _send(flat, rank + mask, group).wait()

    return _in_place(tensor, group, body)


def simple_ring_allreduce(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum `tensor` over `group` in place by the ring, written the obvious way; return it."""

    def body(flat: torch.Tensor, rank: int, p: int) -> None:
        m = shard_numel(flat.numel(), p)
        padded = flat.new_zeros(p * m)
        padded[:flat.numel()] = flat
        chunks = padded.split(m)
        nxt, prev = (rank + 1) % p, (rank - 1) % p
        for step in range(p - 1):  # reduce-scatter: afterwards chunk `rank` holds the full sum
            incoming = torch.empty_like(chunks[0])
            for handle in (_recv(incoming, prev, group), _send(chunks[(rank - step - 1) % p], nxt, group)):
                handle.wait()
            chunks[(rank - step - 2) % p].add_(incoming)
        for step in range(p - 1):  # all-gather: forward the chunk received at the previous step
            for handle in (_recv(chunks[(rank - step - 1) % p], prev, group),
                           _send(chunks[(rank - step) % p], nxt, group)):
                handle.wait()
        flat.copy_(padded[:flat.numel()])

    return _in_place(tensor, group, body)
