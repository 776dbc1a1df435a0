"""a11's verdicts: the student's categoriser, op costs, step tables and PLD (run in the sandboxed
worker by autograder/probes/a11_profiling.py) against hand-made labels and the closed forms of
reference.py, computed here before any student code runs."""

from __future__ import annotations

import math

from autograder.suites import answers, judge_calls, part, sized

from . import inputs, reference
from .labels import A, ACT, C, E, M, N, O, X
from .names import (C_BREAKDOWN, C_CAT_BWD, C_CAT_FWD, C_CAT_ONE, C_CAT_SYS, C_COUNTED, C_DROP_FREE, C_EW,
                    C_GATES, C_IDENTITY, C_KEEP, C_MFU, C_MM_BYTES, C_MM_FLOPS, C_NORM, C_SCALED, C_THETA, PROBE)

CALL_S = 10  # one probe call: plain Python on small inputs, or tiny GPTs: well under a second
RTOL = 1e-9  # exact counts and sums; floats differ by the order of operations only
CATEGORIES = (M, A, N, ACT, E, O, C, X)


def _close(got, want, what: str, rtol: float = RTOL) -> None:
    from scaletrain.testing import assert_close
    assert_close(got, want, rtol=rtol, what=what)


# ---------------------------------------------------------------- 11.1 categories

def _judge_labels(asked, labels: dict[str, str]) -> None:
    wrong = [f"{name!r}: {got!r}, expected {want!r}"
             for got, (name, want) in answers(asked, list(labels.items()), "categorise answers") if got != want]
    if wrong:
        raise AssertionError(f"categorise: {len(wrong)} of {len(labels)} names in the wrong category, e.g. "
                             + "; ".join(wrong[:4]))


def _judge_one(asked, names: list[str], unknown: set[str]) -> None:
    for got, name in answers(asked, names, "categorise answers"):
        if not isinstance(got, str) or got not in CATEGORIES:
            raise AssertionError(f"categorise({name!r}) = {got!r}: expected one of {CATEGORIES}, a str")
        if name in unknown and got != X:
            raise AssertionError(f"categorise({name!r}) = {got!r}: a name no rule knows is 'other'")


# ---------------------------------------------------------------- 11.2 costs

def _call(job: dict) -> str:
    return f"op_cost({job['name']!r}, {job['shapes']}, {job['dtypes']})"


def _pair(got, job) -> tuple:
    if not isinstance(got, list) or len(got) != 2:
        raise AssertionError(f"{_call(job)} = {got!r}: expected a Cost with .flops and .bytes")
    return tuple(got)


def _judge_matmul(asked, jobs, field: int) -> None:
    for got, job in answers(asked, jobs, "op_cost answers"):
        want = reference.matmul(job)[field]
        _close(_pair(got, job)[field], want, f"{_call(job)}.{('flops', 'bytes')[field]}")


def _per_element(flops, elements: int, job: dict) -> None:
    lo, hi = reference.PER_ELEMENT
    if not isinstance(flops, (int, float)) or isinstance(flops, bool) or not lo <= flops / elements <= hi:
        raise AssertionError(f"{_call(job)}.flops = {flops!r}: expected {lo} to {hi} per element "
                             f"of its {elements:,} elements")


def _judge_elementwise(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "op_cost answers"):
        if job.get("none"):
            if got is not None:
                raise AssertionError(f"{_call(job)} = {got!r}: expected None (no tensor work this model prices)")
            continue
        flops, nbytes = _pair(got, job)
        elements, want = reference.elementwise(job)
        _close(nbytes, want, f"{_call(job)}.bytes")
        _per_element(flops, elements, job)


def _judge_norm(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "op_cost answers"):
        flops, nbytes = _pair(got, job)
        elements, least, most = reference.norm_bytes(job)
        if not isinstance(nbytes, (int, float)) or not least <= nbytes <= most:
            raise AssertionError(f"{_call(job)}.bytes = {nbytes!r}: expected from {least:,} (the row tensors "
                                 f"once) to {most:,} (with the statistics and weights)")
        _per_element(flops, elements, job)


# ---------------------------------------------------------------- 11.3 the step's tables

def _judge_breakdown(asked, profiles) -> None:
    for i, (rows, prof) in enumerate(answers(asked, profiles, "category_seconds answers")):
        want = reference.breakdown(prof)
        if not isinstance(rows, list):
            raise AssertionError(f"category_seconds(profile {i}) = {rows!r}: expected a dict (phase, category) -> s")
        got = {}
        for row in rows:
            if len(row) != 3:
                raise AssertionError(f"category_seconds(profile {i}): key {row[:-1]!r} is not a (phase, category) pair")
            got[(row[0], row[1])] = row[2]
        for key in sorted(set(got) | set(want), key=repr):  # a student's key may be (str, None): no TypeError
            _close(got.get(key, 0.0), want.get(key, 0.0),
                   f"category_seconds(profile {i} of {prof['steps']} steps)[{key}]")


def _judge_mfu(asked, profiles, keys) -> None:
    for i, (got, prof) in enumerate(answers(asked, profiles, "step_mfu answers")):
        want = reference.mfu(prof)
        if not isinstance(got, dict):
            raise AssertionError(f"step_mfu(profile {i}) = {got!r}: expected a dict")
        for key in keys:
            if key not in got:
                raise AssertionError(f"step_mfu(profile {i}) has no key {key!r}")
            _close(got[key], want[key], f"step_mfu(profile {i} of {prof['steps']} steps, N={prof['num_params']:,}, "
                                        f"T={prof['tokens']:,})[{key!r}]")


def group_analysis(ctx):
    """Tasks 11.1-11.3: categories of real op names, FLOPs and bytes from recorded shapes, time by
    (phase, category) and MFU of hidden profiles (one worker call each: a hang costs its task only)."""
    labels = {kind: inputs.labelled(kind) for kind in ("forward", "backward", "system")}
    unknown = inputs.unknown_names()
    every = [n for table in labels.values() for n in table] + unknown
    mm, ew, norm, profiles = inputs.matmul_jobs(), inputs.elementwise_jobs(), inputs.norm_jobs(), inputs.profiles()
    fwd, bwd, sys_ = (len(labels[k]) for k in ("forward", "backward", "system"))
    judge_calls(ctx, PROBE, {"categorise": every, "costs": mm + ew + norm, "breakdown": profiles, "mfu": profiles}, {
        C_CAT_FWD: lambda a: _judge_labels(part(a["categorise"], 0, fwd), labels["forward"]),
        C_CAT_BWD: lambda a: _judge_labels(part(a["categorise"], fwd, fwd + bwd), labels["backward"]),
        C_CAT_SYS: lambda a: _judge_labels(part(a["categorise"], fwd + bwd, fwd + bwd + sys_), labels["system"]),
        C_CAT_ONE: lambda a: _judge_one(a["categorise"], every, set(unknown)),
        C_MM_FLOPS: lambda a: _judge_matmul(part(a["costs"], 0, len(mm)), mm, 0),
        C_MM_BYTES: lambda a: _judge_matmul(part(a["costs"], 0, len(mm)), mm, 1),
        C_EW: lambda a: _judge_elementwise(part(a["costs"], len(mm), len(mm) + len(ew)), ew),
        C_NORM: lambda a: _judge_norm(part(a["costs"], len(mm) + len(ew), None), norm),
        C_BREAKDOWN: lambda a: _judge_breakdown(a["breakdown"], profiles),
        C_MFU: lambda a: _judge_mfu(a["mfu"], profiles, ("step ms", "model GFLOP (6NT)", "MFU %")),
        C_COUNTED: lambda a: _judge_mfu(a["mfu"], profiles, ("counted GFLOP", "counted / peak %")),
    }, CALL_S)


# ---------------------------------------------------------------- 11.4 progressive layer dropping

def _ts(job: dict) -> list[int]:
    """Steps from 0 through the decay (1/γ) to where θ is θ̄ within e^-40."""
    scale = 1 / job["gamma"]
    public = (0, 10, 100, 700, 1000, 10_000, 100_000)  # the public tests' steps
    return sorted({1, 2, *public, *(int(f * scale) for f in (0.1, 0.5, 1, 1.7, 3, 10, 40))})


def _judge_theta(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "theta answers"):
        where = f"theta(t, theta_bar={job['theta_bar']:.4g}, gamma={job['gamma']:.4g})"
        values = sized(got["theta"], len(job["ts"]), where)
        _close(values[0], 1.0, f"{where} at t = 0 (nothing dropped at the start)")
        for (t0, v0), (t1, v1) in zip(zip(job["ts"], values), zip(job["ts"][1:], values[1:])):
            if not v1 <= v0 + 1e-12:
                raise AssertionError(f"{where}: θ({t1}) = {v1} > θ({t0}) = {v0}: the schedule must not increase")
        for t, v in zip(job["ts"], values):
            _close(v, reference.theta(t, job["theta_bar"], job["gamma"]),
                   f"{where} at t = {t} (the decay towards θ̄ at rate γ, Zhang & He §4)")


def _judge_keep(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "keep_probabilities answers"):
        big_l = job["num_layers"]
        for t, th, p in zip(job["ts"], got["theta"], got["keep"]):
            where = f"keep_probabilities({t}, {big_l}, theta_bar={job['theta_bar']:.4g}, gamma={job['gamma']:.4g})"
            p = sized(p, big_l, where)
            if not all(isinstance(x, (int, float)) and th - 1e-12 <= x <= 1 + 1e-12 for x in p):
                raise AssertionError(f"{where} = {p}: each must lie in [θ(t), 1] = [{th}, 1]")
            if any(b > a + 1e-12 for a, b in zip(p, p[1:])):
                raise AssertionError(f"{where} = {p}: a deeper layer must not keep more than a shallower one")
            _close(p[-1], th, f"{where}[-1] (the deepest layer keeps with θ(t))", rtol=1e-9)
            for i in range(big_l):
                _close(p[i], 1 - (i + 1) / big_l * (1 - th),
                       f"{where}[{i}] (equal steps of (1 − θ)/L from 1 above the first layer)", rtol=1e-9)
            _close(sum(p), big_l - (big_l + 1) * (1 - th) / 2, f"{where}: expected kept layers Σ p_i", rtol=1e-9)


def _gate_rows(got, job):
    if not hasattr(got, "double"):
        raise AssertionError(f"sample_gates({job['probs']}) returned {got}: expected a list of bools, one per layer")
    return got


def _judge_gates(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "sample_gates answers"):
        g, again = _gate_rows(got["gates"], job), _gate_rows(got["again"], job)
        if not again.equal(g[:len(again)]):
            raise AssertionError(f"sample_gates({[round(q, 3) for q in job['probs']]}): a new generator with the "
                                 f"same seed gave other gates in its first {len(again)} draws: the draws must "
                                 f"come from the generator given")
        g, n, probs = g.double(), job["draws"], job["probs"]
        freq = g.mean(0).tolist()
        for i, (f, p) in enumerate(zip(freq, probs)):
            if abs(f - p) > 5 * math.sqrt(p * (1 - p) / n):
                raise AssertionError(f"sample_gates({[round(q, 3) for q in probs]}): layer {i} kept in {f:.4f} of {n} "
                                     f"draws, p = {p:.4f} (bound ±{5 * math.sqrt(p * (1 - p) / n):.4f})")
        for i in range(len(probs)):
            for j in range(i + 1, len(probs)):
                q = probs[i] * probs[j]
                both = float((g[:, i] * g[:, j]).mean())
                if abs(both - q) > 5 * math.sqrt(q * (1 - q) / n):
                    raise AssertionError(f"sample_gates: layers {i} and {j} both kept in {both:.4f} of {n} draws, "
                                         f"p_i·p_j = {q:.4f}: each layer's gate must be its own draw")


def _judge_forward(asked, jobs, which, want_fn, what: str) -> None:
    for got, job in answers(asked, jobs, "pld_forward answers"):
        if job in which:
            _close(got["logits"], want_fn(job), f"pld_forward(gates={job['gates']}, "
                                                f"probs={[round(p, 3) for p in job['probs']]}).logits: {what}",
                   rtol=1e-5)


def _judge_identity(asked, jobs, which, want_fn) -> None:
    for got, job in answers(asked, jobs, "pld_forward answers"):
        if got["unchanged"] is not True:
            raise AssertionError(f"pld_forward(gates={job['gates']}) changed the model (which blocks it holds, or "
                                 f"their parameters): the next step would train another model")
    _judge_forward(asked, jobs, which, want_fn, "dropped blocks skipped, as the model without them")


def _judge_free(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "pld_forward answers"):
        grads = sized(got["grads"], len(job["gates"]), "blocks with gradients")
        reads = sized(got["reads"], len(job["gates"]), "ops reading each block's parameters")
        for i, (keep, grad, n) in enumerate(zip(job["gates"], grads, reads)):
            if keep and grad is not True:
                raise AssertionError(f"pld_forward(gates={job['gates']}): kept block {i} got no gradient")
            if not keep and n:
                raise AssertionError(f"pld_forward(gates={job['gates']}): {n} ops read dropped block {i}'s "
                                     f"parameters (forward and backward): a dropped block must run nothing, "
                                     f"not run and then be discarded")
            if not keep and grad is not None:
                raise AssertionError(f"pld_forward(gates={job['gates']}): dropped block {i} took part in the step "
                                     f"(its parameters got {'zero ' if grad is False else ''}gradients): a dropped "
                                     f"block must run nothing")


def group_pld(ctx):
    """Task 11.4: the schedule θ(t), p_i(t), the gates and a forward with blocks dropped."""
    import torch
    torch.set_num_threads(1)
    schedules = [dict(job, ts=_ts(job)) for job in inputs.schedules()]
    draws, gpts = inputs.gate_jobs(), inputs.gpt_jobs()
    identity = [j for j in gpts if all(p == 1.0 for p in j["probs"])]
    scaled = [j for j in gpts if j not in identity]
    short = {id(j): reference.shortened_logits(j) for j in identity}  # before any student code runs
    full = {id(j): reference.pld_logits(j) for j in scaled}
    judge_calls(ctx, PROBE, {"schedule": schedules, "gates": draws, "forward": gpts}, {
        C_THETA: lambda a: _judge_theta(a["schedule"], schedules),
        C_KEEP: lambda a: _judge_keep(a["schedule"], schedules),
        C_GATES: lambda a: _judge_gates(a["gates"], draws),
        C_IDENTITY: lambda a: _judge_identity(a["forward"], gpts, identity, lambda j: short[id(j)]),
        C_SCALED: lambda a: _judge_forward(a["forward"], gpts, scaled, lambda j: full[id(j)],
                                           "each kept block's branches divided by its p"),
        C_DROP_FREE: lambda a: _judge_free(a["forward"], gpts),
    }, CALL_S)
