"""a11's hidden inputs: op names from real profiler traces with their categories, shapes to price,
synthetic profiles, PLD schedules and gates, all drawn from the grading seed; each list led by the
public tests' own cases (issue 27: a hidden suite runs every public case)."""

from __future__ import annotations

import random

from autograder import checks

from .labels import BACKWARD, FORWARD, PUBLIC, SYSTEM

DTYPES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8}
PHASES = ("forward", "backward", "optimizer")
WRAPPER = "autograd::engine::evaluate_function: "


def _rng(salt: int) -> random.Random:
    return random.Random(checks.trial_seeds(1, salt=salt)[0])


def labelled(kind: str) -> dict[str, str]:
    """name -> category: the public names of the kind, then every hidden one; autograd nodes both
    bare and inside the engine's wrapper, as traces record them."""
    table = {"forward": FORWARD, "backward": BACKWARD, "system": SYSTEM}[kind]
    out = {n: c for n, c in PUBLIC.items() if n in table or n.removeprefix(WRAPPER) in table}
    out.update(table)
    if kind == "backward":
        out.update({WRAPPER + n: c for n, c in table.items() if not n.startswith(WRAPPER)})
    return out


def unknown_names(count: int = 12) -> list[str]:
    """Made-up names no rule should know (letters no op name is made of), and a few odd shapes."""
    rng = _rng(1101)
    letters = "bcdfhjkqvwxz"
    made = ["aten::" + "".join(rng.choice(letters) for _ in range(rng.randint(4, 9))) for _ in range(count)]
    return made + ["", "ProfilerStep#3", "MyModule.forward", "[memory]", "cudaDeviceSynchronize"]


def _dtype(rng) -> str:
    return rng.choice(list(DTYPES))


def matmul_jobs() -> list[dict]:
    """(name, shapes, dtypes) of mm, addmm, bmm, baddbmm as the profiler records them (scalars as [])."""
    rng = _rng(1102)
    jobs = [dict(name="aten::mm", shapes=[[37, 53], [53, 29]], dtypes=["float", "float"]),  # the public example
            dict(name="aten::addmm", shapes=[[29], [37, 53], [53, 29], [], []], dtypes=["float"] * 3 + ["Scalar"] * 2)]
    for _ in range(6):
        m, k, n, b = rng.randint(1, 300), rng.randint(1, 300), rng.randint(1, 300), rng.randint(2, 12)
        dt = _dtype(rng)
        bias = rng.choice([[n], [m, n], [1, n]])
        jobs += [dict(name="aten::mm", shapes=[[m, k], [k, n]], dtypes=[dt] * 2),
                 dict(name="aten::addmm", shapes=[bias, [m, k], [k, n], [], []], dtypes=[dt] * 3 + ["Scalar"] * 2),
                 dict(name="aten::bmm", shapes=[[b, m, k], [b, k, n]], dtypes=[dt] * 2),
                 dict(name="aten::baddbmm", shapes=[rng.choice([[b, m, n], [1, m, n]]), [b, m, k], [b, k, n], [], []],
                      dtypes=[dt] * 3 + ["Scalar"] * 2)]
    return jobs


# name -> its arguments: "s" a tensor of the full shape, "r" one row of it (broadcast), "s|r" either,
# "s|0" a tensor or a scalar, "0" a scalar or a non-tensor argument
_EW = {"aten::add": ("s", "s|r", "0"), "aten::add_": ("s", "s", "0"), "aten::sub": ("s", "s", "0"),
       "aten::mul": ("s", "s|0"), "aten::mul_": ("s", "0"), "aten::div": ("s", "0"), "aten::div_": ("s", "s"),
       "aten::gelu": ("s", "0"), "aten::gelu_backward": ("s", "s", "0"), "aten::relu": ("s",),
       "aten::threshold_backward": ("s", "s", "0"), "aten::silu": ("s",), "aten::tanh": ("s",),
       "aten::sqrt": ("s",), "aten::lerp_": ("s", "s", "0"), "aten::addcmul_": ("s", "s", "s", "0"),
       "aten::addcdiv_": ("s", "s", "s", "0"), "aten::copy_": ("s", "s", "0"), "aten::native_dropout": ("s", "0", "0")}


def _arg(code: str, shape: list[int], rng: random.Random) -> list[int]:
    code = rng.choice(code.split("|"))
    return {"s": shape, "r": shape[-1:], "0": []}[code]


def elementwise_jobs() -> list[dict]:
    """Each elementwise op on a hidden shape and dtype (a row broadcast where the op allows one), then
    ops that are no tensor work at all (every argument a scalar) or not elementwise (None expected)."""
    rng = _rng(1103)
    jobs = [dict(name="aten::add", shapes=[[1000], [1000], []], dtypes=["float", "float", "Scalar"])]  # public
    for name, codes in _EW.items():
        s = [rng.randint(1, 9), rng.randint(1, 40), rng.randint(1, 200)][rng.randint(0, 2):]
        args = [_arg(code, s, rng) for code in codes]
        dt = _dtype(rng)
        jobs.append(dict(name=name, shapes=args, dtypes=[dt if a else "Scalar" for a in args]))
    none = [dict(name="aten::add", shapes=[[], [], []], dtypes=["Scalar"] * 3),
            dict(name="aten::view", shapes=[[4, 6], []], dtypes=["float", "ScalarList"]),
            dict(name="aten::embedding", shapes=[[50, 8], [2, 7], [], [], []], dtypes=["float", "long int"] + [""] * 3),
            dict(name="aten::cat", shapes=[[], []], dtypes=["TensorList", "Scalar"])]
    return jobs + [dict(j, none=True) for j in none]


def norm_jobs() -> list[dict]:
    """LayerNorm and softmax / log-softmax, forward and backward, as the profiler records their arguments."""
    rng = _rng(1104)
    jobs = [dict(name="aten::native_layer_norm", shapes=[[64, 96], [], [96], [96], []],  # the public case
                 dtypes=["c10::BFloat16", "ScalarList", "c10::BFloat16", "c10::BFloat16", "Scalar"])]
    for _ in range(3):
        lead = [rng.randint(1, 6), rng.randint(1, 70)][rng.randint(0, 1):]
        h, dt = rng.randint(2, 300), _dtype(rng)
        x, stat = lead + [h], lead + [1]
        jobs += [dict(name="aten::native_layer_norm", shapes=[x, [], [h], [h], []],
                      dtypes=[dt, "ScalarList", dt, dt, "Scalar"]),
                 dict(name="aten::native_layer_norm_backward", shapes=[x, x, [], stat, stat, [h], [h], []],
                      dtypes=[dt, dt, "ScalarList", "float", "float", dt, dt, "ScalarList"])]
        for fwd, bwd in (("aten::_softmax", "aten::_softmax_backward_data"),
                         ("aten::_log_softmax", "aten::_log_softmax_backward_data")):
            jobs += [dict(name=fwd, shapes=[x, [], []], dtypes=[dt, "Scalar", "Scalar"]),
                     dict(name=bwd, shapes=[x, x, [], []], dtypes=[dt, dt, "Scalar", "Scalar"])]
    return jobs


def profiles() -> list[dict]:
    """Synthetic profiles (as data): 1-3 steps of outermost ops named and categorised from real traces,
    seconds drawn per op, each phase's wall time the ops' plus a gap, priced kernels with FLOPs."""
    rng = _rng(1105)
    pool = list(FORWARD.items()) + list(BACKWARD.items()) + list(SYSTEM.items())
    out = [public_profile(1), public_profile(3)]
    for _ in range(4):
        steps = rng.randint(1, 3)
        ops, kernels, by_step = [], [], []
        for step in range(steps):
            walls = {}
            for phase in PHASES:
                chosen = [rng.choice(pool) for _ in range(rng.randint(3, 25))]
                row = [dict(name=n, phase=phase, category=c, seconds=rng.uniform(1e-6, 5e-3), step=step)
                       for n, c in chosen]
                ops += row
                kernels += [dict(name=o["name"], phase=phase, category=o["category"], seconds=o["seconds"],
                                 flops=float(rng.randint(10**3, 10**10)), bytes=float(rng.randint(10**3, 10**8)),
                                 step=step) for o in row if rng.random() < 0.6]
                walls[phase] = sum(o["seconds"] for o in row) + rng.uniform(0, 2e-3)
            by_step.append(walls)
        out.append(dict(ops=ops, kernels=kernels, steps=steps, by_step=by_step,
                        phase_seconds={p: sum(w[p] for w in by_step) for p in PHASES},
                        machine=dict(peak_flops=rng.uniform(1e10, 1e15), bandwidth=rng.uniform(1e10, 4e12)),
                        num_params=rng.randint(10**4, 10**10), tokens=rng.randint(16, 10**6)))
    return out


def public_profile(steps: int) -> dict:
    """The public tests' profile: two ops per phase per step, the matmuls priced at 1 GFLOP each."""
    times = {"forward": [("aten::addmm", "matmul", 3e-3), ("aten::gelu", "activation", 1e-3)],
             "backward": [("AddmmBackward0", "matmul", 6e-3), ("GeluBackward0", "activation", 2e-3)],
             "optimizer": [("aten::_foreach_mul_", "optimizer", 1e-3), ("aten::_foreach_add_", "optimizer", 1e-3)]}
    ops = [dict(name=n, phase=p, category=c, seconds=s, step=i) for i in range(steps) for p, row in times.items()
           for n, c, s in row]
    walls = {"forward": 5e-3, "backward": 9e-3, "optimizer": 2e-3}
    return dict(ops=ops, kernels=[dict(o, flops=1e9, bytes=1e6) for o in ops if o["category"] == "matmul"],
                steps=steps, by_step=[dict(walls)] * steps, phase_seconds={p: w * steps for p, w in walls.items()},
                machine=dict(peak_flops=1e12, bandwidth=1e11), num_params=10**6, tokens=1000)


def schedules() -> list[dict]:
    """(θ̄, γ, L) of PLD schedules: the paper's defaults (public), then hidden ones."""
    rng = _rng(1106)
    return [dict(theta_bar=0.5, gamma=0.001, num_layers=12)] + [
        dict(theta_bar=rng.uniform(0.05, 0.95), gamma=10 ** rng.uniform(-4, -1), num_layers=rng.randint(2, 48))
        for _ in range(6)]


def gate_jobs(draws: int = 4000, again: int = 40) -> list[dict]:
    """Keep probabilities to sample `draws` times with seeded generators, 0 and 1 among them, the
    first `again` draws repeated on a new generator with the same seed."""
    rng = _rng(1107)
    jobs = [dict(probs=[1.0, 0.7, 0.3, 0.0], draws=3000, seed=0, again=again)]  # the public case
    for _ in range(2):
        probs = [rng.uniform(0.15, 0.85) for _ in range(rng.randint(3, 6))]
        probs.insert(rng.randint(0, len(probs)), rng.choice([0.0, 1.0]))
        jobs.append(dict(probs=probs, draws=draws, seed=rng.randint(0, 2**31 - 1), again=again))
    return jobs


def gpt_jobs() -> list[dict]:
    """Tiny GPTs with hidden gates and keep probabilities for pld_forward, the all-kept case first."""
    rng = _rng(1108)
    jobs = [dict(cfg=dict(vocab_size=40, block_size=10, n_layer=3, n_head=2, n_embd=16), batch=2, seed=0,
                 batch_seed=1, gates=[True, False, True], probs=[1.0] * 3)]  # the public case
    for i in range(4):
        layers = rng.randint(2, 4)
        cfg = dict(vocab_size=rng.randint(20, 60), block_size=rng.randint(6, 12), n_layer=layers,
                   n_head=rng.choice([1, 2]), n_embd=rng.choice([8, 12, 16]))
        gates = [True] * layers if i == 0 else [rng.random() < 0.5 for _ in range(layers)]
        if i == 1:
            gates[rng.randrange(layers)] = False  # at least one block dropped
            gates[rng.randrange(layers)] = True
        probs = [1.0] * layers if i < 2 else [rng.uniform(0.3, 0.95) for _ in range(layers)]
        seed = rng.randint(0, 10**6)
        jobs.append(dict(cfg=cfg, batch=rng.randint(1, 3), seed=seed, batch_seed=seed + 1, gates=gates, probs=probs))
    return jobs
