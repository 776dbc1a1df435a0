"""a8 task 8.2's verdicts: the codec against the formula, each step's output and error memory from
the rank's previous memory, the bytes, and the accumulated bias."""

from __future__ import annotations

import math
import random

from autograder import checks
from autograder.suites import paired

from .inputs import _codec_cases, _drift_grads, _ob_case
from .judge import _bias, _check_bias, _close, _run, _steps, _unmodified
from .names import C_OB_BIAS, C_OB_CODEC, C_OB_MEM, C_OB_STEP, C_OB_WIRE, P, PROBE


def _onebit_reference(x, chunk: int | None):
    """(scales, C(x)) in float64: one scale per chunk, the mean |x| over the chunk's own elements."""
    import torch

    n = x.numel()
    k = 1 if not chunk else max(1, math.ceil(n / chunk))
    c = math.ceil(n / k)
    scales = torch.stack([x[j * c:(j + 1) * c].double().abs().mean() for j in range(k)])
    signs = torch.where(x >= 0, 1.0, -1.0).double()
    return scales, signs * scales.repeat_interleave(c)[:n]


def _onebit_bytes(n: int, chunk: int | None) -> int:
    k = 1 if not chunk else max(1, math.ceil(n / chunk))
    return (P - 1) * 4 * (math.ceil(n / 32) + k)


def _walk(stepped: list[dict], answers: list):
    """Per case, step and rank: (where, the rank's answer, its x = g + e in float32 from its own
    previous memory, its C(x), every rank's C(x)); a missing memory is replaced by the reference's,
    so the output of each step is judged on its own."""
    import torch

    for case, per_rank in zip(stepped, answers, strict=True):
        label = f"OneBitEF(chunk_numel={case['chunk_numel']}) on {case['steps'][0]['shapes'][0][0]} elements"
        steps = _steps(per_rank, case, label)
        _unmodified(steps, label)
        previous = [torch.zeros_like(g) for g in case["steps"][0]["grads"]]
        for t, step in enumerate(case["steps"]):
            xs = [g + e for g, e in zip(step["grads"], previous)]  # float32: the student's own addition
            cs = [_onebit_reference(x, case["chunk_numel"])[1] for x in xs]
            for rank in range(P):
                yield f"{label}, step {t}, rank {rank}", steps[rank][t], xs[rank], cs[rank], cs
            previous = [(s[t]["error"] if s[t]["error"] is not None else x.double() - c).float()
                        for s, x, c in zip(steps, xs, cs)]


def _onebit_simulation(case: dict, error_feedback: bool) -> list:
    """Outputs of all ranks in float64, for the bias reference."""
    import torch

    errors, outs = [torch.zeros_like(g, dtype=torch.float64) for g in case["steps"][0]["grads"]], []
    for step in case["steps"]:
        xs = [g.double() + (e if error_feedback else 0) for g, e in zip(step["grads"], errors)]
        cs = [_onebit_reference(x, case["chunk_numel"])[1] for x in xs]
        errors = [x - c for x, c in zip(xs, cs)]
        outs.append(sum(cs) / P)
    return outs


def group_onebit(ctx):
    import torch

    seed = checks.trial_seeds(1, salt=2)[0]
    rng = random.Random(seed)
    ctx.untrusted().start()
    with ctx.check(C_OB_CODEC):
        cases = _codec_cases(rng, seed)
        answers = ctx.untrusted().call(PROBE + "onebit_codec", "onebit", cases)
        from scaletrain.compression.onebit import pack_signs  # the given wire format

        for got, (x, chunk) in paired(answers, cases, "onebit_codec: the answers, one per (x, chunk_numel) case"):
            label = f"OneBitEF(chunk_numel={chunk}) on {x.numel()} elements"
            if "raised" in got:
                kind, message = got["raised"]
                raise (NotImplementedError if kind == "NotImplementedError" else RuntimeError)(
                    f"{label}: {kind}: {message}")
            scales, decoded = _onebit_reference(x, chunk)
            if not isinstance(got["words"], torch.Tensor) or not torch.equal(got["words"], pack_signs(x)):
                raise AssertionError(f"{label}: the sign words are not pack_signs(x) "
                                     "(bit j of word i: x[32i + j] >= 0)")
            _close(got["scales"], scales, what=f"{label}: the scales (mean |x| of each chunk)", rtol=1e-5)
            _close(got["decoded"], decoded, what=f"{label}: decompress(compress(x))", rtol=1e-5)
    sizes = [(rng.randint(70, 140), None), (rng.randint(300, 500), rng.randint(40, 90)), (101, 60)]  # the public's last
    stepped = [_ob_case(n, chunk, 5, seed + i) for i, (n, chunk) in enumerate(sizes)]
    n_bias = rng.randint(150, 250)
    drift = _drift_grads([(n_bias,)], 30, seed + 20, scale=0.1)
    bias = _ob_case(n_bias, None, 30, seed + 21, grads=drift)
    answers = _run(ctx, stepped + [bias])
    with ctx.check(C_OB_STEP):
        for where, got, _, _, cs in _walk(stepped, answers[:-1]):
            _close(got["out"], sum(cs) / P, what=f"{where}: the output (mean of the ranks' C(g + e))", rtol=1e-5)
    with ctx.check(C_OB_MEM):
        for where, got, x, c, _ in _walk(stepped, answers[:-1]):
            if got["error"] is None:
                raise AssertionError(f"{where}: no error memory kept")
            _close(got["error"], x.double() - c, what=f"{where}: the error memory e = x − C(x)", rtol=1e-5)
    with ctx.check(C_OB_BIAS):
        label = f"OneBitEF on {n_bias} elements, a gradient with a fixed part"
        steps = _steps(answers[-1], bias, label)
        ef, no_ef = (_bias(_onebit_simulation(bias, flag), drift) for flag in (True, False))
        _check_bias(_bias([s["out"] for s in steps[0]], drift), ef, no_ef, label)
    with ctx.check(C_OB_WIRE):
        for case, per_rank in zip(stepped + [bias], answers, strict=True):
            n, chunk = case["steps"][0]["shapes"][0][0], case["chunk_numel"]
            steps = _steps(per_rank, case, f"OneBitEF(chunk_numel={chunk})")
            for rank in range(P):
                for t, got in enumerate(steps[rank]):
                    assert got["bytes"] == _onebit_bytes(n, chunk), (
                        f"OneBitEF(chunk_numel={chunk}) on {n} elements, step {t}, rank {rank}: sent {got['bytes']} B, "
                        f"expected (p − 1)·4·(⌈n/32⌉ + chunks) = {_onebit_bytes(n, chunk)} B")
