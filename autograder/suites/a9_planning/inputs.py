"""a9's hidden inputs: seeded models (GPT-3- and Llama-style), clusters, layouts, search cases,
and the public tests' cases (every public case runs in the hidden suite too)."""

from __future__ import annotations

import dataclasses
import math
import random

TRIALS = 25
M72 = dict(layers=72, hidden=6144, heads=48, seq=2048, vocab=51200)  # the public tests' 9.2 and 9.3 model


def plan():
    from scaletrain import plan as ref
    return ref


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def random_model(rng: random.Random, *, small: bool = False, llama: bool | None = None):
    heads = rng.choice([4, 6, 8, 12, 16, 24] if small else [3, 5, 6, 8, 12, 16, 20, 24, 40, 48, 96])
    layers = rng.choice([4, 6, 8, 12, 16, 24] if small else [6, 10, 12, 15, 18, 24, 30, 36, 48, 60, 72, 80, 96])
    hidden = heads * rng.choice([40, 64, 80, 96, 128])
    shape = dict(layers=layers, hidden=hidden, heads=heads, seq=rng.choice([511, 1024, 2048, 4096]),
                 vocab=rng.randint(30_000, 260_000), name=f"hidden-{rng.randint(0, 999)}")
    if llama if llama is not None else rng.random() < 0.4:
        shape.update(kv_heads=rng.choice(divisors(heads)[:-1] or [heads]), ffn_hidden=hidden * rng.randint(2, 4) + 8,
                     gated_ffn=rng.random() < 0.8, tied_embeddings=False, biases=False, learned_positions=False)
    return plan().ModelSpec(**shape)


def random_cluster(rng: random.Random, *, hbm_gb: float | None = None):
    from scaletrain.comm.cost_model import AlphaBeta
    return plan().ClusterSpec(
        name="hidden", gpus_per_node=rng.choice([4, 8, 16]), peak_flops=rng.uniform(1e14, 2e15),
        hbm_bytes=int((hbm_gb or rng.choice([40, 80, 141])) * 1e9), hbm_bandwidth=rng.uniform(1e12, 5e12),
        intra=AlphaBeta(alpha_s=rng.uniform(1e-6, 1e-5), beta_s_per_byte=1 / rng.uniform(1e11, 5e11)),
        inter=AlphaBeta(alpha_s=rng.uniform(2e-6, 3e-5), beta_s_per_byte=1 / rng.uniform(1e10, 6e10)),
        efficiency=plan().GemmEfficiency(a=rng.uniform(1.1, 2.5), kappa=rng.uniform(0, 400)),
        reserved_bytes=rng.randint(0, 4 * 10**9))


def _stage_map(rng: random.Random, layers: int, pp: int):
    """Megatron's balanced split or equal first/last stages, whichever exist (None if neither)."""
    from scaletrain.plan.stages import balanced_stages, first_last_stages
    maps = [balanced_stages(layers, pp)]
    if pp > 2:
        end = rng.randint(1, max(1, layers // pp))
        maps.append(first_last_stages(layers, pp, first=end, last=end))
    maps = [m for m in maps if m is not None]
    return rng.choice(maps) if maps else None


def random_layout(rng: random.Random, model, *, pipeline: bool | None = None, max_m: int = 64,
                  new_axes: bool = True):
    """A valid layout; `new_axes` draws context parallelism, flash attention, overlapped sends and
    uneven stages too."""
    tp = rng.choice([t for t in divisors(math.gcd(model.heads, model.kv)) if t <= 32])
    wanted = [p for p in range(1, 17) if (pipeline is None or (p > 1) == pipeline) and p <= model.layers]
    pp = rng.choice(wanted or [1])
    stages = None
    if new_axes and pp > 1 and (model.layers % pp or rng.random() < 0.3):
        stages = _stage_map(rng, model.layers, pp)
    if stages is None and model.layers % pp:
        pp = rng.choice([p for p in divisors(model.layers) if p in wanted] or [1])
    smallest = min(stages) if stages else model.layers // pp
    v = rng.choice(divisors(smallest)[:4]) if pp > 1 and rng.random() < 0.5 else 1
    m = rng.randint(1, max_m)
    if v > 1:
        m = pp * rng.randint(1, max(1, max_m // pp))
    cps = [1] + ([c for c in (2, 4) if model.seq % (2 * c) == 0] if new_axes else [])
    b, dp = rng.choice([1, 2, 3, 4, 8]), rng.choice([1, 2, 3, 4, 8, 16, 64])
    return plan().Layout(tp=tp, pp=pp, dp=dp, microbatch=b, global_batch=m * b * dp, interleave=v,
                         zero=rng.randint(0, 3), recompute=rng.choice(["full", "selective", "none"]),
                         sequence_parallel=rng.random() < 0.3, overlap_dp=rng.random() < 0.5,
                         cp=rng.choice(cps), stages=stages, flash_attention=new_axes and rng.random() < 0.4,
                         overlap_pp=new_axes and rng.random() < 0.3)


def config(seed: int, **kw):
    rng = random.Random(seed)
    model = random_model(rng, llama=kw.pop("llama", None))
    return model, random_cluster(rng), random_layout(rng, model, **kw)


def sim_config(seed: int):
    rng = random.Random(seed)
    model = random_model(rng, small=True)
    layout = random_layout(rng, model, pipeline=True, max_m=24, new_axes=False)
    layout = dataclasses.replace(layout, dp=1, global_batch=layout.num_microbatches * layout.microbatch)
    return model, random_cluster(rng), layout


def flight_case(seed: int, kind: str) -> tuple[int, int, int, int]:
    """(p, m, v, rank) of one phase: 1f1b (m >= p), gpipe (m < p), interleaved, cap (v·m below the
    warm-up), ranks (past 0)."""
    rng = random.Random(seed)
    p = rng.randint(2, 9)
    if kind == "1f1b":
        return p, rng.randint(p, 3 * p + 2), 1, 0
    if kind == "gpipe":
        return p, rng.randint(1, p - 1), 1, 0
    v = rng.choice([2, 3, 4])
    if kind == "interleaved":
        return p, p * rng.randint(3, 6), v, 0
    if kind == "cap":
        return p, p, v, 0  # v·p is below the warm-up 2(p-1) + (v-1)·p + 1 whenever p > 1
    assert kind == "ranks", kind
    if rng.random() < 0.5:
        return p, rng.randint(p, 3 * p), 1, rng.randint(1, p - 1)
    return p, p * rng.randint(1, 4), v, rng.randint(1, p - 1)


def public_configs(kind: str) -> list:
    """(model, cluster, layout) of the public tests (assignments/a9_planning/tests/) for one check."""
    from scaletrain.comm.cost_model import AlphaBeta
    ref = plan()
    a100, gpt3, m72 = ref.CLUSTERS["a100-80gb"], ref.GPT3_175B, ref.ModelSpec(**M72)
    if kind == "layer":
        lay = ref.Layout(tp=8, pp=8, dp=16, microbatch=2, global_batch=1536, recompute="none")
        variants = (lay, dataclasses.replace(lay, sequence_parallel=True),
                    dataclasses.replace(lay, recompute="selective"), dataclasses.replace(lay, recompute="full"))
        return [(gpt3, a100, v) for v in variants]
    if kind == "memory":
        return [(gpt3, a100, ref.Layout(tp=8, pp=8, dp=16, microbatch=1, global_batch=1536))]
    if kind == "stage":
        cluster = dataclasses.replace(a100, intra=AlphaBeta(alpha_s=0.0, beta_s_per_byte=1 / 100e9))
        return [(m72, cluster, ref.Layout(tp=4, pp=1, dp=1, microbatch=3, global_batch=3, recompute="none"))]
    assert kind == "sim", kind
    return [(m72, a100, ref.Layout(tp=2, pp=p, dp=1, microbatch=1, global_batch=m, interleave=v))
            for p, m, v in ((4, 8, 1), (3, 6, 3))]


def search_case(seed: int, *, allow_empty: bool = False, new_axes: bool = False):
    """A small model, a cluster whose memory cuts the space, a GPU count, a batch and options;
    redrawn until some layout can run it, unless `allow_empty`."""
    from scaletrain.plan.layouts import candidate_layouts

    rng = random.Random(seed)
    while True:
        model = random_model(rng, small=True)
        if new_axes:
            model = dataclasses.replace(model, seq=rng.choice([1024, 2048]), layers=rng.choice([6, 10, 14, 22]))
        cluster = random_cluster(rng, hbm_gb=rng.choice([8, 16, 24]))
        gpus = rng.choice([8, 12, 16, 24, 32, 48])
        batch = gpus * rng.choice([1, 2, 3, 4])
        space = dict(microbatches=rng.sample([1, 2, 3, 4, 8], rng.randint(2, 4)),
                     zero=rng.sample([0, 1, 2, 3], rng.randint(1, 2)),
                     recompute=rng.sample(["full", "selective", "none"], rng.randint(1, 3)),
                     sequence_parallel=rng.sample([False, True], rng.randint(1, 2)), overlap_dp=rng.random() < 0.5)
        if rng.random() < 0.5:
            space["interleaves"] = rng.sample([1, 2, 3, 4], rng.randint(1, 3))
        if new_axes:
            space.update(cps=rng.sample([1, 2, 4], rng.randint(1, 3)), uneven_stages=True,
                         flash_attention=rng.random() < 0.5, overlap_pp=rng.random() < 0.5)
        try:
            candidate_layouts(model, cluster, gpus, batch, **space)
        except ValueError:
            if not allow_empty:
                continue
        return model, cluster, gpus, batch, space


def public_search_case():
    """The public test's search: GPT-3 175B on 1024 A100s, batch 1536, the default space."""
    return plan().GPT3_175B, plan().CLUSTERS["a100-80gb"], 1024, 1536, {}


def cp_case(seed: int):
    """(model, cluster, gpus, tokens, seqs, cps, space) for task 9.5: a small model on a few GPUs,
    lengths from short to long, 2024-style options."""
    rng = random.Random(seed)
    model = dataclasses.replace(random_model(rng, small=True), layers=rng.choice([4, 8]))
    cluster = random_cluster(rng, hbm_gb=rng.choice([16, 40, 80]))
    gpus = rng.choice([4, 8, 16])
    seqs = sorted(rng.sample([1024, 2048, 4096, 8192, 16384, 32768], rng.randint(3, 5)))
    tokens = max(seqs) * rng.choice([1, 2, 4])
    space = dict(microbatches=(1,), recompute=rng.sample(["none", "selective", "full"], rng.randint(1, 2)),
                 flash_attention=rng.random() < 0.7, sequence_parallel=(True,), zero=(1,), overlap_dp=True)
    return model, cluster, gpus, tokens, seqs, tuple(rng.sample([2, 4, 8], rng.randint(1, 3))), space
