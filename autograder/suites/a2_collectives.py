"""Assignment a2: ring reduce-scatter, all-gather and allreduce on isend/irecv (`assignments/a2_collectives/`).

References are independent of the student's code: one process summing every rank's input in
float64 (inputs are small integers, so every sum is exact in every dtype and the ring must match
bit for bit); the bytes really handed to `dist.isend` (counted by the grader's own wrapper), next to
what the student recorded with `record_send`; gloo's own collectives for speed. Each group runs one
spawn of P ranks with many checks inside, each check caught inside the ranks so one failure does
not hide the others. The student's calls get a process group whose timeout is GROUP_TIMEOUT_S, so a
deadlocked ring ends as `timeout` within seconds. Collectives are forbidden statically (the names
below) and at run time (patched to raise inside every student call).
"""

from __future__ import annotations

import contextlib
import datetime
import random

from autograder import checks
from autograder.manifest import Check, Group, Manifest, Planted, Task

RING = "ring.py"
GROUP_TIMEOUT_S = 5     # a p2p wait longer than this is a deadlock (legit waits here take < 0.1 s)
SPAWN_TIMEOUT_S = 60    # the whole spawn, every check included
DTYPES = ("float32", "float16", "bfloat16", "int64")
SPEED_MIB, SPEED_P = 16, 2
RS_SPEED_MAX = 1.0      # gloo's reduce-scatter is a full allreduce: a ring of p-1 steps must beat it
AR_SPEED_MAX = 1.5      # a ring with fresh buffers and no pipelining measures 1.5-4.4x (ANCHORS.md)
NCCL_SPEED_MAX = 1.5

_COLLECTIVES = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
                "_reduce_scatter_base", "all_gather", "all_gather_into_tensor", "all_gather_single",
                "_all_gather_base", "all_gather_coalesced", "all_gather_object", "broadcast", "broadcast_object_list",
                "all_to_all", "all_to_all_single", "scatter", "gather", "batch_isend_irecv", "all_reduce_coalesced")
FORBIDDEN_CALLS = tuple(f"torch.distributed.{name}" for name in _COLLECTIVES)
FORBIDDEN = FORBIDDEN_CALLS + ("torch.distributed.distributed_c10d", "torch.distributed._functional_collectives",
                               "torch.distributed.nn", "torch.distributed.device_mesh", "scaletrain.comm.ring",
                               "scaletrain.comm.naive", "scaletrain.comm.ring_allreduce",
                               "scaletrain.comm.ring_reduce_scatter", "scaletrain.comm.ring_all_gather",
                               "importlib", "__import__", "exec", "eval")

C_RS = "reduce-scatter equals the single-process sum (p=3, hidden sizes and dtypes)"
C_RS2 = "reduce-scatter on a 2-rank subgroup {0, 2} (neighbours are global ranks)"
C_AG = "all-gather reassembles every shard (p=3, hidden sizes and dtypes)"
C_AG2 = "all-gather on a 2-rank subgroup {0, 2}"
C_AR = "allreduce in place: sum, avg, non-contiguous (p=3)"
C_AR2 = "allreduce on a 2-rank subgroup {0, 2}"
C_BYTES = "bytes per rank 2(p-1)·ceil(n/p)·itemsize, recorded as 2(p-1) messages"
C_RS_SPEED = f"reduce-scatter faster than gloo's (p={SPEED_P}, {SPEED_MIB} MiB, CPU)"
C_AR_SPEED = f"allreduce within {AR_SPEED_MAX}x of gloo's all_reduce (p={SPEED_P}, {SPEED_MIB} MiB, CPU)"
C_NCCL = f"allreduce within {NCCL_SPEED_MAX}x of NCCL (2 GPUs, 64 MiB)"

MANIFEST = Manifest(
    assignment="a2", folder="a2_collectives", title="Ring collectives on point-to-point messages",
    files={RING: "lib/scaletrain/comm/ring.py"},
    tasks=(
        Task("2.1", "Ring reduce-scatter", file=RING, functions=("ring_reduce_scatter_chunks",)),
        Task("2.2", "Ring all-gather", file=RING, functions=("ring_all_gather_chunks",)),
        Task("2.3", "Allreduce in place = reduce-scatter + all-gather", file=RING, functions=("ring_allreduce",)),
        Task("2.4", "Speed: pipelined segments, posted receives, reused buffers", file=RING),
    ),
    forbidden={RING: FORBIDDEN},
    groups=(
        Group("p3", "autograder.suites.a2_collectives:group_p3", timeout_s=90, checks=(
            Check("2.1", C_RS, 3), Check("2.2", C_AG, 2), Check("2.3", C_AR, 3), Check("2.3", C_BYTES, 2),
            Check("2.1", C_RS2, 1), Check("2.2", C_AG2, 1), Check("2.3", C_AR2, 1),
        )),
        Group("speed_cpu", "autograder.suites.a2_collectives:group_speed_cpu", timeout_s=120, checks=(
            Check("2.4", C_RS_SPEED, 1), Check("2.4", C_AR_SPEED, 2),
        )),
        Group("speed_gpu", "autograder.suites.a2_collectives:group_speed_gpu", timeout_s=180, needs_gpu=True,
              checks=(Check("2.4", C_NCCL, 2),)),
    ),
    planted=(
        Planted("off-by-one chunk index in reduce-scatter", RING,
                ("own = [chunks[(r - step - 2) % p]", "own = [chunks[(r - step - 1) % p]"),
                groups=("p3",), expect={C_RS: "failed", C_AR: "failed", C_AG: "passed"}),
        Planted("all-gather waits for its first receive before sending: deadlock", RING,
                ("    sent = []\n", "    recvs[0].wait()\n    sent = []\n"),
                groups=("p3",), expect={C_AG: "timeout", C_AR: "timeout"}),
        Planted("sends to the previous rank instead of the next: deadlock", RING,
                ("dst=ring.send_to", "dst=ring.recv_from"), groups=("p3",),
                expect={C_RS: "timeout", C_AG: "timeout"}),
        Planted("calls dist.all_reduce", RING,
                ("    ring_reduce_scatter_chunks(chunks, mine, ring)  #",
                 "    dist.all_reduce(flat, group=ring.group)\n    return tensor  #"),
                groups=("p3",), expect={C_RS: "flagged", C_AR: "flagged", C_BYTES: "flagged"}),
        Planted("reaches all_reduce through getattr", RING,
                ("    ring_reduce_scatter_chunks(chunks, mine, ring)  #",
                 "    getattr(dist, 'all_' + 'reduce')(flat, group=ring.group)\n    return tensor  #"),
                groups=("p3",), expect={C_AR: "flagged", C_RS: "passed", C_AG: "passed"}),
        Planted("raises on rank 1 only", RING,
                ("    if p == 1:\n        return out.copy_(chunks[0])\n",
                 "    if r == 1:\n        raise RuntimeError('rank 1 lost its chunk')\n"),
                groups=("p3",), expect={C_RS: "error", C_AR: "error"}),
    ),
)


# ---------------------------------------------------------------- inside the ranks

def _inputs(rank: int, n: int, dtype, seed: int):
    import torch
    g = torch.Generator().manual_seed(seed * 7919 + rank * 104729 + n)
    return torch.randint(-8, 9, (n,), generator=g).to(dtype)


def _total(ranks, n: int, dtype, seed: int):
    import torch
    return sum(_inputs(r, n, dtype, seed).double() for r in ranks).to(dtype) if n else torch.zeros(0, dtype=dtype)


def _padded_shard(total, rank_in_group: int, p: int):
    import torch
    m = -(-total.numel() // p)
    padded = torch.cat([total, total.new_zeros(p * m - total.numel())])
    return padded[rank_in_group * m:(rank_in_group + 1) * m]


@contextlib.contextmanager
def _count_sends(module, counted: list[int]):
    """Add to counted[0] the bytes of every tensor handed to dist.isend / dist.send while the block
    runs (also where the student's module bound them by name): the real traffic, independent of
    what the student records with record_send."""
    import torch.distributed as dist
    targets = [(dist, "isend"), (dist, "send")]
    targets += [(module, k) for k, v in vars(module).items() if v is dist.isend or v is dist.send]
    originals = [(owner, name, getattr(owner, name)) for owner, name in targets]

    def counting(fn):
        def call(tensor, *args, **kwargs):
            counted[0] += tensor.numel() * tensor.element_size()
            return fn(tensor, *args, **kwargs)
        return call

    try:
        for owner, name, fn in originals:
            setattr(owner, name, counting(fn))
        yield
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)


def _guard(module):
    return checks.forbid_calls(*FORBIDDEN_CALLS, modules=(module,))


def _run_checks(blocks) -> dict[str, tuple[str, str] | None]:
    """Run each (check name, fn) on this rank; an assertion, a stub or a forbidden call ends that
    check only. Anything else propagates: it ends the spawn and names this rank."""
    outcomes: dict[str, tuple[str, str] | None] = {}
    for name, fn in blocks:
        try:
            fn()
            outcomes.setdefault(name, None)
        except (AssertionError, NotImplementedError, checks.Flagged) as exc:
            if outcomes.get(name) is None:  # a check run twice (two groups) keeps its first failure
                outcomes[name] = (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    return outcomes


class _FirstFailure:
    """Keep the first failed assertion and go on: every rank must make the same sequence of ring
    calls, so a rank whose result is wrong early may not skip the calls its peers still make."""

    def __init__(self):
        self.message: str | None = None

    @contextlib.contextmanager
    def soft(self):
        try:
            yield
        except AssertionError as exc:
            self.message = self.message or str(exc) or "assertion failed"

    def raise_if_any(self) -> None:
        if self.message is not None:
            raise AssertionError(self.message)


def _correctness_blocks(ring_mod, ranks: list[int], rank: int, group, seed: int, sizes: list[int], tag: str):
    import torch
    import torch.distributed as dist
    from scaletrain.comm.counter import comm_counter

    p, me = len(ranks), ranks.index(rank)
    dtypes = [getattr(torch, d) for d in DTYPES]
    total = lambda n, dtype: _total(ranks, n, dtype, seed)  # noqa: E731

    def reduce_scatter():
        first = _FirstFailure()
        for dtype in dtypes:
            for n in sizes:
                x = _inputs(rank, n, dtype, seed)
                with _guard(ring_mod):
                    got = ring_mod.ring_reduce_scatter(x, group=group)
                with first.soft():
                    checks.assert_equal(got, _padded_shard(total(n, dtype), me, p),
                                        what=f"{tag} rank {rank} reduce-scatter shard, n={n} {dtype}")
                    assert torch.equal(x, _inputs(rank, n, dtype, seed)), f"{tag} reduce-scatter modified its input"
        first.raise_if_any()

    def all_gather():
        first = _FirstFailure()
        for dtype in dtypes:
            for n in sizes:
                shard = _padded_shard(total(n, dtype), me, p).clone()
                with _guard(ring_mod):
                    got = ring_mod.ring_all_gather(shard, n, group=group)
                with first.soft():
                    checks.assert_equal(got, total(n, dtype), what=f"{tag} rank {rank} all-gather, n={n} {dtype}")
        first.raise_if_any()

    def allreduce():
        first = _FirstFailure()
        for dtype in dtypes:
            for n in sizes:
                for op in ("sum", "avg") if dtype.is_floating_point and n else ("sum",):
                    x = _inputs(rank, n, dtype, seed)
                    with _guard(ring_mod):
                        out = ring_mod.ring_allreduce(x, op=op, group=group)
                    with first.soft():
                        assert out is x, f"{tag} ring_allreduce must return the tensor it was given (in place)"
                        want = total(n, dtype) if op == "sum" else total(n, dtype) / p
                        checks.assert_close(x, want, rtol=0.0 if op == "sum" else 1e-2 if dtype.itemsize == 2 else 1e-6,
                                            what=f"{tag} rank {rank} allreduce {op}, n={n} {dtype}")
        n = 7 * 13  # a strided view and a transposed matrix: the result must land in the caller's memory
        base = torch.full((2 * n,), -5.0)
        base[::2] = _inputs(rank, n, torch.float32, seed)
        y = _inputs(rank, n, torch.float32, seed).view(13, 7).t()
        with _guard(ring_mod):
            ring_mod.ring_allreduce(base[::2], group=group)
            ring_mod.ring_allreduce(y, group=group)
        with first.soft():
            checks.assert_equal(base[::2], total(n, torch.float32), what=f"{tag} allreduce of a strided view")
            assert torch.all(base[1::2] == -5.0), f"{tag} allreduce of a strided view wrote outside the view"
            checks.assert_equal(y, total(n, torch.float32).view(13, 7).t(),
                                what=f"{tag} allreduce of a transposed matrix")
        first.raise_if_any()

    def byte_count():
        first = _FirstFailure()
        for n, dtype in ((1, torch.float32), (p + 1, torch.bfloat16), (1000 * p + 1, torch.int64),
                         (4099, torch.float16)):
            x, itemsize, wire = _inputs(rank, n, dtype, seed), torch.empty(0, dtype=dtype).element_size(), [0]
            with _guard(ring_mod), _count_sends(ring_mod, wire), comm_counter() as stats:
                ring_mod.ring_allreduce(x, group=group)
            want = 2 * (p - 1) * (-(-n // p)) * itemsize
            with first.soft():
                assert wire[0] == want, (f"rank {rank}, n={n} {dtype}: isend carried {wire[0]} bytes, "
                                         f"the ring sends exactly 2(p-1)·ceil(n/p)·itemsize = {want}")
                assert (stats.bytes_sent, stats.messages) == (want, 2 * (p - 1)), (
                    f"rank {rank}, n={n}: record_send saw {stats.bytes_sent} bytes in {stats.messages} messages, "
                    f"expected {want} bytes in 2(p-1) = {2 * (p - 1)} (call record_send once per ring step)")
        dist.barrier(group=group)
        first.raise_if_any()

    return reduce_scatter, all_gather, allreduce, byte_count


def _short_group(ranks: list[int]):
    import torch.distributed as dist
    return dist.new_group(ranks=ranks, timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))


def _rank_p3(rank: int, world_size: int, seed: int):
    """All correctness checks in one spawn of 3 ranks: the whole world (hidden sizes), then a
    subgroup {0, 2} whose ring skips rank 1 (p = 2: send and receive partner are the same rank)."""
    ring_mod = checks.student_module("ring")
    everyone, subset = list(range(world_size)), [0, 2]
    whole, sub = _short_group(everyone), _short_group(subset)  # every rank creates every group
    sizes = sorted(set(checks.irregular_sizes(world_size)) | {random.Random(seed).randint(5000, 20000)})
    blocks = list(zip((C_RS, C_AG, C_AR, C_BYTES),
                      _correctness_blocks(ring_mod, everyone, rank, whole, seed, sizes, "p=3")))
    if rank in subset:  # rank 1 is done by then: nobody waits on an idle rank
        blocks += zip((C_RS2, C_AG2, C_AR2),
                      _correctness_blocks(ring_mod, subset, rank, sub, seed, [0, 1, 2, 3, 1021], "subgroup {0,2}"))
    outcomes = _run_checks(blocks)
    return {name: outcomes.get(name) for name in (C_RS, C_AG, C_AR, C_BYTES, C_RS2, C_AG2, C_AR2)}


def _untouched_stub(ring_mod) -> str | None:
    """The reason to fail every check at once when all three functions still raise
    NotImplementedError on a 1-rank group in this process (the untouched stub): no ranks to spawn."""
    import tempfile

    import torch
    import torch.distributed as dist
    calls = (lambda: ring_mod.ring_reduce_scatter(torch.ones(3)), lambda: ring_mod.ring_all_gather(torch.ones(3), 3),
             lambda: ring_mod.ring_allreduce(torch.ones(3)))
    reason = None
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            for call in calls:
                try:
                    call()
                except NotImplementedError as exc:
                    reason = str(exc)
                    continue
                except Exception:  # noqa: BLE001 - implemented, perhaps wrongly: the ranks will tell
                    pass
                return None
        finally:
            dist.destroy_process_group()
    return reason


def _spawn_ranks(ctx, fn, world_size: int, names: list[str], *args) -> list | None:
    """The ranks' results, or None after giving every check in `names` the outcome of what went
    wrong: the untouched stub (no ranks started), a deadlock (timeout), a crash (the rank named)."""
    from scaletrain.launch import spawn
    try:
        stub = _untouched_stub(ctx.student("ring"))
        if stub is not None:
            raise NotImplementedError(stub)
        return spawn(fn, world_size, *args, timeout_s=SPAWN_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - a student's failure is an outcome of every check here
        for name in names:
            with ctx.check(name):
                raise exc
        return None


def group_p3(ctx):
    names = [C_RS, C_AG, C_AR, C_BYTES, C_RS2, C_AG2, C_AR2]
    results = _spawn_ranks(ctx, _rank_p3, 3, names, _seed())
    if results is not None:
        ctx.report_ranks(names, results)


def _seed() -> int:
    return checks.trial_seeds(1, salt=2)[0]


# ---------------------------------------------------------------- speed

def _rank_speed(rank: int, world_size: int, device: str, mib: int):
    import torch
    import torch.distributed as dist
    from scaletrain import bench

    ring_mod = checks.student_module("ring")
    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    n = mib * 2**20 // 4
    group = dist.group.WORLD
    x = torch.full((n,), float(rank + 1), device=dev)
    with _guard(ring_mod):
        ring_mod.ring_allreduce(x)
    assert torch.all(x == world_size * (world_size + 1) / 2), "allreduce is wrong on the timing input"

    def guarded(fn):
        def call(*args):
            with _guard(ring_mod):
                return fn(*args)
        return call

    out = torch.empty(-(-n // world_size), device=dev)
    setup = lambda: (torch.ones(n, device=dev),)  # noqa: E731 - fresh input every rep
    kw = dict(setup=setup, warmup=2, reps=7, device=dev, group=group)
    ar = bench.compare(guarded(ring_mod.ring_allreduce), dist.all_reduce, **kw)
    rs = None
    if device != "cuda":
        rs = bench.compare(guarded(ring_mod.ring_reduce_scatter), lambda t: dist.reduce_scatter_single(out, t), **kw)
    return {"ar": (ar.ratio, ar.ratio_p20, ar.ratio_p80), "rs": rs and (rs.ratio, rs.ratio_p20, rs.ratio_p80)}


def _speed_verdict(ratios, limit: float, what: str) -> None:
    ratio, p20, p80 = ratios
    if ratio < 0.1:
        raise checks.Flagged(f"{what}: {1 / ratio:.0f}x faster than the backend's own collective is implausible")
    assert ratio <= limit, (f"{what}: {ratio:.2f}x the backend's time (p20-p80 {p20:.2f}-{p80:.2f}), "
                            f"limit {limit}x: segment the chunks, post receives early, reuse buffers")


def group_speed_cpu(ctx):
    results = _spawn_ranks(ctx, _rank_speed, SPEED_P, [C_RS_SPEED, C_AR_SPEED], "cpu", SPEED_MIB)
    if results is None:
        return
    with ctx.check(C_RS_SPEED):
        _speed_verdict(results[0]["rs"], RS_SPEED_MAX, "reduce-scatter vs gloo's reduce_scatter")
    with ctx.check(C_AR_SPEED):
        _speed_verdict(results[0]["ar"], AR_SPEED_MAX, "allreduce vs gloo's all_reduce")


def group_speed_gpu(ctx):
    import torch
    if torch.cuda.device_count() < 2:  # one GPU cannot host a 2-rank NCCL ring
        ctx.record(C_NCCL, "not_run", f"needs 2 GPUs for NCCL, found {torch.cuda.device_count()}")
        return
    results = _spawn_ranks(ctx, _rank_speed, 2, [C_NCCL], "cuda", 64)  # launch picks NCCL: a GPU per rank
    if results is not None:
        with ctx.check(C_NCCL):
            _speed_verdict(results[0]["ar"], NCCL_SPEED_MAX, "allreduce vs NCCL's all_reduce")
