"""a8 task 8.1's verdicts: a single-process float64 simulation of all P ranks (torch.linalg.qr as the
orthogonalization: the output does not depend on the basis), judged by property."""

from __future__ import annotations

import math
import random

from autograder import checks

from .inputs import _drift_grads, _layouts, _ps_case
from .judge import _bias, _check_bias, _close, _ring_bytes, _run, _steps, _unmodified
from .names import C_PS_BIAS, C_PS_EF, C_PS_MEM, C_PS_STEP, C_PS_WIRE, P


def _orth(a):
    import torch

    q, r = torch.linalg.qr(a)
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


def _powersgd_reference(case: dict, error_feedback: bool = True) -> list:
    """Single-process simulation of all P ranks in float64: per step (output, [e_w per rank] or None)."""
    import torch

    from scaletrain.compression.powersgd import should_compress

    r_max, errors, qmem, result = case["rank"], {}, {}, []
    for index, qs in case["q0"].items():
        qmem[int(index)] = [q.double() for q in qs]
    for step in case["steps"]:
        index, shapes = step["index"], step["shapes"]
        xs = [g.double() for g in step["grads"]]
        if error_feedback and index in errors:
            xs = [x + e for x, e in zip(xs, errors[index])]
        out, new_qs, o, k = torch.empty_like(xs[0]), [], 0, 0
        for shape in shapes:
            numel = math.prod(shape)
            n = shape[0]
            m = numel // n
            r = min(n, m, r_max)
            if len(shape) > 1 and should_compress(n, m, r):
                ms = [x[o:o + numel].view(n, m) for x in xs]
                p_hat = _orth(sum(mat @ qmem[index][k] for mat in ms))
                q = sum(mat.t() @ p_hat for mat in ms) / P
                out[o:o + numel] = (p_hat @ q.t()).reshape(-1)
                new_qs.append(q)
                k += 1
            else:
                out[o:o + numel] = sum(x[o:o + numel] for x in xs) / P
            o += numel
        qmem[index] = new_qs
        if error_feedback:
            errors[index] = [x - out for x in xs]
        result.append((out, errors.get(index)))
    return result


def group_powersgd(ctx):
    from scaletrain.compression.powersgd import powersgd_payloads

    seed = checks.trial_seeds(1, salt=1)[0]
    rng = random.Random(seed)
    layouts = _layouts(rng)
    one_step = [_ps_case(shapes, r, 1, seed + i) for i, (shapes, r) in enumerate(layouts)]
    multi = [_ps_case(shapes, r, 6, seed + 10 + i, buckets=(0, 3)) for i, (shapes, r) in enumerate(layouts)]
    bias_shapes = [(rng.randint(20, 26), rng.randint(14, 18)), (6,)]
    drift = _drift_grads(bias_shapes, 30, seed + 20, scale=0.1)
    bias = _ps_case(bias_shapes, 1, 30, seed + 21, grads=drift)
    answers = _run(ctx, one_step + multi + [bias])

    with ctx.check(C_PS_STEP):
        for case, per_rank in zip(one_step, answers[:len(one_step)], strict=True):
            label = f"PowerSGD(rank={case['rank']}) on a bucket of {case['steps'][0]['shapes']}"
            steps = _steps(per_rank, case, label)
            _unmodified(steps, label)
            (want, _), = _powersgd_reference(case)
            for rank, rank_steps in enumerate(steps):
                _close(rank_steps[0]["out"], want, what=f"{label}: rank {rank}'s output")
    with ctx.check(C_PS_EF):
        for case, per_rank in zip(multi, answers[len(one_step):-1], strict=True):
            label = f"PowerSGD(rank={case['rank']}), buckets 0 and 3 alternately"
            steps = _steps(per_rank, case, label)
            for t, (want, errors) in enumerate(_powersgd_reference(case)):
                for rank in range(P):
                    got = steps[rank][t]
                    where = f"{label}, step {t} (bucket {case['steps'][t]['index']}), rank {rank}"
                    _close(got["out"], want, what=f"{where}: the output")
    with ctx.check(C_PS_MEM):  # any memory whose mean over the ranks is what the output lost
        for case, per_rank in zip(multi, answers[len(one_step):-1], strict=True):
            label = f"PowerSGD(rank={case['rank']}), buckets 0 and 3 alternately"
            steps = _steps(per_rank, case, label)
            for t, (_, errors) in enumerate(_powersgd_reference(case)):
                where = f"{label}, step {t} (bucket {case['steps'][t]['index']})"
                if any(steps[rank][t]["error"] is None for rank in range(P)):
                    raise AssertionError(f"{where}: no error memory in errors[{case['steps'][t]['index']}]")
                _close(sum(steps[rank][t]["error"].double() for rank in range(P)) / P, sum(errors) / P,
                       what=f"{where}: the mean of the ranks' error memories (the mean input minus the output)")
    with ctx.check(C_PS_BIAS):
        label = f"PowerSGD(rank=1) on {bias_shapes}, a gradient with a fixed part"
        steps = _steps(answers[-1], bias, label)
        outs = [s["out"] for s in steps[0]]
        ef = _bias([o for o, _ in _powersgd_reference(bias)], drift)
        no_ef = _bias([o for o, _ in _powersgd_reference(bias, error_feedback=False)], drift)
        _check_bias(_bias(outs, drift), ef, no_ef, label)
    with ctx.check(C_PS_WIRE):
        for case, per_rank in zip(one_step + multi, answers[:-1], strict=True):
            label = f"PowerSGD(rank={case['rank']})"
            steps = _steps(per_rank, case, label)
            for t, step in enumerate(case["steps"]):
                want = powersgd_payloads([tuple(s) for s in step["shapes"]], case["rank"])
                for rank in range(P):
                    got = steps[rank][t]
                    assert got["messages"] == want, (
                        f"{label} on {step['shapes']}, rank {rank}: allreduces of {got['messages']} elements, expected "
                        f"{want} (the uncompressed tensors, all P's, all Q's, one message each)")
                    expected = sum(_ring_bytes(k, P) for k in want)
                    assert got["bytes"] == expected, (
                        f"{label} on {step['shapes']}, rank {rank}: sent {got['bytes']} B, the ring allreduces of "
                        f"{want} elements send {expected} B: all traffic goes through self.allreduce")
