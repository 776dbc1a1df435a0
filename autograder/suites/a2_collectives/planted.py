"""a2's planted submissions: each an edit of the solution's ring.py and the outcome it must get,
from a one-line slip (a small share lost) to the attacks a determined student tries against the
trusted split (issue 13's catalogue) and the semantic cheats (right sums without a ring)."""

from __future__ import annotations

from autograder.manifest import Planted

from .names import (C_AG, C_AG_EVEN, C_AR, C_AR2, C_AR_EVEN, C_AR_SPEED, C_AR_VIEWS, C_BYTES, C_BYTES_EVEN, C_RS,
                    C_RS_EVEN, C_RS_SPEED, RING, RING_CHECKS)

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
_originals = {name: getattr(dist, name) for name in ("all_" + "reduce", "reduce_" + "scatter_single",
                                                     "reduce_" + "scatter_tensor") if hasattr(dist, name)}


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
''' % (RING_CHECKS + (C_RS_SPEED, C_AR_SPEED),)
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
_RING_PASS = {C_RS: "passed", C_AG: "passed", C_AR: "passed", C_BYTES: "passed", C_AR2: "passed"}

PLANTED = (
    Planted("off-by-one chunk index in reduce-scatter", RING,
            ("own = [chunks[(r - step - 2) % p]", "own = [chunks[(r - step - 1) % p]"),
            groups=("rings",), expect={C_RS: "failed", C_RS_EVEN: "failed", C_AR: "failed", C_AG: "passed",
                                       C_AG_EVEN: "passed"}),
    # small slips cost their case's share: a padded tail never copied back, a copy never written back
    Planted("allreduce forgets to copy the padded tail chunk back", RING,
            ("    write_back(chunks, flat)\n", ""), groups=("rings",),
            expect={C_AR: "failed", C_AR_EVEN: "passed", C_BYTES_EVEN: "passed", C_RS: "passed"}),
    Planted("allreduce of a non-contiguous tensor never writes its result back", RING,
            ("    if not tensor.is_contiguous():\n        tensor.copy_(flat.view(tensor.shape))\n", ""),
            groups=("rings",), expect={C_AR_VIEWS: "failed", C_AR: "passed", C_AR_EVEN: "passed", C_BYTES: "passed"}),
    Planted("all-gather waits for its first receive before sending: deadlock", RING,
            ("    sent = []\n", "    recvs[0].wait()\n    sent = []\n"),
            groups=("rings",), expect={C_AG: "timeout", C_AR: "timeout"}),
    Planted("sends to the previous rank instead of the next: deadlock", RING,
            ("dst=ring.send_to", "dst=ring.recv_from"), groups=("rings",),
            expect={C_RS: "timeout", C_AG: "timeout"}),
    Planted("calls dist.all_reduce", RING,
            ("    ring_reduce_scatter_chunks(chunks, mine, ring)  #",
             "    dist.all_reduce(flat, group=ring.group)\n    return tensor  #"),
            groups=("rings",), expect={C_RS: "flagged", C_AR: "flagged", C_BYTES: "flagged"}),
    Planted("reaches all_reduce through getattr", RING,
            ("    ring_reduce_scatter_chunks(chunks, mine, ring)  #",
             "    getattr(dist, 'all_' + 'reduce')(flat, group=ring.group)\n    return tensor  #"),
            groups=("rings",), expect={C_AR: "flagged", C_AR_EVEN: "flagged", C_RS: "passed", C_AG: "passed"}),
    Planted("raises on rank 1 only", RING,
            ("    if p == 1:\n        return out.copy_(chunks[0])\n",
             "    if r == 1:\n        raise RuntimeError('rank 1 lost its chunk')\n"),
            groups=("rings",), expect={C_RS: "error", C_AR: "error"}),
    # issue 27: n = 0, a size the public tests exercise, costs hidden marks too
    Planted("allreduce of an empty tensor runs the ring: records 2(p-1) empty messages", RING,
            ("    if ring.world_size == 1 or tensor.numel() == 0:\n        return tensor\n",
             "    if ring.world_size == 1:\n        return tensor\n"), groups=("rings",),
            expect={C_BYTES: "failed", C_BYTES_EVEN: "passed", C_AR: "passed", C_RS: "passed", C_AR2: "passed"}),
    # issue 13: run-time guards stepped around
    Planted("saves dist.all_reduce at import, before any guard", RING, (_AR_DEF, _SAVED), groups=("rings",),
            expect={C_AR: "flagged", C_AR2: "flagged", C_BYTES: "flagged", C_RS: "passed", C_AG: "passed"}),
    Planted("catches the guard's exception and falls back to its ring", RING, (_AR_DEF, _SAVED_CAUGHT),
            groups=("rings",), expect={C_AR: "flagged", C_BYTES: "flagged", C_RS: "passed", C_AG: "passed"}),
    Planted("calls allreduce as a ProcessGroup method", RING, (_AR_DEF, _PG_METHOD), groups=("rings",),
            expect={C_AR: "flagged", C_AR2: "flagged", C_BYTES: "flagged", C_RS: "passed"}),
    # issue 13: the technique, not only the numbers (the sums are right; before, this earned 2.3's 4 points)
    Planted("allreduce by sending everything to everyone, not a ring", RING, (_AR_DEF, _ALL_TO_ALL),
            groups=("rings",), expect={C_AR: "failed", C_AR_EVEN: "failed", C_BYTES: "failed", C_BYTES_EVEN: "failed",
                                       C_RS: "passed", C_AG: "passed"}),
    # issue 13: speed checks that trusted the student's process; a slow but correct ring
    Planted("a slow ring that patches time.perf_counter", RING, ("def ring_reduce_scatter_chunks(", _PATCHED_CLOCK),
            groups=("rings", "speed_cpu"), expect={**_RING_PASS, C_RS_SPEED: "failed", C_AR_SPEED: "failed"}),
    Planted("a slow ring that wraps dist.all_reduce to run slower", RING,
            ("def ring_reduce_scatter_chunks(", _SLOW_BASELINE), groups=("speed_cpu",),
            expect={C_RS_SPEED: "failed", C_AR_SPEED: "failed"}),
    # issue 13: verdicts written from the student's process
    Planted("forges report lines, patches classify, registers an atexit hook", RING,
            ('    """The ring of `group` (None: all ranks), neighbours mapped to global ranks."""\n', _FORGED),
            groups=("rings", "speed_cpu"), expect={**{name: "failed" for name in RING_CHECKS},
                                                   C_RS_SPEED: "failed", C_AR_SPEED: "failed"}),
)
