"""Assignment a3: data parallelism with buckets, overlap and no_sync (`assignments/a3_data_parallel/`).

References are independent of the student's code: the properties that define the reverse greedy
bucket assignment (3.1); one process computing the gradient of the whole batch (3.2, 3.3); for
overlap, the times at which the grader's *own* gradient hooks and its *own* allreduce wrapper ran.
The distributed checks run in one spawn of P ranks on a hidden GPT shape; each check is caught
inside the ranks, so one failing check does not hide the others. A bucket that is never launched
ends as `timeout` after WAIT_S (DataParallel's bucket wait), a deadlock when the process group's
timeout expires. torch's DistributedDataParallel is forbidden in the student file, statically and
at run time.
"""

from __future__ import annotations

import random
import time
import traceback
from pathlib import Path

from autograder import checks
from autograder.manifest import Check, Group, Manifest, Planted, Task

BF, DF = "dp_bucket.py", "dp_data_parallel.py"
P = 2          # ranks of the distributed group
WAIT_S = 1.0   # DataParallel(timeout_s=...): how long finish waits for a bucket nobody launched
RTOL = 2e-5    # fp32 gradients, a different summation order than one process

C_ORDER = "reverse registration order, every parameter exactly once"
C_CAP = "buckets within the cap, filled greedily, an oversized parameter alone"
C_DTYPE = "a dtype change closes the bucket"
C_SYNC = "bucketed sync after backward equals one process (1, 2 and 3 buckets)"
C_ONCE = "exactly one allreduce per bucket per step"
C_UNUSED = "unused and frozen parameters: no hang, mean with zeros"
C_OVERLAP = "hooks launch buckets before backward ends (overlap)"
C_HOOKED = "overlapped steps equal one process, tied wte/lm_head included"
C_NOSYNC = "no_sync: no communication, 4 micro-steps equal one large batch"
C_UNUSED_HOOKED = "unused parameter with hooks on: no hang, correct gradients"

MANIFEST = Manifest(
    assignment="a3", folder="a3_data_parallel", title="Data parallelism: buckets, overlap, accumulation",
    files={BF: "lib/scaletrain/dp/bucket.py", DF: "lib/scaletrain/dp/data_parallel.py"},
    tasks=(
        Task("3.1", "Bucket assignment in reverse registration order", file=BF, functions=("assign_buckets",)),
        Task("3.2", "Bucketed gradient synchronization after backward", file=DF,
             functions=("_mark_ready", "_launch_ready_buckets", "finish_gradient_synchronization")),
        Task("3.3", "Overlap: gradient hooks that launch buckets; no_sync", file=DF,
             functions=("_register_hooks", "_on_grad_ready")),
    ),
    forbidden={
        BF: ("scaletrain.dp", "torch.distributed._compute_bucket_assignment_by_size", "importlib", "__import__"),
        DF: ("torch.nn.parallel", "torch.distributed.algorithms", "torch.distributed.fsdp",
             "scaletrain.dp.data_parallel", "scaletrain.dp.DataParallel", "importlib", "__import__"),
    },
    groups=(
        Group("buckets", "autograder.suites.a3_data_parallel:group_buckets", timeout_s=60, checks=(
            Check("3.1", C_ORDER, 2), Check("3.1", C_CAP, 2), Check("3.1", C_DTYPE, 1),
        )),
        Group("ddp", "autograder.suites.a3_data_parallel:group_ddp", timeout_s=150, checks=(
            Check("3.2", C_SYNC, 3), Check("3.2", C_ONCE, 1), Check("3.2", C_UNUSED, 2),
            Check("3.3", C_OVERLAP, 2), Check("3.3", C_HOOKED, 2), Check("3.3", C_NOSYNC, 2),
            Check("3.3", C_UNUSED_HOOKED, 1),
        )),
    ),
    planted=(
        Planted("buckets filled in registration order", BF,
                ("for i in reversed(range(len(params))):", "for i in range(len(params)):"),
                groups=("buckets",), expect={C_ORDER: "failed", C_DTYPE: "passed"}),
        Planted("gradients summed, not averaged", DF,
                ("            bucket.buffer.div_(self.dp_world_size)\n", ""), groups=("ddp",),
                expect={C_SYNC: "failed", C_HOOKED: "failed", C_OVERLAP: "passed", C_ONCE: "passed"}),
        Planted("no hook registered: everything syncs in finish", DF,
                ("self._hooks.append(param.register_post_accumulate_grad_hook(self._on_grad_ready))",
                 "continue"), groups=("ddp",),
                expect={C_OVERLAP: "failed", C_HOOKED: "passed", C_SYNC: "passed", C_NOSYNC: "passed"}),
        Planted("finish waits on buckets it never launched", DF,
                ("        self._launch_ready_buckets()\n        for bucket in self.buckets:\n",
                 "        for bucket in self.buckets:\n"), groups=("ddp",),
                expect={C_SYNC: "timeout", C_UNUSED: "timeout", C_UNUSED_HOOKED: "timeout",
                        C_OVERLAP: "passed", C_HOOKED: "passed"}),
        Planted("wraps torch's DistributedDataParallel", DF,
                ("import torch.nn as nn\n",
                 "import torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel\n"),
                groups=("ddp",), expect={C_SYNC: "flagged", C_OVERLAP: "flagged"}),
    ),
)


# ---------------------------------------------------------------- 3.1: pure, one process

def _nbytes(p) -> int:
    return p.numel() * p.element_size()


def _cfg():
    """The hidden GPT shape: odd vocabulary, 3 heads, sequences of 17 (see _batch)."""
    from scaletrain.models import GPTConfig
    return GPTConfig(vocab_size=97, block_size=24, n_layer=3, n_head=3, n_embd=48)


def _hidden_param_lists(rng: random.Random):
    import torch

    from scaletrain.models import GPT
    lists = [list(GPT(_cfg()).parameters())]
    for _ in range(6):
        lists.append([torch.zeros(rng.randint(1, 5000)) for _ in range(rng.randint(1, 30))])
    return lists


def _call_assign(fn, params, cap):
    got = fn(params, cap)
    assert isinstance(got, list) and all(isinstance(b, list) for b in got), \
        f"assign_buckets must return a list of lists of indices, got {type(got).__name__}"
    return got


def group_buckets(ctx):
    import torch
    rng = random.Random(checks.trial_seeds(1, salt=31)[0])
    lists = _hidden_param_lists(rng)
    caps = [1, 4 * 1021, 4 * 4099, 4 * 20011, 10**9]
    mod = ctx.student("dp_bucket")
    with ctx.check(C_ORDER):
        for params in lists:
            for cap in caps:
                flat = [i for b in _call_assign(mod.assign_buckets, params, cap) for i in b]
                assert flat == list(reversed(range(len(params)))), (
                    f"{len(params)} parameters, cap {cap} B: concatenated buckets are {flat[:8]}..., expected "
                    f"{list(reversed(range(len(params))))[:8]}... (last registered first, each once)")
    with ctx.check(C_CAP):
        for params in lists:
            for cap in caps:
                got = _call_assign(mod.assign_buckets, params, cap)
                for b in got:
                    size = sum(_nbytes(params[i]) for i in b)
                    assert b, f"cap {cap} B: an empty bucket"
                    assert len(b) == 1 or size <= cap, f"cap {cap} B: bucket {b[:6]} holds {size} B"
                for a, b in zip(got, got[1:]):
                    size = sum(_nbytes(params[i]) for i in a) + _nbytes(params[b[0]])
                    assert size > cap, (f"cap {cap} B: parameter {b[0]} would still fit in bucket {a[:6]} "
                                        f"({size} B): fill each bucket greedily before opening the next")
        small = [torch.zeros(10), torch.zeros(1000), torch.zeros(10)]
        got = _call_assign(mod.assign_buckets, small, 100)
        assert got == [[2], [1], [0]], f"cap 100 B, sizes 40/4000/40 B: got {got}, expected [[2], [1], [0]]"
    with ctx.check(C_DTYPE):
        mixed = [torch.zeros(3), torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64),
                 torch.zeros(3)]
        got = _call_assign(mod.assign_buckets, mixed, 10**6)
        groups = sorted(sorted(b) for b in got)  # order is the other check's business
        assert groups == [[0], [1, 2], [3]], (f"dtypes f32, f64, f64, f32 with a large cap: got {got}, expected "
                                              "[[3], [2, 1], [0]] (one flat buffer holds one dtype)")


# ---------------------------------------------------------------- 3.2 and 3.3: P ranks

def _cap_mb_for(n_buckets: int) -> float:
    from scaletrain.dp.bucket import assign_buckets
    from scaletrain.models import GPT
    params = list(GPT(_cfg()).parameters())
    total = sum(_nbytes(p) for p in params)
    for k in range(400):
        if len(assign_buckets(params, int(total * (1 - k / 400)))) == n_buckets:
            return int(total * (1 - k / 400)) / 2**20
    raise RuntimeError(f"suite bug: no cap gives {n_buckets} buckets")


class _Recorder:
    """The allreduce given to the student's DataParallel: gloo's async allreduce, with the time of
    every launch; plus the grader's own gradient hooks, registered before the student's."""

    def __init__(self):
        self.launches: list[float] = []
        self.grads: list[float] = []

    def __call__(self, tensor):
        import torch.distributed as dist
        self.launches.append(time.perf_counter())
        return dist.all_reduce(tensor, async_op=True)

    def watch(self, module):
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda _: self.grads.append(time.perf_counter()))
        return module


def _batch(step: int, rows: int, seed: int):
    from scaletrain.models import make_batch
    return make_batch(_cfg(), rows, seed=seed + step, seq_len=17)


def _reference_grads(step: int, micro: int, seed: int):
    from scaletrain.models import GPT
    model = GPT(_cfg(), seed=1)
    model(*_batch(step, P * micro * 3, seed))[1].backward()
    return [p.grad.clone() for p in model.parameters()]


def _dp_grads(dpm, rank: int, step: int, seed: int, micro: int = 1, **kw):
    """(grads after finish, allreduces launched so far after each micro-step and after finish,
    number of buckets) of one step of the student's DataParallel on this rank's rows."""
    from scaletrain.models import GPT
    rec = _Recorder()
    dp = dpm.DataParallel(GPT(_cfg(), seed=1 + rank), allreduce=rec, timeout_s=WAIT_S, **kw)
    x, y = (t[rank * micro * 3:(rank + 1) * micro * 3] for t in _batch(step, P * micro * 3, seed))
    launches = []
    for j in range(micro):
        sync = j == micro - 1
        with (dp.no_sync() if not sync else _Nothing()):
            (dp(x[j * 3:(j + 1) * 3], y[j * 3:(j + 1) * 3])[1] / micro).backward()
        launches.append(len(rec.launches))
    dp.finish_gradient_synchronization()
    launches.append(len(rec.launches))
    grads = [p.grad for p in dp.module.parameters()]
    return grads, launches, len(dp.buckets)


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _compare(grads, ref, what: str) -> None:
    from scaletrain.models import GPT
    names = [n for n, _ in GPT(_cfg()).named_parameters()]
    for name, g, r in zip(names, grads, ref):
        assert g is not None, f"{what}: {name}.grad is None after finish_gradient_synchronization()"
        scale = float(r.abs().max())
        if scale > 0 and float((g - P * r).abs().max()) <= 1e-4 * P * scale:
            raise AssertionError(f"{what}: {name}.grad is {P}x the mean gradient: the allreduce sums, "
                                 "divide each bucket by dp_world_size")
        checks.assert_close(g, r, rtol=RTOL, what=f"{what}: {name}.grad")


def _check_sync(dpm, rank, seed):
    for n_buckets in (1, 2, 3):
        for step in range(2):
            ref = _reference_grads(step, 1, seed)
            grads, _, got = _dp_grads(dpm, rank, step, seed, bucket_cap_mb=_cap_mb_for(n_buckets), overlap=False)
            assert got == n_buckets, f"suite expected {n_buckets} buckets, DataParallel made {got}"
            _compare(grads, ref, f"{n_buckets} bucket(s), step {step}, overlap=False")


def _check_once(dpm, rank, seed):
    for overlap in (False, True):
        _, launches, n = _dp_grads(dpm, rank, 0, seed, bucket_cap_mb=_cap_mb_for(3), overlap=overlap)
        assert launches[-1] == n, (f"overlap={overlap}: {launches[-1]} allreduces in one step for {n} buckets; "
                                   "launch each bucket exactly once")


def _branchy():
    import torch
    import torch.nn as nn

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            gen = torch.Generator().manual_seed(3)
            self.frozen, self.trunk = nn.Linear(5, 7), nn.Linear(7, 7)
            self.head_a, self.head_b, self.never = nn.Linear(7, 3), nn.Linear(7, 3), nn.Linear(3, 3)
            with torch.no_grad():
                for p in self.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen))
            self.frozen.requires_grad_(False)

        def forward(self, x, use_b):
            h = torch.tanh(self.trunk(self.frozen(x)))
            return (self.head_a(h) + (self.head_b(h) if use_b else 0.0)).pow(2).mean()
    return Branchy


def _check_unused(dpm, rank, seed, overlap):
    import torch
    branchy = _branchy()
    xs = torch.randn(P * 3, 5, generator=torch.Generator().manual_seed(seed))
    ref = branchy()
    (sum(ref(xs[r * 3:(r + 1) * 3], use_b=(r == 1)) for r in range(P)) / P).backward()
    dp = dpm.DataParallel(branchy(), bucket_cap_mb=1e-4, allreduce=_Recorder(), overlap=overlap, timeout_s=WAIT_S)
    dp(xs[rank * 3:(rank + 1) * 3], use_b=(rank == 1)).backward()
    dp.finish_gradient_synchronization()
    m = dp.module
    assert m.frozen.weight.grad is None, "a frozen parameter got a .grad: it must not be synchronized"
    for name in ("trunk", "head_a", "head_b"):
        checks.assert_close(getattr(m, name).weight.grad, getattr(ref, name).weight.grad, rtol=RTOL,
                            what=f"{name}.weight.grad (head_b is used on rank 1 only)")
    never = m.never.weight.grad
    assert never is not None and not never.any(), \
        "a parameter no rank used must end with a zero .grad (create it from the zero-filled slot)"


def _check_overlap(dpm, rank, seed):
    from scaletrain.models import GPT
    rec = _Recorder()
    dp = dpm.DataParallel(rec.watch(GPT(_cfg(), seed=1 + rank)), bucket_cap_mb=_cap_mb_for(3),
                          allreduce=rec, timeout_s=WAIT_S)
    x, y = (t[rank * 3:(rank + 1) * 3] for t in _batch(0, P * 3, seed))
    dp(x, y)[1].backward()
    early = sum(1 for t in rec.launches if t < rec.grads[-1])
    dp.finish_gradient_synchronization()
    assert early >= len(dp.buckets) - 1, (
        f"{early} of {len(dp.buckets)} allreduces started before the last gradient of backward arrived; "
        f"expected {len(dp.buckets) - 1}: launch each bucket from the gradient hook as soon as it is full")


def _check_hooked(dpm, rank, seed):
    for step in range(2):
        ref = _reference_grads(step, 1, seed)
        grads, _, _ = _dp_grads(dpm, rank, step, seed, bucket_cap_mb=_cap_mb_for(2))
        _compare(grads, ref, f"overlap=True, step {step}")


def _check_no_sync(dpm, rank, seed):
    ref = _reference_grads(0, 4, seed)
    grads, launches, n = _dp_grads(dpm, rank, 0, seed, micro=4, bucket_cap_mb=_cap_mb_for(3))
    assert launches[2] == 0, f"{launches[2]} allreduces during the 3 micro-steps inside no_sync(): expected none"
    assert launches[-1] == n, f"{launches[-1]} allreduces in the synchronized step for {n} buckets"
    _compare(grads, ref, "4 micro-steps (3 inside no_sync)")


_DDP_CHECKS = {
    C_SYNC: _check_sync, C_ONCE: _check_once,
    C_UNUSED: lambda dpm, r, s: _check_unused(dpm, r, s, overlap=False),
    C_OVERLAP: _check_overlap, C_HOOKED: _check_hooked, C_NOSYNC: _check_no_sync,
    C_UNUSED_HOOKED: lambda dpm, r, s: _check_unused(dpm, r, s, overlap=True),
}


def _where(exc: BaseException) -> str:
    folder = checks.submission_dir()
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve().parent == folder]
    return f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


def _ddp_rank(rank: int, world_size: int, seed: int) -> dict:
    """Every distributed check on this rank: {check name: None (passed) or (exception type, message)}."""
    dpm = checks.student_module("dp_data_parallel")
    out = {}
    for name, fn in _DDP_CHECKS.items():
        try:
            with checks.forbid_calls("torch.nn.parallel.DistributedDataParallel", modules=(dpm,)):
                fn(dpm, rank, seed)
            out[name] = None
        except Exception as exc:  # noqa: BLE001 - each check's failure is reported on its own
            first = str(exc).splitlines()[0] if str(exc) else ""
            out[name] = (type(exc).__name__, f"rank {rank}: {first}{_where(exc)}")
    return out


def _preflight(dpm) -> NotImplementedError | None:
    """One step with overlap=False on a 1-rank group in this process: an untouched task 3.2 (which
    every distributed check needs) is reported at once, without starting ranks."""
    import tempfile

    import torch.distributed as dist

    from scaletrain.models import GPT
    with tempfile.TemporaryDirectory(prefix="a3-preflight-") as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            model = dpm.DataParallel(GPT(_cfg()), allreduce=_Recorder(), overlap=False, timeout_s=WAIT_S)
            model(*_batch(0, 2, 0))[1].backward()
            model.finish_gradient_synchronization()
        except NotImplementedError as exc:
            return exc
        except Exception:  # noqa: BLE001 - anything else is reported by the real checks, with ranks
            return None
        finally:
            dist.destroy_process_group()
    return None


def group_ddp(ctx):
    from scaletrain.launch import spawn
    dpm = ctx.student("dp_data_parallel")  # a broken import fails here, for every check, with its line
    failure = _preflight(dpm)
    per_rank = None
    if failure is None:
        try:
            per_rank = spawn(_ddp_rank, P, checks.trial_seeds(1, salt=33)[0], timeout_s=60)
        except Exception as exc:  # noqa: BLE001 - reported inside every check below
            failure = exc
    ctx.report_ranks(_DDP_CHECKS, per_rank, failure)
