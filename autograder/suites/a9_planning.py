"""Assignment a9: plan a training run at scale (`assignments/a9_planning/`).

The student writes the planner's three models (`scaletrain.plan`): memory per GPU with the
microbatches a schedule keeps in flight (9.1), the per-microbatch stage times (9.2), the
iteration time with its bubble, DP reduction and overlap (9.3), and the layout search (9.4).
Each is compared with the reference on held-out configurations the grader draws from the seed
(irregular head counts, layers, vocabularies; TP beyond a node; ZeRO 0-3; every recomputation;
sequence parallelism; interleaving) and with references nobody here wrote:

- in-flight counts against `scaletrain.pipeline.peak_in_flight` on the generated schedules;
- the pipeline part of the iteration against `scaletrain.pipeline.simulate` on the schedule;
- the time model against Narayanan et al. 2021, Table 1 (rows 1-7, ±7 % of the published
  TFLOP/s per GPU, at the layouts the reference planner picks), the memory model against the
  published configurations (all under 80 GB).

Every group is *trusted* (`Group.trusted`): this process never imports the submission. The probes
(`autograder/probes/a9_planning.py`) build the specs from data in the sandboxed worker, call the
student's functions and send numbers back; expected values and verdicts stay here. Each task is
graded on its own: 9.3 runs with the reference's stage times put in place of the student's
`stage_times`, 9.4's search ranks predictions computed here (a table the probe looks up), so a
wrong memory or time model costs only its own task. The Table 1 check is the exception by
design: it runs the student's whole time model (9.2 and 9.3).

A published figure can be looked up instead of modelled: the Table 1 checks are granted only when
the model's own checks on held-out configurations passed in the same run (`Check.needs`,
`grade.with_values`): Table 1's times with 9.2's and 9.3's, the published memory with 9.1's.
"""

from __future__ import annotations

import dataclasses
import random

from autograder import checks
from autograder.attacks import function_attacks
from autograder.manifest import REPO, Check, Group, Manifest, Planted, Task
from scaletrain.testing import assert_close

MF, TF, SF = "plan_memory.py", "plan_time.py", "plan_search.py"
SOURCES = {MF: "lib/scaletrain/plan/memory.py", TF: "lib/scaletrain/plan/time_model.py",
           SF: "lib/scaletrain/plan/layouts.py"}
PROBE = "autograder.probes.a9_planning:"
_NO_TRICKS = ("torch", "importlib", "__import__", "exec", "eval", "sys", "inspect", "builtins", "gc", "subprocess")

C_LAYER = "bytes one layer keeps: none, selective, full recompute, sequence parallel (hidden shapes)"
C_FLIGHT = "microbatches in flight equal the schedules' own peak (1F1B, GPipe, interleaved)"
C_MEMORY = "memory per GPU on held-out configurations (ZeRO 0-3, recompute, SP, interleaving)"
C_PUBLISHED_MEM = "every published Table 1 configuration fits in 80 GB by your memory model"
C_STAGE = "stage times on held-out configurations (compute, TP inside and across nodes, messages)"
C_TIME = "iteration time breakdown on held-out configurations (bubble, DP, ZeRO-3, overlap, optimizer)"
C_SIM = "compute + TP + PP + bubble equals the simulated makespan of the schedule"
C_TABLE1 = "your time model reproduces Table 1 rows 1-7 within ±7% (Narayanan et al. 2021)"
C_CANDIDATES = "candidate layouts are exactly the valid ones (hidden models, GPU counts, options)"
C_SEARCH = "search keeps what fits and ranks it fastest first (the grader's predictions)"

TRIALS = 25
RTOL = 1e-6  # the answers are arithmetic; floats differ by the order of operations only


def _attacks() -> tuple[Planted, ...]:
    """Attacks on the grader itself (issue 13's catalogue, autograder/attacks.py), each in place
    of the interleaved branch of `in_flight_microbatches`: under the trusted split they earn nothing."""
    ret = "    return min(2 * (p - 1 - r) + (v - 1) * p + 1, v * m)"
    call = "in_flight_microbatches(pp=pp, num_microbatches=num_microbatches, interleave=interleave)"
    attacks = function_attacks(checks=[C_FLIGHT, C_MEMORY], module="scaletrain.plan.memory",
                               source=str(REPO / SOURCES[MF]), call=call, keys=("want", "expected", "ref", "peak"))
    return tuple(Planted(name, MF, (ret, body), groups=("memory",), expect={C_FLIGHT: outcome, C_LAYER: "passed"})
                 for name, (body, outcome) in attacks.items())


_TABLE1_LOOKUP = (
    "    from scaletrain.plan.flops import iteration_flops\n"
    "    from scaletrain.plan.published import TABLE1\n"
    "    for run in TABLE1:\n"
    "        if run.model == model and run.gpus == layout.gpus:  # the paper's row: its measured TFLOP/s\n"
    "            flops = iteration_flops(model, layout.global_batch, recompute=layout.recompute)\n"
    "            return TimeBreakdown(compute_s=flops / (run.tflops_per_gpu * 1e12 * run.gpus), tp_comm_s=0.0,\n"
    "                                 pp_comm_s=0.0, bubble_s=0.0, dp_comm_s=0.0, dp_overlap_s=0.0, optimizer_s=0.0)\n"
    "    raise NotImplementedError('a9 task 9.3')\n")

MANIFEST = Manifest(
    assignment="a9", folder="a9_planning", title="Plan a training run at scale",
    files={MF: SOURCES[MF], TF: SOURCES[TF], SF: SOURCES[SF]},
    tasks=(
        Task("9.1", "Memory per GPU with the microbatches in flight", file=MF,
             functions=("layer_activation_bytes", "in_flight_microbatches", "memory_per_gpu")),
        Task("9.2", "Stage times: compute, tensor-parallel allreduces, pipeline messages", file=TF,
             functions=("stage_times",)),
        Task("9.3", "Iteration time: bubble, data-parallel reduction, overlap, optimizer", file=TF,
             functions=("time_breakdown",)),
        Task("9.4", "Search: every layout that fits, fastest first", file=SF,
             functions=("candidate_layouts", "search")),
    ),
    # the models are arithmetic on the course's library: no torch, no import tricks
    forbidden={f: _NO_TRICKS for f in (MF, TF, SF)},
    groups=(
        Group("memory", "autograder.suites.a9_planning:group_memory", timeout_s=90, trusted=True, checks=(
            Check("9.1", C_LAYER, 8),
            Check("9.1", C_FLIGHT, 8),
            Check("9.1", C_MEMORY, 12),
            Check("9.1", C_PUBLISHED_MEM, 2, needs=(C_MEMORY,)),
        )),
        Group("time", "autograder.suites.a9_planning:group_time", timeout_s=120, trusted=True, checks=(
            Check("9.2", C_STAGE, 15),
            Check("9.3", C_TIME, 15),
            Check("9.3", C_SIM, 5),
            Check("9.3", C_TABLE1, 10, needs=(C_STAGE, C_TIME)),
        )),
        Group("search", "autograder.suites.a9_planning:group_search", timeout_s=120, trusted=True, checks=(
            Check("9.4", C_CANDIDATES, 12),
            Check("9.4", C_SEARCH, 13),
        )),
    ),
    planted=(
        Planted("bubble ignored (throughput too high)", TF,
                ("    bubble = (compute + tp_comm + cp_comm + pp_comm) * f / (1 - f)\n", "    bubble = 0.0\n"),
                groups=("time",),
                expect={C_TIME: "failed", C_SIM: "failed", C_STAGE: "passed"}),
        Planted("activations of one microbatch instead of the ones in flight", MF,
                ("    activations = pairs * layers_per_chunk * layer_activation_bytes(model, layout)\n",
                 "    activations = layers_per_chunk * layer_activation_bytes(model, layout)\n"), groups=("memory",),
                expect={C_MEMORY: "failed", C_PUBLISHED_MEM: "failed", C_FLIGHT: "passed", C_LAYER: "passed"}),
        # issue 27: m < p, a boundary the public test exercises (p = 4, m = 2: GPipe holds only m)
        Planted("in-flight microbatches: p even when m < p (min(p, m) forgotten)", MF,
                ("        return m if m < p else p - r\n", "        return p - r\n"), groups=("memory",),
                expect={C_FLIGHT: "failed", C_LAYER: "passed"}),
        Planted("tensor-parallel allreduces never leave NVLink", TF,
                ("    tp_link = _link(cluster, layout.tp_crosses_node(cluster))\n", "    tp_link = cluster.intra\n"),
                groups=("time",), expect={C_STAGE: "failed", C_TIME: "passed", C_TABLE1: "failed"}),
        # issue 28: the published figures looked up, no time model at all
        Planted("time_breakdown looks up Table 1's TFLOP/s; no model for anything else", TF,
                ("    st = stage_times(model, cluster, layout)\n    p, m, v, d = ",
                 _TABLE1_LOOKUP + "    st = stage_times(model, cluster, layout)\n    p, m, v, d = "),
                groups=("time",), expect={C_TABLE1: "failed", C_TIME: "failed", C_STAGE: "passed"}),
        Planted("search ranks by TFLOP/s per GPU (recompute counted as useful work)", SF,
                ("fitting.sort(key=lambda pred: (pred.iteration_s, pred.memory_per_gpu_bytes))",
                 "fitting.sort(key=lambda pred: -pred.tflops_per_gpu)"), groups=("search",),
                expect={C_SEARCH: "failed", C_CANDIDATES: "passed"}),
        Planted("search keeps layouts that do not fit", SF,
                ("for layout in layouts) if pred.fits]", "for layout in layouts)]"), groups=("search",),
                expect={C_SEARCH: "failed", C_CANDIDATES: "passed"}),
        Planted("infinite loop in candidate_layouts", SF,
                ("                dp = gpus // (tp * cp * pp)\n",
                 "                dp = gpus // (tp * cp * pp)\n                while True:\n                    pass\n"),
                groups=("search",), timeout_s=30, expect={C_CANDIDATES: "timeout", C_SEARCH: "timeout"}),
        Planted("os._exit in stage_times", TF,
                ("    layer, core = layer_forward_flops(model, b), attention_core_forward_flops(model, b)\n",
                 "    import os; os._exit(3)\n"), groups=("time",),
                expect={C_STAGE: "error", C_TIME: "passed", C_SIM: "passed", C_TABLE1: "error"}),
        *_attacks(),
        Planted("syntax error in the search", SF, ("def search(", "def search(,"),
                expect={C_CANDIDATES: "error", C_SEARCH: "error", C_LAYER: "passed", C_STAGE: "passed"}),
        Planted("imports torch in the memory model", MF,
                ("from dataclasses import dataclass, replace",
                 "from dataclasses import dataclass, replace\nimport torch"),
                groups=("memory",), expect={C_LAYER: "flagged", C_MEMORY: "flagged"}),
    ),
)


# ---------------------------------------------------------------- held-out configurations

def _ref():
    from scaletrain import plan
    return plan


M72 = dict(layers=72, hidden=6144, heads=48, seq=2048, vocab=51200)  # the public tests' 9.2 and 9.3 model


def _public_configs(kind: str) -> list:
    """(model, cluster, layout) of the public tests (assignments/a9_planning/tests/) for one check:
    every public case runs in the hidden suite too (issue 27)."""
    from scaletrain.comm.cost_model import AlphaBeta
    plan = _ref()
    a100, gpt3, m72 = plan.CLUSTERS["a100-80gb"], plan.GPT3_175B, plan.ModelSpec(**M72)
    if kind == "layer":
        lay = plan.Layout(tp=8, pp=8, dp=16, microbatch=2, global_batch=1536, recompute="none")
        variants = (lay, dataclasses.replace(lay, sequence_parallel=True),
                    dataclasses.replace(lay, recompute="selective"), dataclasses.replace(lay, recompute="full"))
        return [(gpt3, a100, v) for v in variants]
    if kind == "memory":
        return [(gpt3, a100, plan.Layout(tp=8, pp=8, dp=16, microbatch=1, global_batch=1536))]
    if kind == "stage":
        cluster = dataclasses.replace(a100, intra=AlphaBeta(alpha_s=0.0, beta_s_per_byte=1 / 100e9))
        return [(m72, cluster, plan.Layout(tp=4, pp=1, dp=1, microbatch=3, global_batch=3, recompute="none"))]
    assert kind == "sim", kind
    return [(m72, a100, plan.Layout(tp=2, pp=p, dp=1, microbatch=1, global_batch=m, interleave=v))
            for p, m, v in ((4, 8, 1), (3, 6, 3))]


def _as_dict(spec) -> dict:
    return dataclasses.asdict(spec)


def _random_model(rng: random.Random, *, small: bool = False):
    plan = _ref()
    heads = rng.choice([4, 6, 8, 12, 16, 24] if small else [3, 5, 6, 8, 12, 16, 20, 24, 40, 48, 96])
    layers = rng.choice([4, 6, 8, 12, 16, 24] if small else [6, 10, 12, 15, 18, 24, 30, 36, 48, 60, 72, 80, 96])
    return plan.ModelSpec(layers=layers, hidden=heads * rng.choice([40, 64, 80, 96, 128]), heads=heads,
                          seq=rng.choice([511, 1024, 2048, 4096]), vocab=rng.randint(30_000, 260_000),
                          name=f"hidden-{rng.randint(0, 999)}")


def _random_cluster(rng: random.Random, *, hbm_gb: float | None = None):
    from scaletrain.comm.cost_model import AlphaBeta
    plan = _ref()
    return plan.ClusterSpec(
        name="hidden", gpus_per_node=rng.choice([4, 8, 16]), peak_flops=rng.uniform(1e14, 2e15),
        hbm_bytes=int((hbm_gb or rng.choice([40, 80, 141])) * 1e9), hbm_bandwidth=rng.uniform(1e12, 5e12),
        intra=AlphaBeta(alpha_s=rng.uniform(1e-6, 1e-5), beta_s_per_byte=1 / rng.uniform(1e11, 5e11)),
        inter=AlphaBeta(alpha_s=rng.uniform(2e-6, 3e-5), beta_s_per_byte=1 / rng.uniform(1e10, 6e10)),
        efficiency=plan.GemmEfficiency(a=rng.uniform(1.1, 2.5), kappa=rng.uniform(0, 400)),
        reserved_bytes=rng.randint(0, 4 * 10**9))


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _random_layout(rng: random.Random, model, *, pipeline: bool | None = None, max_m: int = 64):
    plan = _ref()
    tp = rng.choice([t for t in _divisors(model.heads) if t <= 32])
    pps = [p for p in _divisors(model.layers) if p <= 16 and (pipeline is None or (p > 1) == pipeline)]
    pp = rng.choice(pps or [1])
    v = rng.choice(_divisors(model.layers // pp)[:4]) if pp > 1 and rng.random() < 0.5 else 1
    m = rng.randint(1, max_m)
    if v > 1:
        m = pp * rng.randint(1, max(1, max_m // pp))
    b, dp = rng.choice([1, 2, 3, 4, 8]), rng.choice([1, 2, 3, 4, 8, 16, 64])
    return plan.Layout(tp=tp, pp=pp, dp=dp, microbatch=b, global_batch=m * b * dp, interleave=v,
                       zero=rng.randint(0, 3), recompute=rng.choice(["full", "selective", "none"]),
                       sequence_parallel=rng.random() < 0.3, overlap_dp=rng.random() < 0.5)


def _config(seed: int, **kw):
    rng = random.Random(seed)
    model = _random_model(rng)
    return model, _random_cluster(rng), _random_layout(rng, model, **kw)


def _shown(model, layout) -> str:
    return (f"model(l={model.layers}, h={model.hidden}, a={model.heads}, s={model.seq}, V={model.vocab}), "
            f"layout({layout.describe()}, B={layout.global_batch}, overlap_dp={layout.overlap_dp})")


def _same_fields(got, want, call: str, rtol: float = RTOL) -> None:
    """The student's dataclass (sent as its fields) against the reference's, field by field."""
    if not (isinstance(got, dict) and got.get("__dataclass__") == type(want).__name__):
        raise AssertionError(f"{call} must return a {type(want).__name__}, got {got!r:.100}")
    fields = got["fields"]
    for f in dataclasses.fields(want):
        if f.name not in fields:
            raise AssertionError(f"{call}: the {type(want).__name__} has no field {f.name!r}")
        assert_close(fields[f.name], getattr(want, f.name), rtol=rtol, what=f"{call}.{f.name}")


def _args(model, cluster, layout) -> dict:
    return dict(model=_as_dict(model), cluster=_as_dict(cluster), layout=_as_dict(layout))


# ---------------------------------------------------------------- groups

def _flight_case(seed: int) -> tuple[int, int, int]:
    rng = random.Random(seed)
    p, v = rng.randint(1, 9), rng.choice([1, 1, 2, 3, 4])
    if v > 1:
        return max(p, 2), max(p, 2) * rng.randint(1, 6), v
    return p, rng.randint(1, 3 * p + 2), v


def group_memory(ctx):
    from scaletrain.pipeline import gpipe, interleaved_1f1b, one_f_one_b, peak_in_flight
    from scaletrain.plan import memory as ref

    plan, mem = _ref(), ctx.remote("plan_memory", probe=PROBE + "call")
    with ctx.check(C_LAYER):
        configs = _public_configs("layer") + [_config(s) for s in checks.trial_seeds(TRIALS, salt=1)]
        for model, cluster, layout in configs:
            got = mem.layer_activation_bytes(model=_as_dict(model), layout=_as_dict(layout))
            assert_close(got, ref.layer_activation_bytes(model, layout), rtol=1e-9,
                         what=f"layer_activation_bytes({_shown(model, layout)})")
    with ctx.check(C_FLIGHT):
        public = [(4, 8, 1), (4, 2, 1), (4, 8, 2), (3, 6, 3)]  # the public test's (m = 2 < p = 4: GPipe holds m)
        for p, m, v in public + [_flight_case(s) for s in checks.trial_seeds(TRIALS, salt=2)]:
            schedule = interleaved_1f1b(p, m, v) if v > 1 else one_f_one_b(p, m) if m >= p else gpipe(p, m)
            peak = peak_in_flight(schedule[0])
            got = mem.in_flight_microbatches(pp=p, num_microbatches=m, interleave=v)
            assert got == peak, (f"in_flight_microbatches(pp={p}, num_microbatches={m}, interleave={v}) = {got!r}; "
                                 f"rank 0 of the schedule holds {peak} (chunk, microbatch) pairs at its peak")
    with ctx.check(C_MEMORY):
        configs = _public_configs("memory") + [_config(s) for s in checks.trial_seeds(TRIALS, salt=3)]
        for model, cluster, layout in configs:
            want = ref.memory_per_gpu(model, cluster, layout)
            _same_fields(mem.memory_per_gpu(**_args(model, cluster, layout)), want,
                         f"memory_per_gpu({_shown(model, layout)})", rtol=1e-9)
    with ctx.check(C_PUBLISHED_MEM):
        a100 = plan.CLUSTERS["a100-80gb"]
        for run in plan.TABLE1:
            layout = plan.Layout(tp=run.tp, pp=run.pp, dp=run.dp, microbatch=1, global_batch=run.batch,
                                 overlap_dp=False)
            call = f"memory_per_gpu(Table 1 {run.params_b:g}B, {layout.describe()})"
            got = mem.memory_per_gpu(**_args(run.model, a100, layout))
            want = ref.memory_per_gpu(run.model, a100, layout)
            _same_fields(got, want, call, rtol=1e-9)
            total = sum(got["fields"][f] for f in ("params", "grads", "optimizer", "activations", "buffers"))
            assert total < 80e9, f"{call}: {total / 1e9:.1f} GB, but the paper ran it on 80 GB A100s"


def _sim_config(seed: int):
    rng = random.Random(seed)
    model = _random_model(rng, small=True)
    layout = _random_layout(rng, model, pipeline=True, max_m=24)
    layout = dataclasses.replace(layout, dp=1, global_batch=layout.num_microbatches * layout.microbatch)
    return model, _random_cluster(rng), layout


def group_time(ctx):
    from scaletrain.pipeline import interleaved_1f1b, one_f_one_b, simulate
    from scaletrain.plan import time_model as ref
    from scaletrain.plan.calibrate import best_for_row
    from scaletrain.plan.flops import iteration_flops
    from scaletrain.plan.published import FIT_ROWS

    plan = _ref()
    tm = ctx.remote("plan_time", probe=PROBE + "call")
    patched = ctx.remote("plan_time", probe=PROBE + "time_with_stage_times")

    def breakdown(model, cluster, layout):
        st = ref.stage_times(model, cluster, layout)  # the reference's: 9.3 is graded on its own
        return patched.time_breakdown(**_args(model, cluster, layout), stage_times=dataclasses.asdict(st))

    with ctx.check(C_STAGE):
        for model, cluster, layout in _public_configs("stage"):
            _same_fields(tm.stage_times(**_args(model, cluster, layout)), ref.stage_times(model, cluster, layout),
                         f"stage_times({_shown(model, layout)}, the public test's cluster)")
        for i, seed in enumerate(checks.trial_seeds(TRIALS, salt=4)):
            model, cluster, layout = _config(seed)
            if i % 4 == 0:  # every fourth: tensor parallelism wider than a node
                wide = max(t for t in _divisors(model.heads) if t <= 48)
                cluster = dataclasses.replace(cluster, gpus_per_node=max(1, wide // 2))
                layout = dataclasses.replace(layout, tp=wide)
            _same_fields(tm.stage_times(**_args(model, cluster, layout)), ref.stage_times(model, cluster, layout),
                         f"stage_times({_shown(model, layout)}, gpus_per_node={cluster.gpus_per_node})")
    with ctx.check(C_TIME):
        for seed in checks.trial_seeds(TRIALS, salt=5):
            model, cluster, layout = _config(seed)
            _same_fields(breakdown(model, cluster, layout), ref.time_breakdown(model, cluster, layout),
                         f"time_breakdown({_shown(model, layout)})")
    with ctx.check(C_SIM):
        configs = _public_configs("sim") + [_sim_config(s) for s in checks.trial_seeds(8, salt=6)]
        for model, cluster, layout in configs:
            p, m, v = layout.pp, layout.num_microbatches, layout.interleave
            st = ref.stage_times(model, cluster, layout)
            schedule = interleaved_1f1b(p, m, v) if v > 1 else one_f_one_b(p, m) if m >= p else None
            if schedule is None:
                continue  # 1F1B needs m >= p; smaller m is GPipe, covered by the closed form above
            makespan = simulate(schedule, t_f=st.forward_action_s, t_b=st.backward_action_s).makespan
            got = breakdown(model, cluster, layout)["fields"]
            assert_close(got["compute_s"] + got["tp_comm_s"] + got["pp_comm_s"] + got["bubble_s"], makespan,
                         rtol=RTOL, what=f"compute + TP + PP + bubble of {_shown(model, layout)} vs the simulator")
    with ctx.check(C_TABLE1):
        a100 = plan.CLUSTERS["a100-80gb"]
        for run in plan.TABLE1[:FIT_ROWS]:
            layout = best_for_row(run, a100).layout  # the reference planner's pick for the row
            got = tm.time_breakdown(**_args(run.model, a100, layout))
            fields = got["fields"] if isinstance(got, dict) and "fields" in got else {}
            iteration = sum(fields.get(k, 0.0) for k in ("compute_s", "tp_comm_s", "pp_comm_s", "bubble_s",
                                                          "dp_comm_s", "optimizer_s")) - fields.get("dp_overlap_s", 0.0)
            assert iteration > 0, f"time_breakdown(Table 1 {run.params_b:g}B) returned {got!r:.100}"
            tflops = iteration_flops(run.model, run.batch, recompute=layout.recompute) / (iteration * run.gpus) / 1e12
            assert abs(tflops / run.tflops_per_gpu - 1) <= 0.07, (
                f"Table 1 {run.params_b:g}B ({layout.describe()}): your iteration of {iteration:.2f} s gives "
                f"{tflops:.1f} TFLOP/s per GPU, the paper measured {run.tflops_per_gpu:g} (±7%)")


def _search_case(seed: int, *, allow_empty: bool = False):
    """A small model, a cluster whose memory cuts the space, a GPU count, a batch and options;
    redrawn until some layout can run it, unless `allow_empty`."""
    from scaletrain.plan.layouts import candidate_layouts

    rng = random.Random(seed)
    while True:
        model = _random_model(rng, small=True)
        cluster = _random_cluster(rng, hbm_gb=rng.choice([8, 16, 24]))
        gpus = rng.choice([8, 12, 16, 24, 32, 48])
        batch = gpus * rng.choice([1, 2, 3, 4])
        space = dict(microbatches=rng.sample([1, 2, 3, 4, 8], rng.randint(2, 4)),
                     zero=rng.sample([0, 1, 2, 3], rng.randint(1, 2)),
                     recompute=rng.sample(["full", "selective", "none"], rng.randint(1, 3)),
                     sequence_parallel=rng.sample([False, True], rng.randint(1, 2)), overlap_dp=rng.random() < 0.5)
        if rng.random() < 0.5:
            space["interleaves"] = rng.sample([1, 2, 3, 4], rng.randint(1, 3))
        try:
            candidate_layouts(model, cluster, gpus, batch, **space)
        except ValueError:
            if not allow_empty:
                continue
        return model, cluster, gpus, batch, space


def _public_search_case():
    """The public test's search: GPT-3 175B on 1024 A100s, batch 1536, the default space."""
    return _ref().GPT3_175B, _ref().CLUSTERS["a100-80gb"], 1024, 1536, {}


def _key(fields: dict) -> tuple:
    return tuple(sorted(fields.items()))


def group_search(ctx):
    from scaletrain.plan.layouts import candidate_layouts, search
    from scaletrain.plan.prediction import predict

    cand = ctx.remote("plan_search", probe=PROBE + "candidates")
    ranked = ctx.remote("plan_search", probe=PROBE + "search_with_table")
    with ctx.check(C_CANDIDATES):
        impossible = (_ref().GPT3_175B, _random_cluster(random.Random(0)), 7, 1536, {})  # 7 GPUs: no split
        cases = [_search_case(seed, allow_empty=True) for seed in checks.trial_seeds(10, salt=7)]
        cases += [impossible, _public_search_case()]
        for model, cluster, gpus, batch, space in cases:
            call = (f"candidate_layouts(model(l={model.layers}, a={model.heads}), gpus={gpus}, global_batch={batch}, "
                    f"{space})")
            try:
                want = {_key(_as_dict(lay)) for lay in candidate_layouts(model, cluster, gpus, batch, **space)}
            except ValueError:
                want = None  # no layout can run it: the student's must refuse with a ValueError too
            got = cand.candidate_layouts(model=_as_dict(model), cluster=_as_dict(cluster), gpus=gpus,
                                         global_batch=batch, space=space)
            if want is None:
                assert "raised" in got, f"{call}: no layout can run this; expected a ValueError, got {got!r:.200}"
                continue
            assert "layouts" in got, f"{call} raised {got.get('raised')}, but {len(want)} layouts can run it"
            got_keys = [_key(f) for f in got["layouts"]]
            assert len(got_keys) == len(set(got_keys)), f"{call} lists a layout twice"
            missing, extra = want - set(got_keys), set(got_keys) - want
            assert not missing and not extra, (f"{call}: {len(missing)} valid layouts missing (e.g. "
                                               f"{dict(next(iter(missing))) if missing else None}), {len(extra)} "
                                               f"that can't run (e.g. {dict(next(iter(extra))) if extra else None})")
    with ctx.check(C_SEARCH):
        cases = [(_search_case(seed), None if i % 2 else 1 + i) for i, seed in enumerate(checks.trial_seeds(10, salt=8))]
        for (model, cluster, gpus, batch, space), top in cases + [(_public_search_case(), 5)]:
            layouts = candidate_layouts(model, cluster, gpus, batch, **space)
            preds = {_key(_as_dict(lay)): predict(model, cluster, lay) for lay in layouts}
            table = [{"layout": _as_dict(p.layout),
                      "prediction": {f: getattr(p, f) for f in ("iteration_s", "tflops_per_gpu", "mfu", "tokens_per_s",
                                                                "memory_per_gpu_bytes", "fits")}}
                     for p in preds.values()]
            want = search(model, cluster, gpus, batch, predict_fn=lambda _m, _c, lay: preds[_key(_as_dict(lay))],
                          top=top, **space)
            out = ranked.search(model=_as_dict(model), cluster=_as_dict(cluster), gpus=gpus, global_batch=batch,
                                table=table, space=dict(space, top=top))
            call = f"search(gpus={gpus}, global_batch={batch}, top={top}, {space})"
            assert isinstance(out, dict) and not out["unknown"], (
                f"{call} asked for predictions of layouts that are not candidates: {out.get('unknown')}")
            got = [preds.get(_key(f)) for f in out["ranked"]]
            assert None not in got, f"{call} returned a layout that is not a candidate"
            assert all(p.fits for p in got), f"{call} returned a layout that does not fit in memory"
            order = [(p.iteration_s, p.memory_per_gpu_bytes) for p in got]
            assert order == [(p.iteration_s, p.memory_per_gpu_bytes) for p in want], (
                f"{call}: got {len(got)} layouts starting {[p.layout.describe() for p in got[:3]]}, "
                f"expected {len(want)} starting {[p.layout.describe() for p in want[:3]]} "
                f"(fastest first, then less memory)")
