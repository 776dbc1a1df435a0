"""a12's task 12.4: the student's group-wise quantization against bounds read off the weights.

Whatever the rounding and the zero point's convention, a uniform b-bit grid with one (S, Z) per
group of consecutive elements, calibrated min-max, reconstructs every element within half a step,
and the step is no coarser than the group's range over the grid's steps (seminar §2.1; Q-BERT's
group-wise quantization, Shen et al. 2020 §3.2). r̂ = (q - Z)·S is recomputed here from the codes,
scales and zero points that came back, so a dequantize that returns stored floats earns nothing."""

from __future__ import annotations

from autograder import checks
from autograder.suites import answers, judge_calls, part

from . import inputs, reference
from .judge import CALL_S, close
from .names import C_Q_ERROR, C_Q_GROUPS, C_Q_MODEL, PROBE

LOSS_RTOL = 5e-3  # int8 in groups of 16 moves the hidden GPT's loss by 1e-4 to 1.2e-3 relative (20 seeds)


def _tensor(got, dtype, shape, what: str):
    import torch
    if not isinstance(got, torch.Tensor) or got.dtype != dtype or tuple(got.shape) != tuple(shape):
        raise AssertionError(f"{what}: expected {dtype} of shape {tuple(shape)}, got "
                             f"{getattr(got, 'dtype', type(got).__name__)} {tuple(getattr(got, 'shape', ()))}")
    return got


def _judge_one(got, job) -> None:
    import torch
    w, spec = job["w"], job["spec"]
    where, g = f"quantize({job['name']})", reference.group_size(job)
    if got["group_size"] != g:
        raise AssertionError(f"{where}: group_size {got['group_size']!r}, expected {g}")
    n = w.numel() // g
    q = _tensor(got["q"], torch.int8, w.shape, f"{where}: codes")
    scale = _tensor(got["scale"], w.dtype, (n,), f"{where}: scales (one per group)").double()
    zero = _tensor(got["zero"], w.dtype, (n,), f"{where}: zero points (one per group)").double()
    alpha, beta, steps, (qmin, qmax) = reference.quant_bounds(job, g)
    if int(q.min()) < qmin or int(q.max()) > qmax:
        raise AssertionError(f"{where}: codes span [{int(q.min())}, {int(q.max())}], outside [{qmin}, {qmax}]")
    if not bool((scale > 0).all() and scale.isfinite().all()) or not torch.equal(zero, zero.round()):
        raise AssertionError(f"{where}: scales must be finite and > 0, zero points integers: S {scale.tolist()[:6]}, "
                             f"Z {zero.tolist()[:6]}")
    if spec.get("symmetric", True) and bool(zero.any()):
        raise AssertionError(f"{where}: symmetric quantization has Z = 0, got {zero.tolist()[:6]}")
    deq = (q.double().reshape(n, g) - zero[:, None]) * scale[:, None]
    err = (w.double().reshape(n, g) - deq).abs().amax(1)
    slack = 1e-5 * scale + 8 * torch.finfo(w.dtype).eps * w.double().reshape(n, g).abs().amax(1)
    worst = int((err - scale / 2 - slack).argmax())
    if bool((err > scale / 2 + slack).any()):
        raise AssertionError(f"{where}: group {worst} errs by {float(err[worst]):.4g} > S/2 = "
                             f"{float(scale[worst]) / 2:.4g}: a value rounds to a code that is not its nearest")
    finest = (beta - alpha) / (2 * steps)
    worst = int((err - finest - slack).argmax())
    if bool((err > finest + slack).any()):
        raise AssertionError(f"{where}: group {worst} errs by {float(err[worst]):.4g}, more than its range "
                             f"[{float(alpha[worst]):.4g}, {float(beta[worst]):.4g}] over 2·{steps} steps "
                             f"({float(finest[worst]):.4g}): the grid is coarser than the group's own range allows")
    close(got["deq"], deq.reshape(w.shape).to(w.dtype), f"{where}: dequantize, (q - Z)·S")
    close(got["w_after"], w, f"{where}: the weight afterwards (must not change)")


def _judge_quant(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "quantize answers"):
        _judge_one(got, job)


def _judge_model(asked, jobs, losses) -> None:
    for (got, job), want in zip(answers(asked, jobs, "quantized model answers"), losses):
        if not isinstance(got, float) or abs(got - want) > LOSS_RTOL * want:
            raise AssertionError(f"{job['name']}: loss {got!r} with your int8 weights, {want:.6f} in fp32: "
                                 f"more than {LOSS_RTOL:.0e} apart")


def group_quant(ctx):
    """Task 12.4: codes, scales and zero points on hidden weights; the quantized GPT's loss."""
    import torch
    torch.set_num_threads(1)
    seed = checks.trial_seeds(1, salt=1214)[0]
    (eight, edges), models = inputs.quant_jobs(seed), inputs.quant_model_jobs(seed)
    losses = [reference.loss(j) for j in models]
    judge_calls(ctx, PROBE, {"quant": eight + edges, "quant_model": models}, {
        C_Q_ERROR: lambda a: _judge_quant(part(a["quant"], 0, len(eight)), eight),
        C_Q_GROUPS: lambda a: _judge_quant(part(a["quant"], len(eight), None), edges),
        C_Q_MODEL: lambda a: _judge_model(a["quant_model"], models, losses),
    }, CALL_S)
