"""All-to-all on point-to-point messages, equal and variable-size: the collective of expert parallelism.

In an all-to-all every rank holds p chunks, chunk j for rank j, and ends with p chunks, chunk i
from rank i: a transpose of the (sender, receiver) matrix. Expert parallelism runs two per MoE
layer forward (dispatch the tokens to their experts' ranks, bring the outputs back) and two
backward (GShard §3.1: AllToAll around the experts' einsum; Switch §5.4, "Expert and Data
Parallelism").

    rank r sends chunk j to rank j, receives chunk i from rank i    (its own chunk: a local copy)

Equal form (`all_to_all`): the input's rows split into p equal chunks, as torch's
`all_to_all_single` without split sizes. Variable form (`all_to_all_v`): `send_splits[j]` rows go
to rank j; the receiver must know how many rows arrive from each rank before it can post its
receives, so the split sizes are exchanged first, by an equal all-to-all of one int64 per rank
(expert parallelism exchanges its per-expert counts instead and passes `recv_splits`).

Bytes one rank sends (what `comm_counter` records, one logical message per non-empty chunk):

    equal:     (p-1) · m · row_bytes                               m = rows / p
    variable:  Σ_{j≠r} send_splits[j] · row_bytes  [+ 8·(p-1) for the split exchange]

Only `dist.isend` / `dist.irecv` move data (never torch's collectives, nor batch_isend_irecv, which
gloo does not run as one batch); each message sent is recorded with `record_send` (comm_counter).
Unlike the ring's p-1 sequential steps, the p-1 messages of an all-to-all are independent: in
which order a rank posts its receives and sends, and when it waits on them, is a design decision
(which peer does everyone talk to first? what does gloo do with a message whose receive is not yet
posted? ring.py's docstring has the measurements). Whatever the order, no rank may wait on a peer
that is itself waiting, for any p and any split sizes, empty chunks included. Empty chunks send
nothing (both sides know the sizes).

Autograd: the backward of an all-to-all is an all-to-all of the gradients (Switch §5.4: the
backward pass mirrors the forward's communication).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from scaletrain.comm.counter import record_send
from scaletrain.comm.ring import ring_of

__all__ = ["all_to_all", "all_to_all_v", "exchange_splits", "all_to_all_bytes", "all_to_all_v_bytes",
           "SPLIT_BYTES"]

SPLIT_BYTES = 8  # one int64 split size per peer


def _members(group: Any) -> tuple[int, int, list[int]]:
    """(my rank in `group`, its size, the global rank of each member): isend/irecv take global ranks."""
    ring = ring_of(group)  # the ring's checks: a process group exists and this rank is in `group`
    pg = dist.group.WORLD if group is None else group
    return ring.rank, ring.world_size, [dist.get_global_rank(pg, i) for i in range(ring.world_size)]


def _exchange(send: list[torch.Tensor], recv: list[torch.Tensor], group: Any) -> None:
    """Send send[j] to member j and receive recv[i] from member i of `group`; recv[me] = send[me].

    `send` and `recv` hold p contiguous tensors each (p = the group's size), recv[i] already shaped
    to what member i sends. Fills `recv` in place; returns when every message of this rank is
    complete. isend/irecv take *global* ranks: `_members` gives them. Graded: what arrives, on
    p = 1-4 with uneven and empty chunks; bytes handed to isend and to `record_send` equal the
    formula above (no message to itself, none for an empty chunk); no deadlock (10 s limit)."""
    rank, p, peers = _members(group)
    # BEGIN SOLUTION
    # Every receive is posted before any send (gloo writes a message at once when its receive is
    # already posted; ring.py), then every send, then every handle is waited on: nobody waits before
    # everything is posted, so no order of peers can deadlock. Rank r sends to r+1, r+2, ... so at each
    # step the p ranks send to p different peers (MPI's pairwise exchange), not everyone to rank 0 first.
    handles = []
    for step in range(1, p):
        src = (rank - step) % p
        if recv[src].numel():
            handles.append(dist.irecv(recv[src], src=peers[src], group=group))
    for step in range(1, p):
        dst = (rank + step) % p
        if send[dst].numel():
            handles.append(dist.isend(send[dst], dst=peers[dst], group=group))
            record_send(send[dst].numel() * send[dst].element_size())
    recv[rank].copy_(send[rank])
    for handle in handles:
        handle.wait()
    # END SOLUTION


def _rows_out(x: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int], group: Any) -> torch.Tensor:
    x = x.contiguous()  # chunks of dim 0 of a contiguous tensor are contiguous: what isend needs
    out = x.new_empty((sum(recv_splits), *x.shape[1:]))
    _exchange(list(x.split(list(send_splits))), list(out.split(list(recv_splits))), group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group):
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        return _rows_out(x, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx, dy):
        """dy (Σ recv_splits, ...) -> the gradient of x (Σ send_splits, ...), then None for the other
        three inputs. Graded: the input gradients of the equal and variable forms."""
        # BEGIN SOLUTION
        send_splits, recv_splits = ctx.splits
        return _rows_out(dy, recv_splits, send_splits, ctx.group), None, None, None
        # END SOLUTION


def _sizes(splits: Sequence[int], p: int, what: str) -> list[int]:
    sizes = [int(s) for s in splits]
    if len(sizes) != p or min(sizes) < 0:
        raise ValueError(f"all_to_all_v: {what} must hold {p} sizes >= 0 (one per rank of the group), got {sizes}")
    return sizes


def all_to_all(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Equal all-to-all along dim 0: x (p·m, ...) -> (p·m, ...), rows [j·m, (j+1)·m) sent to rank j,
    rows [i·m, (i+1)·m) of the result from rank i. Differentiable. Sends (p-1)·m rows."""
    rank, p, _ = _members(group)
    if x.shape[0] % p:
        raise ValueError(f"all_to_all: dim 0 of size {x.shape[0]} does not split into {p} equal chunks; "
                         "use all_to_all_v")
    splits = [x.shape[0] // p] * p
    return _AllToAll.apply(x, splits, splits, group)


def exchange_splits(send_splits: Sequence[int], group: Any = None) -> list[int]:
    """recv_splits: how many rows each member of `group` will send me, a list of p ints, learned
    from every member's `send_splits` (p ints each) in SPLIT_BYTES · (p-1) bytes sent per rank.
    Graded inside `all_to_all_v` without `recv_splits`: values and bytes."""
    _, p, _ = _members(group)
    sizes = torch.tensor(_sizes(send_splits, p, "send_splits"), dtype=torch.int64)
    # BEGIN SOLUTION
    return _rows_out(sizes, [1] * p, [1] * p, group).tolist()
    # END SOLUTION


def all_to_all_v(x: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int] | None = None,
                 group: Any = None) -> tuple[torch.Tensor, list[int]]:
    """Variable all-to-all along dim 0: send_splits[j] rows (in order) to rank j; returns (rows from
    every rank, in rank order; recv_splits). `recv_splits` None: exchanged first (exchange_splits).
    Differentiable: the backward sends the gradients back with the splits swapped."""
    rank, p, _ = _members(group)
    send_splits = _sizes(send_splits, p, "send_splits")
    if sum(send_splits) != x.shape[0]:
        raise ValueError(f"all_to_all_v: send_splits {send_splits} sum to {sum(send_splits)}, not to the "
                         f"{x.shape[0]} rows of x")
    recv_splits = exchange_splits(send_splits, group) if recv_splits is None else _sizes(recv_splits, p, "recv_splits")
    return _AllToAll.apply(x, send_splits, recv_splits, group), recv_splits


def all_to_all_bytes(*, rows: int, row_bytes: int, world_size: int) -> int:
    """Bytes one rank sends in the equal all-to-all of `rows` rows: (p-1) · rows/p · row_bytes."""
    return (world_size - 1) * (rows // world_size) * row_bytes


def all_to_all_v_bytes(send_splits: Sequence[int], *, rank: int, row_bytes: int, exchange: bool = True) -> int:
    """Bytes rank `rank` sends in the variable all-to-all: its rows for the other ranks, plus the
    split exchange's 8·(p-1) when the receive sizes were not given."""
    p = len(send_splits)
    rows = sum(s for j, s in enumerate(send_splits) if j != rank)
    return rows * row_bytes + (SPLIT_BYTES * (p - 1) if exchange else 0)
