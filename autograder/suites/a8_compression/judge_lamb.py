"""a8 task 8.3's verdicts: LAMB (You et al. 2020, Alg. 2) written out here on hidden layers and
settings: the trust ratios, the parameters after every step, and each layer's step size."""

from __future__ import annotations

import random

from autograder import checks
from autograder.suites import sized

from .inputs import _lamb_cases
from .judge import _close
from .names import C_LB_LAYER, C_LB_STEP, C_LB_TRUST, PROBE


def _adam_directions(grads, settings: dict) -> list:
    """m̂ / (√v̂ + ε) per step and layer: Adam's part of LAMB's update, a function of the gradients only."""
    import torch

    (b1, b2), eps, bc = settings["betas"], settings["eps"], settings["bias_correction"]
    ms, vs = [torch.zeros_like(g) for g in grads[0]], [torch.zeros_like(g) for g in grads[0]]
    out = []
    for t, step_grads in enumerate(grads, 1):
        row = []
        for i, g in enumerate(step_grads):
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            m_hat, v_hat = (ms[i] / (1 - b1 ** t), vs[i] / (1 - b2 ** t)) if bc else (ms[i], vs[i])
            row.append(m_hat / (v_hat.sqrt() + eps))
        out.append(row)
    return out


def _trust(x, u, cap) -> tuple[float, bool]:
    """(trust ratio, whether it differs from ‖x‖/‖u‖: clamped, or a zero norm)."""
    w_norm, u_norm = float(x.double().norm()), float(u.double().norm())
    if not (w_norm > 0 and u_norm > 0):
        return 1.0, True
    trust = w_norm / u_norm
    return (min(trust, cap), trust > cap) if cap is not None else (trust, False)


def _lamb_reference(params, grads, settings: dict) -> dict:
    """You et al. 2020, Algorithm 2 with one "layer" per tensor, written out in float32."""
    lr, wd, cap = settings["lr"], settings["weight_decay"], settings["max_trust"]
    xs = [p.clone() for p in params]
    out = {"params": [], "clamped": []}
    for directions in _adam_directions(grads, settings):
        clamped = []
        for i, d in enumerate(directions):
            u = d + wd * xs[i]
            trust, special = _trust(xs[i], u, cap)
            xs[i] = xs[i] - lr * trust * u
            clamped.append(special)
        out["params"].append([x.clone() for x in xs])
        out["clamped"].append(clamped)
    return out


def _lamb_answer(got, params, grads, settings: dict) -> dict:
    """The worker's LAMB run, checked to hold, for every step, one trust ratio and one parameter per
    layer (a LAMB that empties the caller's list leaves nothing to compare: issue 28)."""
    what = f"LAMB({settings})"
    if not isinstance(got, dict):
        raise AssertionError(f"{what}: the probe sent {str(got)[:80]}, not the run")
    for key, item in (("params", "parameter"), ("trust", "state['trust_ratio']")):
        for t, row in enumerate(sized(got.get(key), len(grads), f"{what}: {key}, one row per step")):
            sized(row, len(params), f"{what}, step {t}: one {item} per layer")
    return got


def group_lamb(ctx):
    import torch

    seed = checks.trial_seeds(1, salt=3)[0]
    cases = _lamb_cases(random.Random(seed), seed)
    ctx.untrusted().start()
    runs = []
    for params, grads, settings in cases:
        want = _lamb_reference(params, grads, settings)
        runs.append((want, ctx.untrusted().call(PROBE + "lamb_run", "lamb", params, grads, settings)))
    with ctx.check(C_LB_TRUST):  # step by step from the student's own parameters: the ratio alone is graded
        for (params, grads, settings), (_, got) in zip(cases, runs, strict=True):
            got, before = _lamb_answer(got, params, grads, settings), params
            for t, (directions, trusts) in enumerate(zip(_adam_directions(grads, settings), got["trust"], strict=True)):
                for i, (d, x, a) in enumerate(zip(directions, before, trusts, strict=True)):
                    b, _ = _trust(x, d + settings["weight_decay"] * x, settings["max_trust"])
                    a = float(a) if isinstance(a, (int, float, torch.Tensor)) and not isinstance(a, bool) else a
                    assert isinstance(a, float) and abs(a - b) <= 1e-4 * max(1.0, abs(b)), (
                        f"LAMB({settings}), step {t}, layer {i}: state['trust_ratio'] = {a!r}, expected "
                        f"‖x‖/‖u‖ = {b:.6g} for the parameters before the step")
                before = got["params"][t]
    with ctx.check(C_LB_STEP):
        for (params, grads, settings), (want, got) in zip(cases, runs, strict=True):
            got = _lamb_answer(got, params, grads, settings)
            for t, (xs, ref) in enumerate(zip(got["params"], want["params"], strict=True)):
                for i, (a, b) in enumerate(zip(xs, ref, strict=True)):
                    _close(a, b, what=f"LAMB({settings}), layer {i} after step {t}", rtol=1e-5)
    with ctx.check(C_LB_LAYER):
        for (params, grads, settings), (want, got) in zip(cases, runs, strict=True):
            got, before = _lamb_answer(got, params, grads, settings), params
            for t, xs in enumerate(got["params"]):
                for i, (a, b) in enumerate(zip(xs, before, strict=True)):
                    if want["clamped"][t][i]:
                        continue
                    moved, size = float((a - b).double().norm()), settings["lr"] * float(b.double().norm())
                    assert abs(moved - size) <= 1e-3 * size, (
                        f"LAMB({settings}), layer {i}, step {t}: moved by {moved:.6g}, "
                        f"expected lr·‖x‖ = {size:.6g} "
                        f"(the trust ratio makes each layer's step proportional to its weights)")
                before = xs
