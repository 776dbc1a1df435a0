"""a3's planted submissions: wrong answers, hangs, semantic cheats on DataParallel (the numbers
right, the technique missing) and attacks on the grader itself."""

from __future__ import annotations

from autograder.attacks import IMPORTER, report_forger
from autograder.manifest import REPO, Planted

from .names import (BF, BF_SRC, BUCKET_CHECKS, C_CAP, C_DTYPE, C_FULL, C_HOOKED, C_NOSYNC, C_ONCE, C_ORDER,
                    C_OVERLAP, C_SYNC, C_UNUSED, C_UNUSED_HOOKED, DDP_CHECKS, DF)

ALL_DDP_FAILED = {c: "failed" for c in DDP_CHECKS}

_LAUNCH = ("            self.buckets[self._next_bucket].launch(self._allreduce)\n"
           "            self._next_bucket += 1\n")
_DUMMY = ("            bucket = self.buckets[self._next_bucket]\n"
          "            real, bucket.buffer = bucket.buffer, torch.zeros_like(bucket.buffer)  # evidence of the right size\n"
          "            bucket.launch(self._allreduce)\n"
          "            bucket.buffer = real\n")
_ASSIGN_BODY = "    buckets: list[list[int]] = []\n"


def _ddp_cheats() -> tuple[Planted, ...]:
    """Issue 13's semantic cheats on DataParallel: the numbers right, the technique missing. Each
    one passed every check of the grader that trusted the launch count and the timings."""
    cheats = {
        # dummy launches from the hooks (on time, the right count), the real sum synchronous after backward
        "dummy allreduces in the hooks, the real sum synchronous after backward": (_DUMMY + (
            "            bucket.wait = lambda timeout_s, b=bucket: (type(b).wait(b, timeout_s), "
            "torch.distributed.all_reduce(b.buffer))\n"
            "            self._next_bucket += 1\n"), ALL_DDP_FAILED),
        "averages through the c10d store, dummy allreduces as evidence": (_DUMMY + (
            "            type(self)._sent = n = getattr(type(self), '_sent', 0) + 1  # the same count on every rank\n"
            "            def through_store(buf, n=n, rank=self.dp_rank, world=self.dp_world_size):\n"
            "                store = torch.distributed.distributed_c10d._get_default_store()\n"
            "                store.set(f'cheat/{n}/{rank}', buf.numpy().tobytes())\n"
            "                parts = [torch.frombuffer(bytearray(store.get(f'cheat/{n}/{r}')), dtype=buf.dtype)\n"
            "                         for r in range(world)]\n"
            "                buf.copy_(sum(parts))\n"
            "            bucket.wait = lambda timeout_s, b=bucket, f=through_store: (type(b).wait(b, timeout_s), "
            "f(b.buffer))\n"
            "            self._next_bucket += 1\n"), {c: "flagged" for c in DDP_CHECKS}),
        "a store of its own as side channel, the trap caught and ignored": (_DUMMY + (
            "            type(self)._sent = n = getattr(type(self), '_sent', 0) + 1  # the same count on every rank\n"
            "            def through_store(buf, n=n, rank=self.dp_rank, world=self.dp_world_size):\n"
            "                import os\n"
            "                try:\n"
            "                    if not hasattr(type(self), '_side'):  # one store per process, on a file both ranks see\n"
            "                        type(self)._side = torch.distributed.FileStore(os.path.join(os.getcwd(), f'side-{os.getppid()}'), world)\n"
            "                    store = type(self)._side\n"
            "                    store.set(f'cheat/{n}/{rank}', buf.numpy().tobytes())\n"
            "                    buf.copy_(sum(torch.frombuffer(bytearray(store.get(f'cheat/{n}/{r}')), "
            "dtype=buf.dtype) for r in range(world)))\n"
            "                except Exception:\n"
            "                    pass\n"
            "            bucket.wait = lambda timeout_s, b=bucket, f=through_store: (type(b).wait(b, timeout_s), "
            "f(b.buffer))\n"
            "            self._next_bucket += 1\n"), {c: "flagged" for c in DDP_CHECKS}),
    }
    return tuple(Planted(name, DF, (_LAUNCH, new), groups=("ddp",), expect=expect)
                 for name, (new, expect) in cheats.items())


def _attacks() -> tuple[Planted, ...]:
    """Attacks on the grader itself (issue 13's catalogue), each in place of task 3.1's answer.
    The static check forbids importlib and __import__, so each reaches for what it wants the way
    the static check cannot see; the trusted split must leave it nothing to earn."""
    attacks = {
        "forges 'passed' lines in every report it can find (and at exit)": (
            report_forger(list(BUCKET_CHECKS)) +
            "    forge(); atexit.register(forge)\n"
            "    return []\n", "failed"),
        "patches the grader's classify through sys.modules": (
            f"    ctx = {IMPORTER}('autograder.context')\n"
            "    ctx.classify = lambda exc, submission: ('passed', '')\n"
            "    return []\n", "failed"),
        "reads the expected buckets out of the caller's frames": (
            "    try:\n        raise ZeroDivisionError\n    except ZeroDivisionError as e:\n"
            "        frame = e.__traceback__.tb_frame\n"
            "    while frame is not None:\n"
            "        for key in ('want', 'expected', 'ref'):\n"
            "            if isinstance(frame.f_locals.get(key), list):\n"
            "                return frame.f_locals[key]\n"
            "        frame = frame.f_back\n"
            "    return []\n", "failed"),
        "imports the reference by a name built at run time": (
            f"    ref = {IMPORTER}('scaletrain.' + 'dp.bucket', fromlist=['x'])\n"
            "    return ref.assign_buckets(params, cap_bytes)\n", "error"),
        "reads the reference from the grader's disk": (
            f"    code = open({str(REPO / BF_SRC)!r}).read()\n"
            "    scope = {'__name__': 'stolen'}\n"
            f"    {IMPORTER}('builtins').exec(code, scope)\n"
            "    return scope['assign_buckets'](params, cap_bytes)\n", "error"),
    }
    return tuple(Planted(name, BF, (_ASSIGN_BODY, body + _ASSIGN_BODY), groups=("buckets",),
                         expect={c: outcome for c in BUCKET_CHECKS})
                 for name, (body, outcome) in attacks.items())


_IF_CLOSE = "        if current and (current_bytes + nbytes > cap_bytes or dtype_changes):\n"
_ADD = "        current.append(i)\n        current_bytes += nbytes\n"
_CLOSE = "            buckets.append(current)\n            current, current_bytes = [], 0\n"
_BUCKETS_PASS = {c: "passed" for c in BUCKET_CHECKS}


def _bucket_plants() -> tuple[Planted, ...]:
    """Task 3.1 is graded by properties, one check each (scaletrain.dp.bucket_rules): another
    correct design earns every point, and each small mistake costs the one property it breaks."""
    plants = {
        "another design: cut greedily from the first parameter, the buckets reversed": ((
            ("for i in reversed(range(len(params))):", "for i in range(len(params)):"),
            ("        buckets.append(current)\n    return buckets\n",
             "        buckets.append(current)\n    return [b[::-1] for b in buckets[::-1]]\n")), None),
        "buckets in registration order (the first layer's go first)": (
            ("for i in reversed(range(len(params))):", "for i in range(len(params)):"), C_ORDER),
        # issue 27: the public docstring test caught this and the hidden suite gave it 18/18
        "a bucket closed when a parameter exactly fills the cap (>= for >)": (
            ("current_bytes + nbytes > cap_bytes", "current_bytes + nbytes >= cap_bytes"), C_FULL),
        "one bucket per parameter": ((_IF_CLOSE, "        if current:\n"), C_FULL),
        "a dtype change ignored": ((_IF_CLOSE, "        if current and current_bytes + nbytes > cap_bytes:\n"),
                                   C_DTYPE),
        "torch DDP's rule: a bucket closes once it reaches the cap (one parameter over)": (
            (_IF_CLOSE + _CLOSE + _ADD, "        if current and dtype_changes:\n" + _CLOSE + _ADD
             + "        if current_bytes >= cap_bytes:\n" + _CLOSE), C_CAP),
    }
    return tuple(Planted(name, BF, replace, groups=("buckets",),
                         expect={**_BUCKETS_PASS, **({broken: "failed"} if broken else {})})
                 for name, (replace, broken) in plants.items())


PLANTED = (
    *_bucket_plants(),
    Planted("gradients summed, not averaged", DF,
            ("            bucket.buffer.div_(self.dp_world_size)\n", ""), groups=("ddp",),
            expect={C_SYNC: "failed", C_HOOKED: "failed", C_OVERLAP: "failed", C_ONCE: "failed"}),
    Planted("no hook registered: everything syncs in finish", DF,
            ("self._hooks.append(param.register_post_accumulate_grad_hook(self._on_grad_ready))",
             "continue"), groups=("ddp",),
            expect={C_OVERLAP: "failed", C_HOOKED: "passed", C_SYNC: "passed", C_NOSYNC: "passed"}),
    Planted("hooks mark gradients ready but launch nothing: synchronizes after backward", DF,
            ("        self._mark_ready(bucket, k)\n        self._launch_ready_buckets()\n\n    def close",
             "        self._mark_ready(bucket, k)\n\n    def close"), groups=("ddp",),
            expect={C_OVERLAP: "failed", C_HOOKED: "passed", C_SYNC: "passed", C_ONCE: "passed",
                    C_NOSYNC: "passed", C_UNUSED_HOOKED: "passed"}),
    Planted("finish waits on buckets it never launched", DF,
            ("        self._launch_ready_buckets()\n        for bucket in self.buckets:\n",
             "        for bucket in self.buckets:\n"), groups=("ddp",),
            expect={C_SYNC: "timeout", C_UNUSED: "timeout", C_UNUSED_HOOKED: "timeout",
                    C_OVERLAP: "passed", C_HOOKED: "passed"}),
    Planted("wraps torch's DistributedDataParallel", DF,
            ("import torch.nn as nn\n",
             "import torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel\n"),
            groups=("ddp",), expect={C_SYNC: "flagged", C_OVERLAP: "flagged"}),
    *_ddp_cheats(),
    *_attacks(),
)
