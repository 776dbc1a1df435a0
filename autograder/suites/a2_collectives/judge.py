"""a2's verdicts on correctness: the ranks' raw records (returned tensors, inputs after the call,
messages handed to isend/irecv, what record_send counted, traps reached) judged against the
single-process sums of `inputs` and the ring's traffic: p = 3 and 2 in one start of 3 ranks, p = 4 in
another."""

from __future__ import annotations

import random

from autograder import checks

from . import inputs
from .inputs import Block, Call
from .names import (C_AG, C_AG2, C_AG4, C_AG_EVEN, C_AR, C_AR2, C_AR4, C_AR_EVEN, C_AR_VIEWS, C_BYTES, C_BYTES_EVEN,
                    C_RS, C_RS2, C_RS4, C_RS_EVEN, PROBE, PUBLIC_SIZES)


def traffic(record, call: Call, rank: int, members: list[int]) -> None:
    """The technique, from the messages the rank handed to isend/irecv (or send/recv): the ring's
    neighbours only, and at least the ring's volume. For the byte checks, the allreduce's volume:
    exactly 2(p-1)/p·n·itemsize when p divides n, else between 2(p-1)·floor(n/p) and
    2(p-1)·ceil(n/p) items (padded chunks or uneven ones: the chunking is the student's), all of
    it recorded with record_send in 2(p-1) steps. A sum obtained without moving the data, or by
    sending to everyone, fails here."""
    p, me = len(members), members.index(rank)
    if p == 1 or (call.m == 0 and not call.exact_bytes):  # exact: n = 0 sends and records nothing
        return
    nxt, prev = members[(me + 1) % p], members[(me - 1) % p]
    messages = record.get("messages") or []
    where = f"rank {rank}, {call.fn} of n={call.n} {call.dtype}"
    for kind, peer, nbytes in messages:
        partner, direction = (nxt, "sends only to") if kind in ("isend", "send") else (prev, "receives only from")
        assert peer == partner, (f"{where}: dist.{kind} with rank {peer}; on the ring of ranks {members} rank {rank} "
                                 f"{direction} rank {partner}")
    sent = sum(nbytes for kind, _, nbytes in messages if kind in ("isend", "send"))
    steps = (2 if call.fn == "allreduce" else 1) * (p - 1) if call.m else 0
    least = steps * (call.n // p) * call.itemsize
    if call.exact_bytes:
        _exact_bytes(record, call, where, sent, steps, least)
    else:  # a lower bound that holds for every ring, padded or not (the byte checks are tighter)
        assert sent >= least, (f"{where}: {sent} bytes handed to dist.isend, but a ring moves at least "
                               f"{steps}·floor(n/p)·itemsize = {least} bytes per rank: the result did not travel "
                               "the ring")


def _exact_bytes(record, call: Call, where: str, sent: int, steps: int, least: int) -> None:
    most = steps * call.m * call.itemsize
    if least == most:
        assert sent == most, (f"{where}: isend carried {sent} bytes, the ring sends exactly "
                              f"2(p-1)/p·n·itemsize = {most}")
    else:
        assert least <= sent <= most, (f"{where}: isend carried {sent} bytes, a ring sends between "
                                       f"2(p-1)·floor(n/p)·itemsize = {least} and 2(p-1)·ceil(n/p)·itemsize = {most}")
    recorded = tuple(record.get("recorded") or (None, None))
    assert recorded == (sent, steps), (
        f"{where}: record_send saw {recorded[0]} bytes in {recorded[1]} messages, expected the {sent} bytes sent, "
        f"in 2(p-1) = {steps} (call record_send once per ring step)")


def rank_problem(records: list, calls: list[Call], rank: int, members: list[int]) -> Exception | None:
    """The first thing wrong on one rank: what a call raised, a wrong value, or wrong traffic."""
    for record, call in zip(records[:len(calls)], calls[:len(records)], strict=True):
        raised = record.get("raised")
        if raised:
            kind, message, where = (str(x) for x in raised)
            text = f"rank {rank}: {message}{where}"
            if kind == "Flagged":
                return checks.Flagged(text)
            return NotImplementedError(text) if kind == "NotImplementedError" else AssertionError(text)
        try:
            call.judge(record)
            traffic(record, call, rank, members)
        except AssertionError as exc:
            message = str(exc)
            return AssertionError(message if message.startswith(("p=", "subgroup", "rank")) else f"rank {rank}: {message}")
    if len(records) != len(calls):  # issue 28: a short or long answer is a failure, not fewer checks
        return AssertionError(f"rank {rank} answered {len(records)} calls, the check made {len(calls)}")
    return None


def judge_block(block: Block, per_rank: list[dict]) -> None:
    """Raise the block's outcome: a forbidden collective reached on any rank (flagged, even if the
    student's code caught the guard's exception), else the lowest rank's first problem."""
    problems = []
    for rank in block.members:
        records = per_rank[rank].get(block.label) if isinstance(per_rank[rank], dict) else None
        if not isinstance(records, list):
            raise AssertionError(f"rank {rank} returned nothing for this check")
        trapped = [name for record in records if isinstance(record, dict) for name in record.get("trapped") or ()]
        if trapped:
            raise checks.Flagged(f"rank {rank}: called forbidden `{trapped[0]}`")
        problems.append(rank_problem(records, block.calls[rank], rank, block.members))
    first = next((p for p in problems if p is not None), None)
    if first is not None:
        raise first


def failure(ended) -> Exception:
    """What ended the ranks (probe's data) as the exception `classify` sorts."""
    from scaletrain.launch import RankError, SpawnTimeout

    if ended and ended[0] == "timeout":
        return SpawnTimeout(str(ended[1]))
    if ended and ended[0] == "rank" and len(ended) == 5:
        _, rank, exc_type, message, tb = ended
        return RankError(int(rank), str(exc_type), str(message), str(tb))
    return RuntimeError(f"the ranks failed: {str(ended)[:300]}")


def answer(reply):
    if not isinstance(reply, dict) or ("ok" not in reply and "failure" not in reply):
        raise RuntimeError("the probe sent a malformed answer")
    if "failure" in reply:
        raise failure(reply["failure"])
    return reply["ok"]


def all_get(ctx, names, exc: Exception) -> None:
    for name in names:
        with ctx.check(name):
            raise exc


def shutdown(ctx) -> None:
    """Let the worker stop its ranks and remove its temporary folders while it is still alive."""
    try:
        ctx.untrusted().call(PROBE + "shutdown", timeout_s=30)
    except Exception:  # noqa: BLE001 - cleaning up only: the worker is killed next anyway
        pass


def _seed() -> int:
    return checks.trial_seeds(1, salt=2)[0]



def group_rings(ctx):
    """Correctness at p = 3 and p = 2 in one start of 3 ranks: the whole world (hidden sizes p
    divides and does not, every dtype, non-contiguous tensors, the bytes), then the subgroup
    {0, 2}, whose ring skips rank 1 (send and receive partner are the same global rank)."""
    seed = _seed()
    rng = random.Random(seed)
    sizes = sorted(set(checks.irregular_sizes(3)) | set(PUBLIC_SIZES) | {rng.randint(5000, 20000), 3 * rng.randint(1700, 7000)})
    p3 = dict(rs=(C_RS_EVEN, C_RS), ag=(C_AG_EVEN, C_AG), ar=(C_AR_EVEN, C_AR), views=C_AR_VIEWS,
              bytes=(C_BYTES_EVEN, C_BYTES))
    blocks = inputs.blocks(seed, [0, 1, 2], 0, sizes, "p=3", p3)
    blocks += inputs.blocks(seed, [0, 2], 1, [0, 1, 2, 3, 1021], "subgroup {0,2}", dict(rs=C_RS2, ag=C_AG2, ar=C_AR2))
    _run(ctx, [[0, 1, 2], [0, 2]], blocks)


def group_rings4(ctx):
    """Correctness at p = 4, in a start of its own: a receive left posted by a failed call would
    catch the next ring's messages between the same two ranks, so no other check shares these."""
    seed = _seed()
    sizes = [0, 1, 3, 4, 5, 8, 4 * random.Random(seed).randint(300, 900), 4099]
    blocks = inputs.blocks(seed, [0, 1, 2, 3], 0, sizes, "p=4", dict(rs=C_RS4, ag=C_AG4, ar=C_AR4),
                           dtypes=("float32", "int64"))
    _run(ctx, [[0, 1, 2, 3]], blocks)


def _run(ctx, groups: list[list[int]], blocks: list[Block]) -> None:
    """Start len(groups[0]) ranks with these process groups, run every block, judge each."""
    world = groups[0]
    names = [b.name for b in blocks]
    per_rank = [[[b.label, b.group_index, [c.call for c in b.calls[rank]]] for b in blocks if rank in b.members]
                for rank in world]
    try:
        reply = ctx.untrusted().call(PROBE + "run_plan", len(world), groups, per_rank)
    except Exception as exc:  # noqa: BLE001 - the worker is gone (timeout, crash): every check's outcome
        all_get(ctx, names, exc)
        return
    shutdown(ctx)
    try:
        results = answer(reply)
        if not isinstance(results, list) or len(results) != len(world):
            raise RuntimeError(f"the probe did not answer for {len(world)} ranks")
    except Exception as exc:  # noqa: BLE001 - what ended the ranks is every check's outcome
        all_get(ctx, names, exc)
        return
    for block in blocks:
        with ctx.check(block.name):
            judge_block(block, results)
