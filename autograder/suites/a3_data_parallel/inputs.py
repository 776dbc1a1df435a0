"""a3's hidden inputs: parameter lists and caps for task 3.1, and the scenarios the ranks run for
tasks 3.2 and 3.3 (a hidden GPT shape, a model with frozen, unused and one-rank parameters), each
with the references a single process computes before any student code runs."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field

from scaletrain.testing import mean_gradients

from .names import C_HOOKED, C_NOSYNC, C_ONCE, C_OVERLAP, C_SYNC, C_UNUSED, C_UNUSED_HOOKED, DDP_CHECKS, P

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
    docstring's example, whose middle bucket exactly fills its cap, the default GPT at the
    public caps, and a dtype change. Issue 27: a hidden suite runs every public case."""
    import torch

    from scaletrain.models import GPTConfig
    docstring = [((n,), torch.float32) for n in (10, 20, 30, 40)]
    f32, f64 = torch.float32, torch.float64
    dtypes = [((2,), f32), ((2,), f64), ((2,), f32)]
    return [(docstring, (200,)), (_gpt_specs(GPTConfig()), (1, 4 * 5000, 4 * 40000, 10**9)), (dtypes, (10**6,))]


def _exact_caps(specs) -> tuple[int, ...]:
    """Caps that the last two and the last three parameters exactly fill: a bucket must take a
    parameter that brings it exactly to the cap (`>` closes it, not `>=`; issue 27)."""
    sizes = [_nbytes(s) for s in reversed(specs)]
    return tuple(sum(sizes[:k]) for k in (2, 3) if len(sizes) >= k)


def _hidden_cases(rng: random.Random) -> list[tuple[list, tuple[int, ...]]]:
    """(specs, caps): the hidden GPT's parameters, then random 1-D sizes (fp32, or fp32 and fp64
    mixed), each at the fixed caps and at caps some of its buckets exactly fill; a parameter
    larger than the cap between two small ones; then the public tests' cases."""
    import torch
    lists = [_gpt_specs()]
    for k in range(8):
        dtypes = (torch.float32,) if k < 5 else (torch.float32, torch.float64)
        lists.append([((rng.randint(1, 5000),), rng.choice(dtypes)) for _ in range(rng.randint(1, 30))])
    oversized = [((10,), torch.float32), ((1000,), torch.float32), ((10,), torch.float32)]
    exact = [((300,), torch.float32), ((60,), torch.float32), ((40,), torch.float32)]  # 160 + 240 B = the cap
    return ([(specs, CAPS + _exact_caps(specs)) for specs in lists] + [(oversized, (100,)), (exact, (400,))]
            + _public_cases())



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

