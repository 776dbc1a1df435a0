"""Assignment a3: data parallelism with buckets, overlap and no_sync (`assignments/a3_data_parallel/`).

Every group is *trusted* (`Group.trusted`): this module runs in a process that never imports the
submission. The student's code runs in the sandboxed worker through the probes of
`autograder/probes/a3_data_parallel.py`, which return raw outputs; references, comparisons and
verdicts stay here.

3.1: the student's `assign_buckets` runs on hidden parameter shapes and caps sent as data; its
index lists come back and are judged here against the properties that define the reverse greedy
assignment and against the reference `scaletrain.dp.bucket.assign_buckets`.

3.2 and 3.3: one spawn of P ranks in the worker runs the student's DataParallel on a hidden GPT
shape, scenario after scenario, with the bucket assignment computed here by the reference (so
these tasks are graded whatever the state of 3.1). Per rank and scenario the probe returns the
final gradients, every allreduce launched through the callable it gave DataParallel (time and a
copy of what it carried), the times at which its own gradient hooks ran, collectives run outside
that callable, and any use of the c10d store (trapped: `Flagged`). Here, from one process
computing the whole batch and each rank's own rows:
- the final gradients must equal the mean over ranks of gradients that differ per rank;
- every bucket's *local* gradients must have gone out through a launched allreduce (a dummy
  collective, a side channel, or a sum done elsewhere fails: the checks say so);
- overlap counts only such genuine launches that started before the last gradient of backward;
- exactly one allreduce per bucket and nothing else on the wire but the library's used-parameter
  map (one allreduce after the buckets), none inside no_sync();
- the count of allreduces and the overlap are evidence, granted only with the gradients' values
  (`Check.needs`, `grade.with_values`);
- a parameter no rank used keeps .grad None (torch DDP's find_unused_parameters semantics).
A bucket that is never launched ends as `timeout` after WAIT_S (DataParallel's bucket wait), a
deadlock when the process group's timeout expires. torch's DistributedDataParallel is forbidden in
the student file, statically and at run time.
"""

from __future__ import annotations

import functools
import itertools
import random
import time
from dataclasses import dataclass, field

from autograder import checks
from autograder.attacks import IMPORTER, report_forger
from autograder.checks import Flagged
from autograder.manifest import REPO, Check, Group, Manifest, Planted, Task
from scaletrain.testing import mean_gradients, rel_error

BF, DF = "dp_bucket.py", "dp_data_parallel.py"
P = 2          # ranks of the distributed group
WAIT_S = 1.0   # DataParallel(timeout_s=...): how long finish waits for a bucket nobody launched
RTOL = 2e-5    # fp32 gradients, a different summation order than one process
# What the library's own code in finish_gradient_synchronization sends besides the buckets: the
# used-parameter map, one allreduce on the group (Replicated._unused_to_none, as torch DDP does)
USED_MAP = {"allreduce": 1}
PROBE = "autograder.probes.a3_data_parallel"

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
DDP_CHECKS = (C_SYNC, C_ONCE, C_UNUSED, C_OVERLAP, C_HOOKED, C_NOSYNC, C_UNUSED_HOOKED)
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
            report_forger([C_ORDER, C_CAP, C_DTYPE]) +
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
            f"    code = open({str(REPO / 'lib/scaletrain/dp/bucket.py')!r}).read()\n"
            "    scope = {'__name__': 'stolen'}\n"
            f"    {IMPORTER}('builtins').exec(code, scope)\n"
            "    return scope['assign_buckets'](params, cap_bytes)\n", "error"),
    }
    return tuple(Planted(name, BF, (_ASSIGN_BODY, body + _ASSIGN_BODY), groups=("buckets",),
                         expect={C_ORDER: outcome, C_CAP: outcome, C_DTYPE: outcome})
                 for name, (body, outcome) in attacks.items())


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
        Group("buckets", "autograder.suites.a3_data_parallel:group_buckets", timeout_s=60, trusted=True, checks=(
            Check("3.1", C_ORDER, 2), Check("3.1", C_CAP, 2), Check("3.1", C_DTYPE, 1),
        )),
        Group("ddp", "autograder.suites.a3_data_parallel:group_ddp", timeout_s=150, trusted=True, checks=(
            Check("3.2", C_SYNC, 3), Check("3.2", C_ONCE, 1, needs=(C_SYNC,)), Check("3.2", C_UNUSED, 2),
            Check("3.3", C_OVERLAP, 2, needs=(C_HOOKED,)), Check("3.3", C_HOOKED, 2), Check("3.3", C_NOSYNC, 2),
            Check("3.3", C_UNUSED_HOOKED, 1),
        )),
    ),
    planted=(
        Planted("buckets filled in registration order", BF,
                ("for i in reversed(range(len(params))):", "for i in range(len(params)):"),
                groups=("buckets",), expect={C_ORDER: "failed", C_DTYPE: "passed"}),
        # issue 27: the public docstring test caught this and the hidden suite gave it 18/18
        Planted("a bucket closed when a parameter exactly fills the cap (>= for >)", BF,
                ("current_bytes + nbytes > cap_bytes", "current_bytes + nbytes >= cap_bytes"), groups=("buckets",),
                expect={C_CAP: "failed", C_ORDER: "passed", C_DTYPE: "passed"}),
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
    ),
)


# ---------------------------------------------------------------- 3.1: pure, one process

def _reference_assign():
    from scaletrain.dp.bucket import assign_buckets
    return assign_buckets


def _nbytes(spec) -> int:
    import math
    shape, dtype = spec
    return math.prod(shape) * dtype.itemsize


def _cfg():
    """The hidden GPT shape: odd vocabulary, 3 heads, sequences of 17 (see _batch)."""
    from scaletrain.models import GPTConfig
    return GPTConfig(vocab_size=97, block_size=24, n_layer=3, n_head=3, n_embd=48)


def _gpt_specs(cfg=None):
    from scaletrain.models import GPT
    return [(tuple(p.shape), p.dtype) for p in GPT(cfg or _cfg()).parameters()]


CAPS = (1, 4 * 1021, 4 * 4099, 4 * 20011, 10**9)


def _public_cases() -> list[tuple[list, tuple[int, ...]]]:
    """(specs, caps) of the public tests of 3.1 (assignments/a3_data_parallel/tests/): the
    docstring's example, whose middle bucket exactly fills its cap, and the default GPT at the
    public caps. Issue 27: a hidden suite runs every public case."""
    import torch

    from scaletrain.models import GPTConfig
    docstring = [((n,), torch.float32) for n in (10, 20, 30, 40)]
    return [(docstring, (200,)), (_gpt_specs(GPTConfig()), (1, 4 * 5000, 4 * 40000, 10**9))]


def _exact_caps(specs) -> tuple[int, ...]:
    """Caps that the last two and the last three parameters exactly fill: a bucket must take a
    parameter that brings it exactly to the cap (`>` closes it, not `>=`; issue 27)."""
    sizes = [_nbytes(s) for s in reversed(specs)]
    return tuple(sum(sizes[:k]) for k in (2, 3) if len(sizes) >= k)


def _hidden_cases(rng: random.Random) -> list[tuple[list, tuple[int, ...]]]:
    """(specs, caps): the hidden GPT's parameters, then random 1-D sizes, each at the fixed caps
    and at caps some of its buckets exactly fill; then the public tests' cases."""
    import torch
    lists = [_gpt_specs()]
    for _ in range(6):
        lists.append([((rng.randint(1, 5000),), torch.float32) for _ in range(rng.randint(1, 30))])
    return [(specs, CAPS + _exact_caps(specs)) for specs in lists] + _public_cases()


def _as_tensors(specs):
    import torch
    return [torch.zeros(shape, dtype=dtype) for shape, dtype in specs]


def _call_assign(remote, specs, cap):
    got = remote.assign_buckets(specs, cap)
    assert isinstance(got, list) and all(isinstance(b, list) for b in got), \
        f"assign_buckets must return a list of lists of indices, got {str(got)[:80]}"
    assert all(isinstance(i, int) for b in got for i in b), \
        f"assign_buckets must return lists of int indices, got {str(got)[:80]}"
    return got


def _check_order(remote, specs, cap) -> None:
    want = list(reversed(range(len(specs))))
    flat = [i for b in _call_assign(remote, specs, cap) for i in b]
    assert flat == want, (f"{len(specs)} parameters, cap {cap} B: concatenated buckets are {flat[:8]}..., "
                          f"expected {want[:8]}... (last registered first, each once)")


def _check_cap(remote, specs, cap) -> None:
    """Within the cap, greedy (the next bucket's first parameter did not fit), and, when the
    order is right (the other check's business), the reference's buckets."""
    want = _reference_assign()(_as_tensors(specs), cap)  # the reference first
    got = _call_assign(remote, specs, cap)
    size = lambda b: sum(_nbytes(specs[i]) for i in b)  # noqa: E731
    assert sorted(i for b in got for i in b) == list(range(len(specs))), (  # else the loops below check nothing
        f"cap {cap} B: the buckets hold {sum(map(len, got))} indices, expected each of 0..{len(specs) - 1} once")
    for b in got:
        assert b, f"cap {cap} B: an empty bucket"
        assert len(b) == 1 or size(b) <= cap, f"cap {cap} B: bucket {b[:6]} holds {size(b)} B"
    for a, b in itertools.pairwise(got):
        assert size(a) + _nbytes(specs[b[0]]) > cap, (
            f"cap {cap} B: parameter {b[0]} would still fit in bucket {a[:6]} ({size(a) + _nbytes(specs[b[0]])} B"
            f"{', exactly the cap' if size(a) + _nbytes(specs[b[0]]) == cap else ''}): fill each bucket greedily "
            "before opening the next")
    if [i for b in got for i in b] == list(reversed(range(len(specs)))):
        assert got == want, f"cap {cap} B: buckets {str(got)[:80]}, expected {str(want)[:80]}"


def _check_dtypes(remote, mixed) -> None:
    want = _reference_assign()(_as_tensors(mixed), 10**6)
    got = _call_assign(remote, mixed, 10**6)
    assert sorted(sorted(b) for b in got) == sorted(sorted(b) for b in want), (  # order: the other check's
        f"dtypes {[str(d).split('.')[-1] for _, d in mixed]} with a large cap: got {got}, expected {want} "
        "(one flat buffer holds one dtype)")


def group_buckets(ctx):
    import torch
    cases = _hidden_cases(random.Random(checks.trial_seeds(1, salt=31)[0]))
    remote = ctx.remote("dp_bucket", probe=f"{PROBE}:with_params")
    with ctx.check(C_ORDER):
        for specs, caps in cases:
            for cap in caps:
                _check_order(remote, specs, cap)
    with ctx.check(C_CAP):
        for specs, caps in cases:
            for cap in caps:
                _check_cap(remote, specs, cap)
        small = [((10,), torch.float32), ((1000,), torch.float32), ((10,), torch.float32)]
        got = _call_assign(remote, small, 100)
        assert got == [[2], [1], [0]], f"cap 100 B, sizes 40/4000/40 B: got {got}, expected [[2], [1], [0]]"
    with ctx.check(C_DTYPE):
        f32, f64 = torch.float32, torch.float64
        for mixed in ([((3,), f32), ((3,), f64), ((3,), f64), ((3,), f32)],
                      [((2,), f32), ((2,), f64), ((2,), f32)]):  # the second: the public test's
            _check_dtypes(remote, mixed)


# ---------------------------------------------------------------- 3.2 and 3.3: P ranks

PUBLIC_CAP_MB = 0.1  # the public tests' DataParallel(GPT(GPTConfig()), bucket_cap_mb=0.1): 7 buckets


@functools.lru_cache(maxsize=None)
def _shape(n_buckets: int | None):
    """(GPTConfig, bucket_cap_mb, the reference's buckets): the hidden GPT in n buckets, or (None)
    the public tests' GPT and cap, more buckets than any hidden shape (issue 27)."""
    from scaletrain.models import GPT, GPTConfig
    if n_buckets is None:
        params = list(GPT(GPTConfig()).parameters())
        return GPTConfig(), PUBLIC_CAP_MB, _reference_assign()(params, int(PUBLIC_CAP_MB * 2**20))
    params = list(GPT(_cfg()).parameters())
    total = sum(p.numel() * p.element_size() for p in params)
    for k in range(400):
        cap_mb = int(total * (1 - k / 400)) / 2**20
        buckets = _reference_assign()(params, max(1, int(cap_mb * 2**20)))  # as DataParallel.__init__ does
        if len(buckets) == n_buckets:
            return _cfg(), cap_mb, buckets
    raise RuntimeError(f"suite bug: no cap gives {n_buckets} buckets")


def _batch(cfg, step: int, rows: int, seed: int):
    from scaletrain.models import make_batch
    return make_batch(cfg, rows, seed=seed + step, seq_len=17)


def _gpt_grads(cfg, x, y):
    """Gradients of the mean loss over the rows of (x, y), one process, rank 0's weights."""
    from scaletrain.models import GPT
    model = GPT(cfg, seed=1)
    model(x, y)[1].backward()
    return [p.grad.clone() for p in model.parameters()]


@dataclass
class Scenario:
    """One step the ranks run (`send`, data for the probe) and what the grader expects of it."""
    what: str
    send: dict
    names: list[str]                    # every parameter of the module, in order
    ref: list                           # the expected final .grad per parameter (None: stays None)
    local: list[list]                   # per rank: the local gradient per *synchronized* parameter
    buckets: list[list[int]]            # indices into the synchronized parameters
    frozen: set[str] = field(default_factory=set)
    unused: set[str] = field(default_factory=set)  # no rank used it: .grad stays None, as torch DDP leaves it


_GPT_MEMO: dict = {}


def _gpt_scenario(what: str, seed: int, *, n_buckets: int | None, step: int = 0, micro: int = 1,
                  overlap: bool = True, watch: bool = False, trace: bool = False) -> Scenario:
    import torch

    from scaletrain.models import GPT
    cfg, cap_mb, buckets = _shape(n_buckets)
    x, y = _batch(cfg, step, P * micro * 3, seed)
    key = (n_buckets is None, step, micro, seed)
    if key not in _GPT_MEMO:  # the references first, before any student code ran on these rows
        local = [_gpt_grads(cfg, x[r * micro * 3:(r + 1) * micro * 3], y[r * micro * 3:(r + 1) * micro * 3])
                 for r in range(P)]
        if all(torch.equal(a, b) for a, b in zip(*local)):  # else a dummy collective could look right
            raise RuntimeError("suite bug: the ranks' rows give the same gradients")
        _GPT_MEMO[key] = (_gpt_grads(cfg, x, y), local)
    ref, local = _GPT_MEMO[key]
    batches = [[{"args": (x[r * micro * 3 + 3 * j: r * micro * 3 + 3 * (j + 1)],
                          y[r * micro * 3 + 3 * j: r * micro * 3 + 3 * (j + 1)]), "kwargs": {}}
                for j in range(micro)] for r in range(P)]
    send = dict(model="gpt", cfg=dict(vocab_size=cfg.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer,
                                      n_head=cfg.n_head, n_embd=cfg.n_embd),
                init_seed=1, buckets=buckets, cap_mb=cap_mb, overlap=overlap, batches=batches,
                watch=watch, trace=trace)
    names = [n for n, _ in GPT(cfg).named_parameters()]
    return Scenario(what, send, names, ref, local, buckets)


def _branchy_scenario(what: str, seed: int, *, overlap: bool) -> Scenario:
    import torch

    from autograder.probes.a3_data_parallel import branchy_model  # the model both sides build
    xs = torch.randn(P * 3, 5, generator=torch.Generator().manual_seed(seed))
    ref = branchy_model()
    mean_gradients(ref, lambda r: ref(xs[r * 3:(r + 1) * 3], use_b=(r == 1)), P)
    names = [n for n, _ in ref.named_parameters()]
    synced = [p for p in ref.parameters() if p.requires_grad]
    local = []
    for r in range(P):
        model = branchy_model()
        model(xs[r * 3:(r + 1) * 3], use_b=(r == 1)).backward()
        local.append([torch.zeros_like(p) if p.grad is None else p.grad.clone()
                      for p in model.parameters() if p.requires_grad])
    cap_mb = 1e-4
    buckets = _reference_assign()(synced, max(1, int(cap_mb * 2**20)))
    expected = [None if p.grad is None else p.grad.clone() for p in ref.parameters()]
    send = dict(model="branchy", buckets=buckets, cap_mb=cap_mb, overlap=overlap,
                batches=[[{"args": (xs[r * 3:(r + 1) * 3],), "kwargs": {"use_b": r == 1}}] for r in range(P)])
    return Scenario(what, send, names, expected, local, buckets,
                    frozen={"frozen.weight", "frozen.bias"}, unused={"never.weight", "never.bias"})


def _plan(seed: int) -> dict[str, list[Scenario]]:
    """Each distributed check's scenarios, in the order the ranks run them; each of the public
    tests' steps (n_buckets=None: their GPT and cap) among them (issue 27)."""
    pub = "the public tests' GPT in 7 buckets"
    plan = {C_SYNC: [_gpt_scenario(f"{n} bucket(s), step {step}, overlap=False", seed, n_buckets=n, step=step,
                                   overlap=False) for n in (1, 2, 3) for step in range(2)]
            + [_gpt_scenario(f"{pub}, overlap=False", seed, n_buckets=None, overlap=False)],
            C_ONCE: [_gpt_scenario(f"3 buckets, overlap={overlap}", seed, n_buckets=3, overlap=overlap)
                     for overlap in (False, True)],
            C_UNUSED: [_branchy_scenario("frozen, unused and one-rank parameters, overlap=False", seed,
                                         overlap=False)],
            C_OVERLAP: [_gpt_scenario(f"{what}, overlap=True", seed, n_buckets=n, watch=True, trace=True)
                        for what, n in (("3 buckets", 3), (pub, None))],
            C_HOOKED: [_gpt_scenario(f"overlap=True, step {step}", seed, n_buckets=2, step=step)
                       for step in range(2)] + [_gpt_scenario(f"{pub}, overlap=True", seed, n_buckets=None)],
            C_NOSYNC: [_gpt_scenario(f"{what}, 4 micro-steps (3 inside no_sync)", seed, n_buckets=n, micro=4)
                       for what, n in (("3 buckets", 3), (pub, None))],
            C_UNUSED_HOOKED: [_branchy_scenario("frozen, unused and one-rank parameters, overlap=True", seed,
                                                overlap=True)]}
    assert list(plan) == list(DDP_CHECKS)
    return plan


# ---------------------------------------------------------------- judging one rank's outputs

def _matches(launch, want) -> bool:
    import torch
    data = launch.get("data") if isinstance(launch, dict) else None
    if not isinstance(data, torch.Tensor) or data.shape != want.shape or data.dtype != want.dtype:
        return False
    try:
        checks.assert_close(data, want, rtol=RTOL, what="a launch")
    except AssertionError:
        return False
    return True


def _bucket_launches(sc: Scenario, out: dict, rank: int) -> list[int | None]:
    """For each bucket, the index of the first launched allreduce that carried exactly this rank's
    local gradients of that bucket (None: none did)."""
    import torch
    launches, used, found = out["launches"], set(), []
    for members in sc.buckets:
        want = torch.cat([sc.local[rank][i].reshape(-1) for i in members])
        j = next((j for j, launch in enumerate(launches) if j not in used and _matches(launch, want)), None)
        if j is not None:
            used.add(j)
        found.append(j)
    return found


def _outside(out: dict) -> str:
    calls = out.get("outside") or {}
    return ", ".join(f"{name} ×{n}" for name, n in sorted(calls.items()))


def _through_launches(sc: Scenario, out: dict, rank: int) -> list[int | None]:
    """Every bucket's local gradients went out through an allreduce DataParallel launched."""
    found = _bucket_launches(sc, out, rank)
    missing = [b for b, j in enumerate(found) if j is None]
    if missing:
        extra = f"; collectives outside it: {_outside(out)}" if out.get("outside") else ""
        raise AssertionError(
            f"{sc.what}: {len(missing)} of {len(sc.buckets)} buckets (first: bucket {missing[0]}) never went out "
            f"through the allreduce DataParallel was given with this rank's gradients in them "
            f"({len(out['launches'])} allreduces launched{extra}): launch each bucket's buffer, filled with its "
            "gradients, with bucket.launch(self._allreduce)")
    return found


def _store_used(out: dict) -> None:
    if out.get("store"):
        raise Flagged(f"used the c10d store ({', '.join(sorted(set(map(str, out['store']))))}) inside "
                      "DataParallel: the gradients must travel through the allreduce it is given")


def _compare_grads(sc: Scenario, out: dict) -> None:
    import torch
    grads = out["grads"]
    assert isinstance(grads, list) and len(grads) == len(sc.names), \
        f"{sc.what}: {len(grads) if isinstance(grads, list) else '?'} gradients for {len(sc.names)} parameters"
    for name, g, r in zip(sc.names, grads, sc.ref, strict=True):
        if name in sc.frozen:
            assert g is None, f"{sc.what}: {name} is frozen and got a .grad: it must not be synchronized"
            continue
        if name in sc.unused:
            assert g is None, f"{sc.what}: {name}: no rank used it, so its .grad must stay None (as in torch DDP)"
            continue
        assert g is not None, f"{sc.what}: {name}.grad is None after finish_gradient_synchronization()"
        if isinstance(g, torch.Tensor) and g.shape == r.shape and r.any() and rel_error(g, P * r) <= 1e-4:
            raise AssertionError(f"{sc.what}: {name}.grad is {P}x the mean gradient: the allreduce sums, "
                                 "divide each bucket by dp_world_size")
        checks.assert_close(g, r, rtol=RTOL, what=f"{sc.what}: {name}.grad")


def _judge_sync(sc, out, rank):
    assert out["n_buckets"] == len(sc.buckets), \
        f"suite expected {len(sc.buckets)} buckets, DataParallel made {out['n_buckets']}"
    _compare_grads(sc, out)
    _through_launches(sc, out, rank)


def _judge_once(sc, out, rank):
    n, launched = len(sc.buckets), out["launched_after"][-1]
    assert launched == n, (f"{sc.what}: {launched} allreduces in one step for {n} buckets; "
                           "launch each bucket exactly once")
    found = _through_launches(sc, out, rank)
    assert found == list(range(n)), (f"{sc.what}: the allreduces carried the buckets in the order {found}; "
                                     "launch bucket 0 first, then 1, ...")
    extra = {k: n - USED_MAP.get(k, 0) for k, n in (out.get("outside") or {}).items()}
    assert not any(n > 0 for n in extra.values()), (
        f"{sc.what}: collectives besides the buckets' allreduces ran during the step ({_outside(out)}, one "
        "allreduce of them the used-parameter map finish sends itself); only the allreduce DataParallel is "
        "given may communicate")


def _judge_unused(sc, out, rank):
    _compare_grads(sc, out)
    _through_launches(sc, out, rank)


def _judge_overlap(sc, out, rank):
    n, times = len(sc.buckets), out["grad_times"]
    assert times, f"{sc.what}: the grader's own gradient hooks never ran"
    found = _through_launches(sc, out, rank)
    last = max(times)
    early = sum(1 for j in found if out["launches"][j]["t"] < last)
    dummies = sum(1 for j, launch in enumerate(out["launches"]) if j not in found and launch["t"] < last)
    note = f" ({dummies} allreduces launched earlier carried something else)" if dummies else ""
    assert early >= n - 1, (
        f"{early} of {n} buckets went out before the last gradient of backward arrived; expected {n - 1}: "
        f"launch each bucket from the gradient hook as soon as it is full{note}")


def _judge_hooked(sc, out, rank):
    _compare_grads(sc, out)
    _through_launches(sc, out, rank)


def _judge_no_sync(sc, out, rank):
    n = len(sc.buckets)
    launched, outside = out["launched_after"], out["outside_after"]
    assert launched[2] == 0 and outside[2] == 0, (
        f"{launched[2]} allreduces (and {outside[2]} other collectives) during the 3 micro-steps inside "
        "no_sync(): expected none")
    assert launched[-1] == n, f"{launched[-1]} allreduces in the synchronized step for {n} buckets"
    _compare_grads(sc, out)
    _through_launches(sc, out, rank)


_JUDGES = {C_SYNC: _judge_sync, C_ONCE: _judge_once, C_UNUSED: _judge_unused, C_OVERLAP: _judge_overlap,
           C_HOOKED: _judge_hooked, C_NOSYNC: _judge_no_sync, C_UNUSED_HOOKED: _judge_unused}


def _verdict(name: str, scenarios: list[Scenario], results, rank: int):
    """None (passed) or (exception type name, message) for one check on one rank, the scenarios in
    order: what a scenario raised in the worker, else what its outputs show."""
    try:
        assert isinstance(results, list), f"the ranks sent no outputs for {name!r}"
        assert len(results) <= len(scenarios), (  # fewer: a scenario raised and ended the check (below)
            f"{len(results)} outputs came back for {name!r}, which ran {len(scenarios)} scenarios")
        for i, sc in enumerate(scenarios):
            assert i < len(results) and isinstance(results[i], dict), f"{sc.what}: no outputs came back"
            if "raised" in results[i]:
                kind, message, where = (str(x) for x in results[i]["raised"])
                return kind, f"{message}{where}"
            out = results[i]["ok"]
            _store_used(out)
            _JUDGES[name](sc, out, rank)
    except (AssertionError, Flagged) as exc:
        return type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "assertion failed"
    except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:
        return "AssertionError", f"the outputs that came back are malformed ({type(exc).__name__}: {exc})"
    return None


def group_ddp(ctx):
    import torch

    from scaletrain.models import GPT, make_batch
    start = time.monotonic()
    torch.set_num_threads(1)
    plan = _plan(checks.trial_seeds(1, salt=33)[0])   # every reference, before any student code runs
    cfg, n_params = _cfg(), len(list(GPT(_cfg()).parameters()))
    send = {"world_size": P, "wait_s": WAIT_S, "spawn_timeout_s": 60,
            "checks": [(name, [sc.send for sc in scenarios]) for name, scenarios in plan.items()],
            "preflight": dict(model="gpt", init_seed=0, buckets=[list(reversed(range(n_params)))],
                              cfg=dict(vocab_size=cfg.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer,
                                       n_head=cfg.n_head, n_embd=cfg.n_embd),
                              batch=tuple(make_batch(cfg, 2, seed=0)))}
    failure, per_rank = None, None
    try:
        outputs = ctx.untrusted().call(f"{PROBE}:data_parallel", "dp_data_parallel", send,
                                       timeout_s=max(20.0, ctx.timeout_s - (time.monotonic() - start) - 15))
        if not (isinstance(outputs, list) and len(outputs) == P and all(isinstance(o, dict) for o in outputs)):
            raise AssertionError(f"the ranks' outputs are malformed: {str(outputs)[:80]}")
        per_rank = [{name: _verdict(name, scenarios, outputs[rank].get(name), rank)
                     for name, scenarios in plan.items()} for rank in range(P)]
    except Exception as exc:  # noqa: BLE001 - reported inside every check below
        failure = exc
    ctx.report_ranks(DDP_CHECKS, per_rank, failure)
