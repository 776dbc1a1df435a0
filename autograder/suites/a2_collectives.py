"""Assignment a2: ring reduce-scatter, all-gather and allreduce on isend/irecv (`assignments/a2_collectives/`).

Every group is *trusted* (`Group.trusted`): this module never imports the submission. The
student's ring runs in gloo ranks that the sandboxed worker starts (`autograder/probes/a2_collectives.py`),
each rank with its own inputs, generated here from the grading seed and sent over as data; the
ranks hand back what the calls returned or left in place, the messages they handed to
isend/irecv (peer and bytes, counted by the probe's own wrappers) and what `record_send` counted.
Here, and only here:

- the expected values: one process summing every rank's input in float64 (inputs are small
  integers, so every sum is exact in every dtype and the ring must match bit for bit);
- the technique, from the traffic: every message goes to the next rank of the ring and comes from
  the previous one, a result that needs the ring moves at least its volume (a sum computed some
  other way moved nothing), the allreduce hands isend exactly 2(p-1)·ceil(n/p)·itemsize bytes and
  records them as 2(p-1) messages; bytes are evidence, granted only with the allreduce's values
  (`Check.needs`, `grade.with_values`);
- forbidden collectives: each rank installs traps before it imports the submission (a collective
  saved at import or called as a ProcessGroup method is the trap too) and reports every trap
  reached, even one whose exception the student's code caught: `flagged`;
- speed: the clock is this process's, around worker calls that run a batch of calls in ranks that
  are already up; the baseline runs in ranks that never import student code, while the student's
  ranks are stopped (SIGSTOP); this machinery's own overhead, timed on the baseline's ranks, is
  subtracted from both sides; each batch's results are sampled and checked.

The student's calls get process groups whose timeout is GROUP_TIMEOUT_S, so a deadlocked ring
ends as `timeout` within seconds.
"""

from __future__ import annotations

import random
import statistics
import time
import zlib

from autograder import checks
from autograder.manifest import Check, Group, Manifest, Planted, Task
from autograder.suites import sized

RING = "ring.py"
PROBE = "autograder.probes.a2_collectives:"
GROUP_TIMEOUT_S = 5     # autograder/probes/a2_collectives.py: a p2p wait longer than this is a deadlock
DTYPES = ("float32", "float16", "bfloat16", "int64")
PUBLIC_SIZES = (0, 1, 2, 3, 4, 10, 1001)  # assignments/a2_collectives/tests: every one runs here too (issue 27)
SPEED_MIB, SPEED_P = 16, 2
RS_SPEED_MAX = 1.0      # gloo's reduce-scatter is a full allreduce: a ring of p-1 steps must beat it
AR_SPEED_MAX = 1.5      # a ring with fresh buffers and no pipelining measures 1.5-4.4x (ANCHORS.md)
NCCL_SPEED_MAX = 1.5
SPEED_PAIRS = 7         # timed batches per side, alternating; the verdict is the median of their ratios
SPEED_ROUNDS = 3        # a round whose p20-p80 band spans the limit is inconclusive and measured again
SPEED_REPS = 3          # calls per timed batch
SAMPLES = 64            # positions of each timed result that are checked
CHECK_SAMPLES = 4096    # positions of the timing input's results that are checked (and every chunk's ends)

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
P3_CHECKS = (C_RS, C_AG, C_AR, C_BYTES, C_RS2, C_AG2, C_AR2)

# planted submissions: what a determined student tries against the split (issue 13)
_SLOW_RING = '''

def _sleepy(fn):  # a correct ring that is slow on the timing input (shards of a million elements and more)
    def call(chunks, out, ring):  # 0.25 s: several times gloo's time even on a loaded machine
        if out.numel() >= 1 << 18:
            _time.sleep(0.25)
            _SLEPT[0] += 0.25
        return fn(chunks, out, ring)
    return call


@_sleepy
def ring_reduce_scatter_chunks('''
_PATCHED_CLOCK = '''import time as _time

_SLEPT = [0.0]
if not getattr(_time.perf_counter, "patched", False):
    _real_clock = _time.perf_counter

    def _clock():  # the clock stands still while this ring sleeps
        return _real_clock() - _SLEPT[0]
    _clock.patched = True
    _time.perf_counter = _clock
''' + _SLOW_RING
_SLOW_BASELINE = '''import time as _time

_SLEPT = [0.0]
_originals = {name: getattr(dist, name) for name in ("all_" + "reduce", "reduce_" + "scatter_single")}


def _slowed(name):
    def call(*args, **kwargs):  # the baseline the grader times is as slow as this ring
        _time.sleep(0.25)
        return _originals[name](*args, **kwargs)
    return call


for _name in _originals:
    setattr(dist, _name, _slowed(_name))
''' + _SLOW_RING
_FORGED = '''    """The ring of `group` (None: all ranks), neighbours mapped to global ranks."""
    import atexit
    import json
    import os
    lines = "".join(json.dumps({"name": name, "outcome": "passed", "reason": "", "duration": 0.5}) + "\\n"
                    for name in %r)

    def forge():  # append "passed" to every report in the grading folder of this process or an ancestor
        pid, folders = os.getpid(), []
        while pid > 1:
            try:
                if os.readlink(f"/proc/{pid}/cwd").startswith("/tmp/grade-"):
                    folders += [f"/proc/{pid}/cwd", f"/proc/{pid}/cwd/..", f"/proc/{pid}/cwd/../.."]
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                break
        for folder in folders:
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                if entry.name.endswith(".jsonl"):
                    try:
                        with open(entry.path, "a") as f:
                            f.write(lines)
                    except OSError:
                        pass
        print(lines, flush=True)
    forge()
    atexit.register(forge)
    import autograder.context
    autograder.context.classify = lambda exc, submission: ("passed", "")
    raise NotImplementedError("a2: not implemented (forges the grader's report instead)")
''' % (P3_CHECKS + (f"reduce-scatter faster than gloo's (p={SPEED_P}, {SPEED_MIB} MiB, CPU)",
                    f"allreduce within {AR_SPEED_MAX}x of gloo's all_reduce (p={SPEED_P}, {SPEED_MIB} MiB, CPU)"),)
_AR_DEF = 'def ring_allreduce(tensor: torch.Tensor, op: str = "sum", group: Any = None) -> torch.Tensor:'
_THROUGH = '''

def _through(collective, fallback=False):
    def wrap(ring_allreduce):
        def call(tensor, op="sum", group=None):
            flat = tensor.contiguous()
            try:
                collective(flat, group)
            except Exception:
                if fallback:  # the guard's exception swallowed: the ring does the work after all
                    return ring_allreduce(tensor, op, group)
                raise
            if op == "avg":
                flat.div_(dist.get_world_size(group))
            if flat is not tensor:
                tensor.copy_(flat)
            return tensor
        return call
    return wrap


'''
_SAVED = ('_SAVED = {"all_reduce": getattr(dist, "all_" + "reduce")}  # taken at import, before any guard' + _THROUGH
          + '@_through(lambda flat, group: _SAVED["all_reduce"](flat, group=group))\n' + _AR_DEF)
_SAVED_CAUGHT = ('_SAVED = {"all_reduce": getattr(dist, "all_" + "reduce")}' + _THROUGH
                 + '@_through(lambda flat, group: _SAVED["all_reduce"](flat, group=group), fallback=True)\n' + _AR_DEF)
_PG_METHOD = ("_WORLD = dist.group" + _THROUGH
              + '@_through(lambda flat, group: (group if group is not None else _WORLD.WORLD).allreduce([flat]).wait())\n'
              + _AR_DEF)
_ALL_TO_ALL = ('''def _all_to_all(ring_allreduce):
    def call(tensor, op="sum", group=None):  # right sums, no ring: every rank sends everything to everyone
        ring = ring_of(group)
        flat = tensor.contiguous().view(-1)
        p, n = ring.world_size, flat.numel()
        if p == 1 or n == 0:
            return tensor
        pg = group if group is not None else dist.group.WORLD
        peers = [dist.get_global_rank(pg, i) for i in range(p) if i != ring.rank]
        bufs = [torch.empty_like(flat) for _ in peers]
        handles = [dist.irecv(b, src=q, group=group) for b, q in zip(bufs, peers)]
        handles += [dist.isend(flat, dst=q, group=group) for q in peers]
        for h in handles:
            h.wait()
        for b in bufs:
            flat += b
        if op == "avg":
            flat /= p
        record_send(2 * (p - 1) * shard_numel(n, p) * flat.element_size(), 2 * (p - 1))  # the ring's figures
        if flat.data_ptr() != tensor.data_ptr():
            tensor.copy_(flat.view(tensor.shape))
        return tensor
    return call


@_all_to_all
''' + _AR_DEF)
_P3_PASS = {C_RS: "passed", C_AG: "passed", C_AR: "passed", C_BYTES: "passed", C_AR2: "passed"}

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
        Group("p3", "autograder.suites.a2_collectives:group_p3", timeout_s=90, trusted=True, checks=(
            Check("2.1", C_RS, 3), Check("2.2", C_AG, 2), Check("2.3", C_AR, 3),
            Check("2.3", C_BYTES, 2, needs=(C_AR,)),
            Check("2.1", C_RS2, 1), Check("2.2", C_AG2, 1), Check("2.3", C_AR2, 1),
        )),
        Group("speed_cpu", "autograder.suites.a2_collectives:group_speed_cpu", timeout_s=120, trusted=True, checks=(
            Check("2.4", C_RS_SPEED, 1), Check("2.4", C_AR_SPEED, 2),
        )),
        Group("speed_gpu", "autograder.suites.a2_collectives:group_speed_gpu", timeout_s=180, needs_gpu=True,
              trusted=True, checks=(Check("2.4", C_NCCL, 2),)),
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
        # issue 27: n = 0, a size the public tests exercise, costs hidden marks too
        Planted("allreduce of an empty tensor runs the ring: records 2(p-1) empty messages", RING,
                ("    if ring.world_size == 1 or tensor.numel() == 0:\n        return tensor\n",
                 "    if ring.world_size == 1:\n        return tensor\n"), groups=("p3",),
                expect={C_BYTES: "failed", C_AR: "passed", C_RS: "passed", C_AR2: "passed"}),
        # issue 13: run-time guards stepped around
        Planted("saves dist.all_reduce at import, before any guard", RING, (_AR_DEF, _SAVED), groups=("p3",),
                expect={C_AR: "flagged", C_AR2: "flagged", C_BYTES: "flagged", C_RS: "passed", C_AG: "passed"}),
        Planted("catches the guard's exception and falls back to its ring", RING, (_AR_DEF, _SAVED_CAUGHT),
                groups=("p3",), expect={C_AR: "flagged", C_BYTES: "flagged", C_RS: "passed", C_AG: "passed"}),
        Planted("calls allreduce as a ProcessGroup method", RING, (_AR_DEF, _PG_METHOD), groups=("p3",),
                expect={C_AR: "flagged", C_AR2: "flagged", C_BYTES: "flagged", C_RS: "passed"}),
        # issue 13: the technique, not only the numbers (the sums are right; before, this earned 2.3's 4 points)
        Planted("allreduce by sending everything to everyone, not a ring", RING, (_AR_DEF, _ALL_TO_ALL),
                groups=("p3",), expect={C_AR: "failed", C_BYTES: "failed", C_RS: "passed", C_AG: "passed"}),
        # issue 13: speed checks that trusted the student's process; a slow but correct ring
        Planted("a slow ring that patches time.perf_counter", RING, ("def ring_reduce_scatter_chunks(", _PATCHED_CLOCK),
                groups=("p3", "speed_cpu"), expect={**_P3_PASS, C_RS_SPEED: "failed", C_AR_SPEED: "failed"}),
        Planted("a slow ring that wraps dist.all_reduce to run slower", RING,
                ("def ring_reduce_scatter_chunks(", _SLOW_BASELINE), groups=("speed_cpu",),
                expect={C_RS_SPEED: "failed", C_AR_SPEED: "failed"}),
        # issue 13: verdicts written from the student's process
        Planted("forges report lines, patches classify, registers an atexit hook", RING,
                ('    """The ring of `group` (None: all ranks), neighbours mapped to global ranks."""\n', _FORGED),
                groups=("p3", "speed_cpu"), expect={**{name: "failed" for name in P3_CHECKS},
                                                    C_RS_SPEED: "failed", C_AR_SPEED: "failed"}),
    ),
)


# ---------------------------------------------------------------- hidden inputs and their sums

def _input(seed: int, label: str, rank: int, n: int, dtype):
    """Rank `rank`'s input: small integers, from the grading seed (never seen by the worker)."""
    import torch
    key = zlib.crc32(f"{label}/{rank}/{n}/{dtype}".encode())
    g = torch.Generator().manual_seed((seed * 1_000_003 + key) % (1 << 62))
    return torch.randint(-8, 9, (n,), generator=g).to(dtype)


def _total(inputs):
    """The exact sum over ranks, computed in float64 (exact: small integers)."""
    return sum(x.double() for x in inputs).to(inputs[0].dtype)


def _padded_shard(total, index: int, p: int):
    import torch
    m = -(-total.numel() // p)
    padded = torch.cat([total, total.new_zeros(p * m - total.numel())])
    return padded[index * m:(index + 1) * m]


class _Call:
    """One student call on one rank: what is sent (`call`) and what must come back (`judge`)."""

    def __init__(self, call: dict, judge, *, fn: str, m: int, itemsize: int, n: int, dtype, exact_bytes: bool = False):
        self.call, self.judge, self.fn = call, judge, fn
        self.m, self.itemsize, self.n, self.dtype, self.exact_bytes = m, itemsize, n, dtype, exact_bytes


class _Block:
    """One check's calls on the ranks of one process group."""

    def __init__(self, label: str, name: str, members: list[int], group_index: int):
        self.label, self.name, self.members, self.group_index = label, name, members, group_index
        self.calls: dict[int, list[_Call]] = {rank: [] for rank in members}


def _blocks(seed: int, members: list[int], group_index: int, sizes: list[int], tag: str, names) -> list[_Block]:
    import torch

    p = len(members)
    rs, ag, ar, nbytes = (_Block(f"{tag}:{kind}", name, members, group_index)
                          for kind, name in zip(("rs", "ag", "ar", "bytes"), names))
    for dtype in (getattr(torch, d) for d in DTYPES):
        itemsize = torch.empty(0, dtype=dtype).element_size()
        for n in sizes:
            xs = [_input(seed, tag, rank, n, dtype) for rank in members]
            total, m = _total(xs) if n else torch.zeros(0, dtype=dtype), -(-n // p)
            for me, rank in enumerate(members):
                what = f"{tag} rank {rank}"
                rs.calls[rank].append(_Call(
                    {"fn": "rs", "x": xs[me]}, _judge_rs(_padded_shard(total, me, p), xs[me], f"{what} reduce-scatter shard, n={n} {dtype}", tag),
                    fn="reduce-scatter", m=m, itemsize=itemsize, n=n, dtype=dtype))
                ag.calls[rank].append(_Call(
                    {"fn": "ag", "x": _padded_shard(total, me, p).clone(), "n": n},
                    _judge_out(total, f"{what} all-gather, n={n} {dtype}"),
                    fn="all-gather", m=m, itemsize=itemsize, n=n, dtype=dtype))
                for op in ("sum", "avg") if dtype.is_floating_point and n else ("sum",):
                    want = total if op == "sum" else total / p
                    rtol = 0.0 if op == "sum" else 1e-2 if itemsize == 2 else 1e-6
                    ar.calls[rank].append(_Call(
                        {"fn": "ar", "x": xs[me], "op": op},
                        _judge_in_place(want, rtol, f"{what} allreduce {op}, n={n} {dtype}", tag),
                        fn="allreduce", m=m, itemsize=itemsize, n=n, dtype=dtype))
    n = 7 * 13  # a strided view and a transposed matrix: the result must land in the caller's memory
    xs = [_input(seed, tag + "/views", rank, n, torch.float32) for rank in members]
    total = _total(xs)
    for me, rank in enumerate(members):
        base = torch.full((2 * n,), -5.0)
        base[::2] = xs[me]
        ar.calls[rank].append(_Call({"fn": "ar", "x": base, "view": "strided"}, _judge_strided(total, tag),
                                    fn="allreduce", m=-(-n // p), itemsize=4, n=n, dtype=torch.float32))
        for op, want in (("sum", total), ("avg", total / p)):  # avg: the public test's
            ar.calls[rank].append(_Call({"fn": "ar", "x": xs[me].view(13, 7).clone(), "view": "transposed", "op": op},
                                        _judge_after(want.view(13, 7), f"{tag} allreduce {op} of a transposed matrix"),
                                        fn="allreduce", m=-(-n // p), itemsize=4, n=n, dtype=torch.float32))
    blocks = [rs, ag, ar]
    if nbytes.name is not None:
        public = [(n, getattr(torch, DTYPES[i % len(DTYPES)])) for i, n in enumerate(PUBLIC_SIZES)]  # n = 0: silent
        for n, dtype in [(1, torch.float32), (p + 1, torch.bfloat16), (1000 * p + 1, torch.int64),
                         (4099, torch.float16)] + public:
            itemsize = torch.empty(0, dtype=dtype).element_size()
            for rank in members:
                nbytes.calls[rank].append(_Call({"fn": "ar", "x": _input(seed, tag + "/bytes", rank, n, dtype)},
                                                lambda record: None, fn="allreduce", m=-(-n // p),
                                                itemsize=itemsize, n=n, dtype=dtype, exact_bytes=True))
        blocks.append(nbytes)
    return blocks


def _returned(record, what: str):
    if record.get("out") is None:
        raise AssertionError(f"{what}: returned {record.get('out_type', 'nothing')}, expected a tensor")
    return record["out"]


def _judge_rs(want, x, what: str, tag: str):
    def judge(record):
        checks.assert_equal(_returned(record, what), want, what=what)
        assert _equal(record["after"], x), f"{tag} reduce-scatter modified its input"
    return judge


def _judge_out(want, what: str):
    def judge(record):
        checks.assert_equal(_returned(record, what), want, what=what)
    return judge


def _judge_in_place(want, rtol: float, what: str, tag: str):
    def judge(record):
        assert record["same"], f"{tag} ring_allreduce must return the tensor it was given (in place)"
        checks.assert_close(record["after"], want, rtol=rtol, what=what)
    return judge


def _judge_strided(total, tag: str):
    def judge(record):
        base = record["after"]
        checks.assert_equal(base[::2], total, what=f"{tag} allreduce of a strided view")
        assert bool((base[1::2] == -5.0).all()), f"{tag} allreduce of a strided view wrote outside the view"
    return judge


def _judge_after(want, what: str):
    def judge(record):
        checks.assert_equal(record["after"], want, what=what)
    return judge


def _equal(a, b) -> bool:
    import torch
    return isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# ---------------------------------------------------------------- judging what the ranks saw

def _traffic(record, call: _Call, rank: int, members: list[int]) -> None:
    """The technique, from the messages the rank handed to isend/irecv: the ring's neighbours only,
    and at least the ring's volume (exactly its volume, recorded as 2(p-1) messages, for the byte
    check). A sum obtained without moving the data, or by sending to everyone, fails here."""
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
    want = steps * call.m * call.itemsize
    if call.exact_bytes:
        assert sent == want, (f"{where}: isend carried {sent} bytes, the ring sends exactly "
                              f"2(p-1)·ceil(n/p)·itemsize = {want}")
        recorded = tuple(record.get("recorded") or (None, None))
        assert recorded == (want, steps), (
            f"{where}: record_send saw {recorded[0]} bytes in {recorded[1]} messages, expected {want} bytes in "
            f"2(p-1) = {steps} (call record_send once per ring step)")
    else:  # a lower bound that also holds for a ring that skips its padding (the byte check is exact)
        least = steps * (call.n // p) * call.itemsize
        assert sent >= least, (f"{where}: {sent} bytes handed to dist.isend, but a ring moves at least "
                               f"{steps}·floor(n/p)·itemsize = {least} bytes per rank: the result did not travel "
                               "the ring")


def _rank_problem(records: list, calls: list[_Call], rank: int, members: list[int]) -> Exception | None:
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
            _traffic(record, call, rank, members)
        except AssertionError as exc:
            message = str(exc)
            return AssertionError(message if message.startswith(("p=", "subgroup", "rank")) else f"rank {rank}: {message}")
    if len(records) != len(calls):  # issue 28: a short or long answer is a failure, not fewer checks
        return AssertionError(f"rank {rank} answered {len(records)} calls, the check made {len(calls)}")
    return None


def _judge_block(block: _Block, per_rank: list[dict]) -> None:
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
        problems.append(_rank_problem(records, block.calls[rank], rank, block.members))
    first = next((p for p in problems if p is not None), None)
    if first is not None:
        raise first


def _failure(failure) -> Exception:
    """What ended the ranks (probe's data) as the exception `classify` sorts."""
    from scaletrain.launch import RankError, SpawnTimeout

    if failure and failure[0] == "timeout":
        return SpawnTimeout(str(failure[1]))
    if failure and failure[0] == "rank" and len(failure) == 5:
        _, rank, exc_type, message, tb = failure
        return RankError(int(rank), str(exc_type), str(message), str(tb))
    return RuntimeError(f"the ranks failed: {str(failure)[:300]}")


def _answer(reply):
    if not isinstance(reply, dict) or ("ok" not in reply and "failure" not in reply):
        raise RuntimeError("the probe sent a malformed answer")
    if "failure" in reply:
        raise _failure(reply["failure"])
    return reply["ok"]


def _all_get(ctx, names, exc: Exception) -> None:
    for name in names:
        with ctx.check(name):
            raise exc


# ---------------------------------------------------------------- correctness

def _shutdown(ctx) -> None:
    """Let the worker stop its ranks and remove its temporary folders while it is still alive."""
    try:
        ctx.untrusted().call(PROBE + "shutdown", timeout_s=30)
    except Exception:  # noqa: BLE001 - cleaning up only: the worker is killed next anyway
        pass


def _seed() -> int:
    return checks.trial_seeds(1, salt=2)[0]


def group_p3(ctx):
    """All correctness checks in one start of 3 ranks: the whole world (hidden sizes), then a
    subgroup {0, 2} whose ring skips rank 1 (p = 2: send and receive partner are the same rank)."""
    seed, world = _seed(), [0, 1, 2]
    sizes = sorted(set(checks.irregular_sizes(3)) | set(PUBLIC_SIZES) | {random.Random(seed).randint(5000, 20000)})
    blocks = _blocks(seed, world, 0, sizes, "p=3", (C_RS, C_AG, C_AR, C_BYTES))
    blocks += _blocks(seed, [0, 2], 1, [0, 1, 2, 3, 1021], "subgroup {0,2}", (C_RS2, C_AG2, C_AR2, None))
    per_rank = [[[b.label, b.group_index, [c.call for c in b.calls[rank]]] for b in blocks if rank in b.members]
                for rank in world]
    try:
        reply = ctx.untrusted().call(PROBE + "run_plan", 3, [world, [0, 2]], per_rank)
    except Exception as exc:  # noqa: BLE001 - the worker is gone (timeout, crash): every check's outcome
        _all_get(ctx, P3_CHECKS, exc)
        return
    _shutdown(ctx)
    try:
        results = _answer(reply)
        if not isinstance(results, list) or len(results) != 3:
            raise RuntimeError("the probe did not answer for 3 ranks")
    except Exception as exc:  # noqa: BLE001 - what ended the ranks is every check's outcome
        _all_get(ctx, P3_CHECKS, exc)
        return
    for block in blocks:
        with ctx.check(block.name):
            _judge_block(block, results)


# ---------------------------------------------------------------- speed

def _speed_ranks(p: int, n: int):
    """Each rank's timing-input seed (hidden) and the inputs they stand for."""
    import torch
    seeds = [s % (1 << 62) for s in checks.trial_seeds(p, salt=3)]
    inputs = [torch.randint(-8, 9, (n,), generator=torch.Generator().manual_seed(s)).to(torch.float32) for s in seeds]
    return seeds, inputs


def _check_samples(n: int, p: int, rng: random.Random) -> list[dict]:
    """Per rank, the positions of its timing-input results that are compared: hidden random ones and
    every chunk's first and last element."""
    m = -(-n // p)
    edges = sorted({i for c in range(p) for i in (c * m, min((c + 1) * m, n) - 1)})
    return [{"rs": sorted(set(rng.sample(range(m), CHECK_SAMPLES)) | {0, m - 1}),
             "ar": sorted(set(rng.sample(range(n), CHECK_SAMPLES)) | set(edges))} for _ in range(p)]


def _timing_input_verdict(answers, inputs, p: int, op: str, samples: list[dict]) -> None:
    """The student's reduce-scatter ("rs") or allreduce ("ar") on the timing input, each rank's."""
    import torch
    total = sum(x.double() for x in inputs).float()
    n = total.numel()
    m = -(-n // p)
    for rank, got in enumerate(sized(answers, p, "the ranks' answers for the timing input")):
        if not isinstance(got, dict):
            raise AssertionError(f"rank {rank} returned nothing for the timing input")
        if got.get("trapped"):
            raise checks.Flagged(f"rank {rank}: called forbidden `{got['trapped'][0]}`")
        raised = got.get(f"{op}_raised")
        if raised:
            kind, message, where = (str(x) for x in raised)
            exc = NotImplementedError if kind == "NotImplementedError" else AssertionError
            raise exc(f"rank {rank}: {message}{where}")
        idx = torch.tensor(samples[rank][op])
        if op == "rs":
            assert got.get("rs_shape") == [m], f"rank {rank}: reduce-scatter returned shape {got.get('rs_shape')}, expected [{m}]"
            checks.assert_equal(got.get("rs"), total[rank * m + idx], what=f"rank {rank} reduce-scatter of the timing input")
        else:
            assert got.get("ar_same"), "ring_allreduce must return the tensor it was given (in place)"
            checks.assert_equal(got.get("ar"), total[idx], what=f"rank {rank} allreduce of the timing input")


class _Timer:
    """Batches timed here, around worker calls; the ranks are up before the clock starts."""

    def __init__(self, worker, p: int, inputs):
        self.worker, self.p, self.inputs = worker, p, inputs
        self.n = inputs[0].numel()
        self.rng = random.Random(checks.trial_seeds(1, salt=4)[0])

    def batch(self, kind: str, op: str) -> float:
        m = -(-self.n // self.p)
        limit = self.n if op in ("ar", "none") else m
        samples = [sorted(self.rng.sample(range(limit), SAMPLES)) for _ in range(self.p)]
        scales = [[[self.rng.randint(1, 4), self.rng.randint(-4, 4)] for _ in range(SPEED_REPS)] for _ in range(self.p)]
        if kind == "gloo":
            self.worker.call(PROBE + "speed_pause", "student", True)
        try:
            t0 = time.perf_counter()
            got = _answer(self.worker.call(PROBE + "speed_run", kind, op, scales, samples))
            elapsed = time.perf_counter() - t0
        finally:
            if kind == "gloo":
                self.worker.call(PROBE + "speed_pause", "student", False)
        if kind == "student":
            self._verify(got, op, samples, scales)
        return elapsed

    def _verify(self, got, op: str, samples, scales) -> None:
        """Every timed call computed the sum of its fresh inputs: its values at hidden positions."""
        import torch
        m = -(-self.n // self.p)
        for rank, answer in enumerate(sized(got, self.p, "the ranks' answers for a timed batch")):
            results = answer.get("samples") if isinstance(answer, dict) else None
            if not isinstance(results, list) or len(results) != SPEED_REPS:
                raise AssertionError(f"rank {rank} returned no results for the timed calls")
            idx = torch.tensor(samples[rank]) + (rank * m if op == "rs" else 0)
            for rep, values in enumerate(results):
                want = sum(x[idx] * scales[r][rep][0] + scales[r][rep][1] for r, x in enumerate(self.inputs))
                checks.assert_equal(values, want, what=f"rank {rank}: timed call {rep + 1} of a batch (sampled)")


def _measure(timer: _Timer, op: str) -> tuple[float, float, float]:
    """Median, p20, p80 of student/baseline time per pair of batches, this machinery's overhead (a
    batch of no calls on the baseline's ranks) taken off both."""
    from scaletrain.bench import quantile

    timer.batch("student", op)
    timer.batch("gloo", op)  # warm-up
    student, baseline, overhead = [], [], []
    for pair in range(SPEED_PAIRS):
        order = ("student", "gloo") if pair % 2 == 0 else ("gloo", "student")
        for kind in order:
            (student if kind == "student" else baseline).append(timer.batch(kind, op))
        overhead.append(timer.batch("gloo", "none"))
    o = statistics.median(overhead)
    ratios = [max(s - o, 1e-6) / max(b - o, 0.25 * b) for s, b in zip(student, baseline, strict=True)]
    return statistics.median(ratios), quantile(ratios, 0.2), quantile(ratios, 0.8)


def _measure_rounds(timer: _Timer, op: str, limit: float) -> tuple[tuple[float, float, float], int]:
    """The best of up to SPEED_ROUNDS rounds of `_measure`, and how many ran. A round whose median
    misses the limit while its p20 is within it says more about the machine's load than about the
    ring (CI's other pytest worker shares the two cores: a ring at 0.9x quiet measured 1.69x,
    p20-p80 1.24-1.92), so it is measured again; a ring whose p20 misses too is slow, and fails at once."""
    best, rounds = None, 0
    while rounds < SPEED_ROUNDS:
        ratios = _measure(timer, op)
        rounds += 1
        best = ratios if best is None or ratios[0] < best[0] else best
        if best[0] <= limit or ratios[1] > limit:
            break
    return best, rounds


def _speed_verdict(ctx, ratios, limit: float, what: str, rounds: int) -> None:
    ratio, p20, p80 = ratios
    if ratio < 0.1:
        raise checks.Flagged(f"{what}: {1 / ratio:.0f}x faster than the backend's own collective is implausible")
    best = f", the best of {rounds} rounds" if rounds > 1 else ""
    measured = f"{what}: {ratio:.2f}x the backend's time (p20-p80 {p20:.2f}-{p80:.2f}{best}), limit {limit}x"
    assert ratio <= limit, f"{measured}: segment the chunks, post receives early, reuse buffers"
    ctx.note(measured)


def _speed(ctx, device: str, p: int, mib: int, checks_by_op: dict) -> None:
    """checks_by_op: op ("rs", "ar") -> (check name, limit, what). Correctness on the timing input
    first, then each op timed against the baseline."""
    from autograder.untrusted import StudentCrash

    worker = ctx.untrusted()
    n = mib * 2**20 // 4
    seeds, inputs = _speed_ranks(p, n)
    names = [name for name, _, _ in checks_by_op.values()]
    samples = _check_samples(n, p, random.Random(checks.trial_seeds(1, salt=5)[0]))
    try:
        answers = _answer(worker.call(PROBE + "speed_start", "student", p, device, seeds, n, samples))
    except Exception as exc:  # noqa: BLE001 - the ranks' failure is every check's outcome
        _all_get(ctx, names, exc)
        if not isinstance(exc, (TimeoutError, StudentCrash)):
            _shutdown(ctx)
        return
    todo = {}
    for op, (name, limit, what) in checks_by_op.items():
        try:
            _timing_input_verdict(answers, inputs, p, op, samples)
            todo[op] = (name, limit, what)
        except Exception as exc:  # noqa: BLE001 - graded only once correct on the timing input
            _all_get(ctx, [name], exc)
    fatal = None
    if todo:
        try:
            _answer(worker.call(PROBE + "speed_start", "gloo", p, device, seeds, n, samples))
        except Exception as exc:  # noqa: BLE001
            fatal = exc
    timer = _Timer(worker, p, inputs)
    for op, (name, limit, what) in todo.items():
        with ctx.check(name):
            if fatal is not None:
                raise fatal
            try:
                ratios, rounds = _measure_rounds(timer, op, limit)
            except (AssertionError, checks.Flagged):
                raise
            except Exception as exc:  # the worker or the ranks are gone: no later check can be timed
                fatal = exc
                raise
            _speed_verdict(ctx, ratios, limit, what, rounds)
    if not isinstance(fatal, (TimeoutError, StudentCrash)):
        _shutdown(ctx)


def group_speed_cpu(ctx):
    _speed(ctx, "cpu", SPEED_P, SPEED_MIB, {
        "rs": (C_RS_SPEED, RS_SPEED_MAX, "reduce-scatter vs gloo's reduce_scatter"),
        "ar": (C_AR_SPEED, AR_SPEED_MAX, "allreduce vs gloo's all_reduce"),
    })


def group_speed_gpu(ctx):
    import torch
    if torch.cuda.device_count() < 2:  # one GPU cannot host a 2-rank NCCL ring
        ctx.record(C_NCCL, "not_run", f"needs 2 GPUs for NCCL, found {torch.cuda.device_count()}")
        return
    _speed(ctx, "cuda", 2, 64, {"ar": (C_NCCL, NCCL_SPEED_MAX, "allreduce vs NCCL's all_reduce")})
