"""Ring reduce-scatter, all-gather and allreduce built from point-to-point messages (assignment a2).

p ranks stand on a ring; rank r sends only to r+1 and receives only from r-1 (mod p) (`Ring`).

The public layout (`ring_reduce_scatter`, `ring_all_gather`, given): the flat tensor of n elements
is padded with zeros to p·m elements, m = ⌈n/p⌉, and rank r's shard is elements [r·m, (r+1)·m).

Reduce-scatter takes p-1 steps: at every step each rank passes one running sum to its successor
and adds its own copy of a chunk into the one it receives; after the last step rank r holds chunk r
summed over all ranks. All-gather takes p-1 steps: each rank forwards one complete chunk per step,
until every rank holds all p. *Which* chunk moves at which step, how a step's sends and receives
are ordered so that no two neighbours wait on each other, and (inside `ring_allreduce`) how the
tensor is cut into chunks are yours to derive: "Large scale deep learning optimizations" seminar,
§1.2.2 Data parallel and §1.2.5.2; Patarasuk & Yuan 2009, §3. The grader checks properties every
correct ring has, not one schedule: the sums, the neighbours every message goes to and comes from,
and the bytes each rank sends: 2(p-1)/p·n·itemsize for the allreduce when p divides n, between
2(p-1)·⌊n/p⌋ and 2(p-1)·⌈n/p⌉ items when it does not (padded or uneven chunks), the bandwidth-optimal
volume whatever p is. Time ≈ 2(p-1)·α + 2(p-1)/p·n·β (cost_model.py).

Pitfalls: a blocking receive posted first on both sides of a link deadlocks (at p = 2 your send
partner is your receive partner); a message must not land in a buffer that is still being read;
n < p leaves chunks that are all padding, and n = 0 sends nothing. Only `dist.isend` /
`dist.irecv` (or `dist.send` / `dist.recv`) carry data; every handle is waited on. Every logical
chunk message is recorded once with `record_send` (counter.py), however many segments carry it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.comm.counter import record_send

__all__ = ["Ring", "ring_of", "shard_numel", "chunk_buffers", "segment_bounds", "SEGMENT_BYTES",
           "scratch_buffers", "GATHER_TAG", "post_gather_receives", "ring_reduce_scatter_chunks",
           "ring_all_gather_chunks",
           "ring_reduce_scatter", "ring_all_gather", "ring_allreduce"]

SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)
OPS = ("sum", "avg")
# Task 2.4's design decision: the segment size and the sends in flight per link. Read at call time
# (segment_bounds, the chunk loops), so `python -m scaletrain.bench allreduce --sweep` can set them.
# BEGIN SOLUTION
# STUB: SEGMENT_BYTES = 64 << 10  # task 2.4: untuned; choose it from your sweep (handout, written question 5)
# STUB: SENDS_IN_FLIGHT = 1  # task 2.4: untuned; choose it from your sweep (handout, written question 5)
SEGMENT_BYTES = 4 << 20  # gloo uses 1 MiB; our 256 KiB took 1.5-3.5x gloo's time, 1 and 4 MiB tied (task 2.4's sweep, 2 runs)
SENDS_IN_FLIGHT = 2  # segments sent but not yet waited on, per link (gloo: 2)
# END SOLUTION
GATHER_TAG = 1  # the all-gather's messages, kept apart from the reduce-scatter's (tag 0)


@dataclass(frozen=True, kw_only=True)
class Ring:
    """This rank's place on the ring. `rank`, `world_size`: within `group`; `send_to`, `recv_from`:
    *global* ranks of the next and previous ranks (what isend/irecv take with `group=`)."""
    rank: int
    world_size: int
    send_to: int
    recv_from: int
    group: Any = None

    def __post_init__(self):
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"Ring: rank {self.rank} is outside 0..{self.world_size - 1}")


def ring_of(group: Any = None) -> Ring:
    """The ring of `group` (None: all ranks), neighbours mapped to global ranks."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ring collectives need a process group: run inside scaletrain.launch.spawn(fn, p) "
                           "or call torch.distributed.init_process_group first")
    pg = dist.group.WORLD if group is None else group
    rank, world_size = dist.get_rank(pg), dist.get_world_size(pg)
    if rank < 0:
        raise ValueError("ring collective called on a rank that is not a member of `group`")
    return Ring(rank=rank, world_size=world_size, group=group,
                send_to=dist.get_global_rank(pg, (rank + 1) % world_size),
                recv_from=dist.get_global_rank(pg, (rank - 1) % world_size))


def shard_numel(numel: int, world_size: int) -> int:
    """m = ⌈numel / world_size⌉: the length of every chunk and of every rank's shard."""
    return -(-numel // world_size)


def chunk_buffers(flat: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    """The p chunks of a contiguous 1-D tensor, each of m = ⌈n/p⌉ elements: views of `flat` where
    the chunk lies inside it, a zero-padded copy for the chunk that straddles the end (in a reused
    workspace: a fresh 20 MiB buffer per call cost 1.4x gloo's time at p = 3), zeros for chunks
    wholly past it (only when n is tiny). `write_back` copies the straddling chunk back."""
    n, m = flat.numel(), shard_numel(flat.numel(), world_size)
    chunks = []
    for i in range(world_size):
        lo, hi = min(i * m, n), min((i + 1) * m, n)
        if hi - lo == m:
            chunks.append(flat[lo:hi])
        elif hi > lo:
            padded = scratch_buffers("ring_tail", 1, m, flat)[0]
            padded[:hi - lo].copy_(flat[lo:hi])
            padded[hi - lo:].zero_()
            chunks.append(padded)
        else:
            chunks.append(flat.new_zeros(m))
    return chunks


def write_back(chunks: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy the straddling chunk (the only padded copy holding real elements) back into `flat`."""
    n, m = flat.numel(), chunks[0].numel()
    if m and n % m:
        i = n // m
        flat[i * m:].copy_(chunks[i][:n - i * m])


def segment_bounds(numel: int, itemsize: int, segment_bytes: int | None = None) -> list[tuple[int, int]]:
    """[(lo, hi), ...]: `numel` elements cut into near-equal segments of at most `segment_bytes`
    (default: the module's SEGMENT_BYTES, read at call time so a test can shrink it)."""
    count = max(1, -(-numel * itemsize // (segment_bytes or SEGMENT_BYTES)))
    cuts = [numel * k // count for k in range(count + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


_workspace = threading.local()  # per thread: DataParallel may run a ring on a background thread


def scratch_buffers(name: str, count: int, numel: int, like: torch.Tensor) -> list[torch.Tensor]:
    """`count` 1-D scratch tensors of `numel` elements (dtype and device of `like`), carved from a
    workspace kept between calls per thread, `name`, dtype and device, and only ever grown: a fresh
    16 MiB buffer costs 4096 page faults on first touch, every call; a reused one none. Garbage
    contents; two live uses need two names."""
    buffers = _workspace.__dict__.setdefault("buffers", {})
    key, total = (name, like.dtype, like.device), count * numel
    if key not in buffers or buffers[key].numel() < total:
        buffers[key] = torch.empty(total, dtype=like.dtype, device=like.device)
    return list(buffers[key][:total].view(count, numel).unbind())


def ring_reduce_scatter_chunks(chunks: list[torch.Tensor], out: torch.Tensor, ring: Ring) -> torch.Tensor:
    """Write into `out` the sum over all ranks of chunk `ring.rank`; return `out`.

    chunks: this rank's p contiguous 1-D chunks, read only (the caller's data). The given
            `ring_reduce_scatter` passes p chunks of m = ⌈n/p⌉ (`chunk_buffers`); your
            `ring_allreduce` may cut its tensor differently if you design it so.
    out:    contiguous, as long as `chunks[ring.rank]`; may be `chunks[ring.rank]` itself.
    Graded: the sum, exactly, on hidden sizes and dtypes at p = 2, 3, 4 (a subgroup included);
    p-1 steps, each sending one running sum to `ring.send_to` and receiving one from
    `ring.recv_from` with `group=ring.group`, no other peer; which chunk moves at which step is
    yours to derive (module docstring); each step's message recorded once with `record_send`, in
    bytes, however many segments carry it; `chunks` unmodified except `out`; every handle waited
    on. At p = 1 nothing is sent or recorded and `out` holds `chunks[0]`.
    """
    # BEGIN SOLUTION
    # The reference's design (task 2.4): each chunk is cut into segments of at most SEGMENT_BYTES
    # and runs a lockstep pipeline like gloo's own ring: the reduction of one segment overlaps the
    # transfer of the next and SENDS_IN_FLIGHT segments are on the wire per link. Every receive is
    # posted before the first send (the reduce-scatter's into a scratch chunk per step, kept between
    # calls by scratch_buffers; the allreduce posts the all-gather's too, under their own tag,
    # before its reduce-scatter starts): gloo writes a message at once only when its receive is
    # already posted, otherwise a notify round trip comes first. On 4 gloo ranks sharing 2 cores
    # that took the 4 MiB allreduce from 1.2x to about 1.05x gloo's time.
    p, r, m, itemsize = ring.world_size, ring.rank, out.numel(), out.element_size()
    if p == 1:
        return out.copy_(chunks[0])
    segments = segment_bounds(m, itemsize)
    items = [(step, lo, hi) for step in range(p - 1) for lo, hi in segments]  # the order on the wire
    # Every step receives into its own scratch chunk, so every receive is posted before the first
    # send: gloo then writes each message as soon as it is sent (a send that finds no posted
    # receive waits for a notify round trip and gloo's I/O thread instead: tcp Pair::send).
    received = scratch_buffers("ring_recv", p - 1, m, out)
    partials = [received[step][lo:hi] for step, lo, hi in items]
    recvs = [dist.irecv(partial, src=ring.recv_from, group=ring.group) for partial in partials]
    k, lag = len(segments), min(SENDS_IN_FLIGHT, len(segments))
    sources = [chunks[(r - 1) % p][lo:hi] if step == 0 else partials[i - k] for i, (step, lo, hi) in enumerate(items)]
    own = [chunks[(r - step - 2) % p][lo:hi] for step, lo, hi in items]
    outs = [out[lo:hi] if step == p - 2 else None for step, lo, hi in items]
    # Lockstep pipeline like gloo's ring: iteration i sends item i and reduces item i-lag, so the
    # addition of one segment overlaps the transfer of the next and `lag` sends are in flight per
    # link; item i forwards the sum of item i-k, reduced at iteration i-k+lag <= i.
    sends = []
    for i in range(len(items) + lag):
        if i >= lag:
            j = i - lag
            recvs[j].wait()
            if outs[j] is None:
                partials[j].add_(own[j])  # the running sum we send on at the next step
            else:
                torch.add(partials[j], own[j], out=outs[j])  # the last step: chunk r, complete
            sends[j].wait()
        if i < len(items):
            sends.append(dist.isend(sources[i], dst=ring.send_to, group=ring.group))
            if items[i][1] == 0:
                record_send(m * itemsize)
    return out
    # END SOLUTION


def post_gather_receives(chunks: list[torch.Tensor], ring: Ring) -> list[Any]:
    """Post every receive of the ring all-gather into its place in `chunks` and return the handles,
    in the order your `ring_all_gather_chunks` waits on them (Task 2.2). Tagged GATHER_TAG, so
    `ring_allreduce` may post them before its reduce-scatter runs; decide why that is safe (when
    does a chunk's all-gather message leave its sender, and when does this rank read that chunk
    for the last time?). At p = 1: no receives, an empty list.
    """
    # BEGIN SOLUTION
    # step s receives chunk (r-s-1) mod p, segment by segment: the order the messages arrive
    p, r = ring.world_size, ring.rank
    if p == 1:
        return []
    segments = segment_bounds(chunks[0].numel(), chunks[0].element_size())
    return [dist.irecv(chunks[(r - step - 1) % p][lo:hi], src=ring.recv_from, group=ring.group, tag=GATHER_TAG)
            for step in range(p - 1) for lo, hi in segments]
    # END SOLUTION


def ring_all_gather_chunks(chunks: list[torch.Tensor], ring: Ring, recvs: list[Any] | None = None) -> list[torch.Tensor]:
    """Fill every chunk from its owner, in place: on entry `chunks[ring.rank]` is valid, on return
    all p chunks are (chunk i as rank i had it). Return `chunks`.

    recvs: the handles your `post_gather_receives` returned for these chunks when the caller
    posted the receives early; None: post them yourself.
    Graded: every chunk equal to its owner's, on hidden sizes and dtypes at p = 2, 3, 4; p-1
    steps, each forwarding one complete chunk to `ring.send_to` with `tag=GATHER_TAG` and
    receiving one from `ring.recv_from`; each step's message recorded once with `record_send`, in
    bytes; every handle waited on before returning. At p = 1 nothing is sent: return `chunks`.
    """
    # BEGIN SOLUTION
    p, r = ring.world_size, ring.rank
    if p == 1:
        return chunks
    m, itemsize = chunks[0].numel(), chunks[0].element_size()
    if recvs is None:
        recvs = post_gather_receives(chunks, ring)
    items = [(step, lo, hi) for step in range(p - 1) for lo, hi in segment_bounds(m, itemsize)]
    lag = min(SENDS_IN_FLIGHT, len(items) // (p - 1))  # the reduce-scatter's pipeline, nothing to add
    sent = []
    for i in range(len(items) + lag):
        if i >= lag:
            recvs[i - lag].wait()  # the segment sent at iteration i - lag + k, at the next step
            sent[i - lag].wait()
        if i < len(items):
            step, lo, hi = items[i]
            # step 0 sends our own chunk r; step s forwards chunk r-s, received at step s-1
            sent.append(dist.isend(chunks[(r - step) % p][lo:hi], dst=ring.send_to, group=ring.group, tag=GATHER_TAG))
            if lo == 0:
                record_send(m * itemsize)
    return chunks
    # END SOLUTION


def _check(fn: str, tensor: Any, op: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{fn}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{fn}: dtype {tensor.dtype} is not supported; use one of "
                        f"{[str(d) for d in SUPPORTED_DTYPES]}")
    if op not in OPS:
        raise ValueError(f"{fn}: op must be one of {OPS}, got {op!r}")
    if op == "avg" and not tensor.dtype.is_floating_point:
        raise ValueError(f"{fn}: op='avg' needs a floating dtype, got {tensor.dtype}; "
                         "use op='sum' and divide yourself")


def ring_reduce_scatter(tensor: torch.Tensor, op: str = "sum", group: Any = None) -> torch.Tensor:
    """This rank's shard of the sum (or mean, op="avg") of `tensor` over the ranks of `group`.

    Layout: the flattened tensor (n elements) padded with zeros to p·m, m = ⌈n/p⌉; rank r gets
    elements [r·m, (r+1)·m) as a new 1-D tensor of m elements (padding included). `tensor` is not
    modified. Sends p-1 messages of m·itemsize bytes.
    """
    _check("ring_reduce_scatter", tensor, op)
    ring = ring_of(group)
    flat = tensor.contiguous().view(-1)  # read only: a view when already contiguous
    out = flat.new_empty(shard_numel(flat.numel(), ring.world_size))
    if out.numel() == 0:
        return out
    ring_reduce_scatter_chunks(chunk_buffers(flat, ring.world_size), out, ring)  # views: no copy
    return out.div_(ring.world_size) if op == "avg" else out


def ring_all_gather(shard: torch.Tensor, numel: int, group: Any = None) -> torch.Tensor:
    """The full flat tensor of `numel` elements from every rank's shard (padding dropped).

    `shard` holds m = ⌈numel/p⌉ elements (the layout of `ring_reduce_scatter`); rank r's shard
    becomes elements [r·m, (r+1)·m). Sends p-1 messages of m·itemsize bytes.
    """
    _check("ring_all_gather", shard, "sum")
    ring = ring_of(group)
    if not isinstance(numel, int) or numel < 0:
        raise ValueError(f"ring_all_gather: numel must be an int >= 0, got {numel!r}")
    m = shard_numel(numel, ring.world_size)
    if shard.numel() != m:
        raise ValueError(f"ring_all_gather: shard has {shard.numel()} elements, but numel={numel} on "
                         f"{ring.world_size} ranks needs shards of ceil(numel/p) = {m} elements")
    full = shard.new_empty(ring.world_size * m)
    if m == 0:
        return full
    chunks = list(full.split(m))
    chunks[ring.rank].copy_(shard.reshape(-1))
    ring_all_gather_chunks(chunks, ring)
    return full[:numel]


def ring_allreduce(tensor: torch.Tensor, op: str = "sum", group: Any = None) -> torch.Tensor:
    """Sum (or mean) `tensor` over the ranks of `group` in place; return `tensor` (Task 2.3).

    Reduce-scatter then all-gather on chunks of the flattened tensor; the chunking is yours (the
    given `chunk_buffers` pads to p chunks of ⌈n/p⌉ as the public layout does; uneven chunks of
    ⌊n/p⌋ or ⌈n/p⌉ elements need no padding). Graded: the result in the caller's memory, for
    "sum" exactly and "avg" (divided by p once) within rounding, on hidden sizes p divides and
    does not, at p = 2, 3, 4, for a strided view and a transposed matrix too; the bytes each rank
    hands to isend (module docstring) and records with `record_send`, in 2(p-1) steps. p = 1 or
    an empty tensor: returned unchanged, nothing sent or recorded.
    """
    _check("ring_allreduce", tensor, op)
    ring = ring_of(group)
    # BEGIN SOLUTION
    if ring.world_size == 1 or tensor.numel() == 0:
        return tensor
    flat = tensor.contiguous().view(-1)  # the tensor's own memory when contiguous, else a copy
    chunks = chunk_buffers(flat, ring.world_size)
    mine = chunks[ring.rank]
    gathered = post_gather_receives(chunks, ring)  # posted now, so no all-gather send ever waits
    ring_reduce_scatter_chunks(chunks, mine, ring)  # the sum of chunk `rank` lands in place
    if op == "avg":
        mine.div_(ring.world_size)  # divide m elements here rather than n after the gather
    ring_all_gather_chunks(chunks, ring, gathered)
    write_back(chunks, flat)
    if not tensor.is_contiguous():
        tensor.copy_(flat.view(tensor.shape))
    # END SOLUTION
    return tensor
