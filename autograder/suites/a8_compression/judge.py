"""What a8's three verdicts share: the ring's bytes, the compressors' run on P ranks and its
answers per case, the inputs-unmodified check, and the accumulated bias."""

from __future__ import annotations

import functools
import math

from autograder import checks
from autograder.suites import sized

from .names import P, PROBE, RTOL, SPAWN_S


def _ring_bytes(numel: int, p: int) -> int:
    """Bytes one rank sends in a ring allreduce of `numel` fp32 elements: 2(p − 1)·⌈n/p⌉·4."""
    return 2 * (p - 1) * math.ceil(numel / p) * 4


# float32 ranks against a float64 reference: compared in float64, whatever float a compressor returns
_close = functools.partial(checks.assert_tensor_close, rtol=RTOL, compare_in="float64")


def _run(ctx, cases: list[dict]) -> list[list[dict]]:
    """The probe on P ranks: per case, per rank, {"ok": {"steps": [...]}} or {"raised": [...]}; an
    answer not shaped so (P ranks, one entry per case) is every case's failure, reported by `_steps`."""
    answers = ctx.untrusted().call(PROBE + "compressor_run", cases[0]["stem"],
                                   {"world_size": P, "timeout_s": SPAWN_S, "cases": cases})
    try:
        ranks = [sized(a, len(cases), f"rank {r}'s answers, one per case")
                 for r, a in enumerate(sized(answers, P, "the ranks' answers"))]
    except AssertionError as exc:
        return [[{"raised": ("AssertionError", str(exc))}] * P for _ in cases]
    return [[ranks[rank][i] for rank in range(P)] for i in range(len(cases))]


def _steps(per_rank: list[dict], case: dict, label: str) -> list[list[dict]]:
    """Per rank, the case's steps, one per step the case runs; the student's exception, rebuilt, if
    a rank raised one."""
    from autograder.checks import Flagged

    for rank, answer in enumerate(per_rank):
        if "raised" in answer:
            kind, message = answer["raised"]
            exc = {"NotImplementedError": NotImplementedError, "AssertionError": AssertionError,
                   "Flagged": Flagged}.get(kind)
            text = f"{label}, rank {rank}: {message}"
            raise exc(text) if exc else RuntimeError(f"{kind}: {text}")
    return [sized(answer["ok"]["steps"], len(case["steps"]), f"{label}, rank {rank}: steps")
            for rank, answer in enumerate(per_rank)]


def _unmodified(steps, label: str) -> None:
    for rank, rank_steps in enumerate(steps):
        if any(s["modified"] for s in rank_steps):
            raise AssertionError(f"{label}, rank {rank}: the bucket's gradient `flat` was modified in place; "
                                 "work on a copy")


def _bias(outs, grads) -> float:
    """‖Σ_t (output_t − mean_w g_w,t)‖."""
    import torch

    acc = sum(o.double() - torch.stack(g).double().mean(0) for o, g in zip(outs, grads, strict=True))
    return float(torch.linalg.vector_norm(acc))


def _check_bias(got: float, ef: float, no_ef: float, label: str) -> None:
    if not no_ef > 4 * ef:  # the hidden case must tell the two apart; a suite bug otherwise
        raise RuntimeError(f"suite bug: {label}: with feedback {ef:.3g}, without {no_ef:.3g}")
    assert got <= 2 * ef + 1e-6, (
        f"{label}: ‖Σ_t (output_t − mean gradient_t)‖ = {got:.4g} after 30 steps; with error feedback it stays "
        f"at the error memory's size ({ef:.4g} in the reference), without feedback it grows ({no_ef:.4g})")
