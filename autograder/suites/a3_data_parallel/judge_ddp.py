"""a3 tasks 3.2 and 3.3's verdicts: one spawn of P ranks in the worker runs the student's
DataParallel scenario after scenario; here each rank's outputs (final gradients, the allreduces
launched through the callable the probe gave, the times of the grader's own gradient hooks, any
collective outside that callable or use of the c10d store) are judged against one process."""

from __future__ import annotations

import time

from autograder import checks
from autograder.checks import Flagged
from scaletrain.testing import rel_error

from .inputs import Scenario, _cfg, _plan
from .names import (C_HOOKED, C_NOSYNC, C_ONCE, C_OVERLAP, C_SYNC, C_UNUSED, C_UNUSED_HOOKED, DDP_CHECKS, P, PROBE,
                    WAIT_S)

RTOL = 2e-5    # fp32 gradients, a different summation order than one process
# What the library's own code in finish_gradient_synchronization sends besides the buckets: the
# used-parameter map, one allreduce on the group (Replicated._unused_to_none, as torch DDP does)
USED_MAP = {"allreduce": 1}

def _matches(launch, want) -> bool:
    import torch
    data = launch.get("data") if isinstance(launch, dict) else None
    if not isinstance(data, torch.Tensor) or data.shape != want.shape or data.dtype != want.dtype:
        return False
    try:
        checks.assert_close(data, want, rtol=RTOL, what="a launch")
    except AssertionError:
        return False
    return True


def _bucket_launches(sc: Scenario, out: dict, rank: int) -> list[int | None]:
    """For each bucket, the index of the first launched allreduce that carried exactly this rank's
    local gradients of that bucket (None: none did)."""
    import torch
    launches, used, found = out["launches"], set(), []
    for members in sc.buckets:
        want = torch.cat([sc.local[rank][i].reshape(-1) for i in members])
        j = next((j for j, launch in enumerate(launches) if j not in used and _matches(launch, want)), None)
        if j is not None:
            used.add(j)
        found.append(j)
    return found


def _outside(out: dict) -> str:
    calls = out.get("outside") or {}
    return ", ".join(f"{name} ×{n}" for name, n in sorted(calls.items()))


def _through_launches(sc: Scenario, out: dict, rank: int) -> list[int | None]:
    """Every bucket's local gradients went out through an allreduce DataParallel launched."""
    found = _bucket_launches(sc, out, rank)
    missing = [b for b, j in enumerate(found) if j is None]
    if missing:
        extra = f"; collectives outside it: {_outside(out)}" if out.get("outside") else ""
        raise AssertionError(
            f"{sc.what}: {len(missing)} of {len(sc.buckets)} buckets (first: bucket {missing[0]}) never went out "
            f"through the allreduce DataParallel was given with this rank's gradients in them "
            f"({len(out['launches'])} allreduces launched{extra}): launch each bucket's buffer, filled with its "
            "gradients, with bucket.launch(self._allreduce)")
    return found


def _store_used(out: dict) -> None:
    if out.get("store"):
        raise Flagged(f"used the c10d store ({', '.join(sorted(set(map(str, out['store']))))}) inside "
                      "DataParallel: the gradients must travel through the allreduce it is given")


def _compare_grads(sc: Scenario, out: dict) -> None:
    import torch
    grads = out["grads"]
    assert isinstance(grads, list) and len(grads) == len(sc.names), \
        f"{sc.what}: {len(grads) if isinstance(grads, list) else '?'} gradients for {len(sc.names)} parameters"
    for name, g, r in zip(sc.names, grads, sc.ref, strict=True):
        if name in sc.frozen:
            assert g is None, f"{sc.what}: {name} is frozen and got a .grad: it must not be synchronized"
            continue
        if name in sc.unused:
            assert g is None, f"{sc.what}: {name}: no rank used it, so its .grad must stay None (as in torch DDP)"
            continue
        assert g is not None, f"{sc.what}: {name}.grad is None after finish_gradient_synchronization()"
        if isinstance(g, torch.Tensor) and g.shape == r.shape and r.any() and rel_error(g, P * r) <= 1e-4:
            raise AssertionError(f"{sc.what}: {name}.grad is {P}x the mean gradient: the allreduce sums, "
                                 "divide each bucket by dp_world_size")
        checks.assert_close(g, r, rtol=RTOL, what=f"{sc.what}: {name}.grad")


def _judge_sync(sc, out, rank):
    assert out["n_buckets"] == len(sc.buckets), \
        f"suite expected {len(sc.buckets)} buckets, DataParallel made {out['n_buckets']}"
    _compare_grads(sc, out)
    _through_launches(sc, out, rank)


def _judge_once(sc, out, rank):
    n, launched = len(sc.buckets), out["launched_after"][-1]
    assert launched == n, (f"{sc.what}: {launched} allreduces in one step for {n} buckets; "
                           "launch each bucket exactly once")
    found = _through_launches(sc, out, rank)
    assert found == list(range(n)), (f"{sc.what}: the allreduces carried the buckets in the order {found}; "
                                     "launch bucket 0 first, then 1, ...")
    extra = {k: n - USED_MAP.get(k, 0) for k, n in (out.get("outside") or {}).items()}
    assert not any(n > 0 for n in extra.values()), (
        f"{sc.what}: collectives besides the buckets' allreduces ran during the step ({_outside(out)}, one "
        "allreduce of them the used-parameter map finish sends itself); only the allreduce DataParallel is "
        "given may communicate")


def _judge_unused(sc, out, rank):
    _compare_grads(sc, out)
    _through_launches(sc, out, rank)


def _judge_overlap(sc, out, rank):
    n, times = len(sc.buckets), out["grad_times"]
    assert times, f"{sc.what}: the grader's own gradient hooks never ran"
    found = _through_launches(sc, out, rank)
    last = max(times)
    early = sum(1 for j in found if out["launches"][j]["t"] < last)
    dummies = sum(1 for j, launch in enumerate(out["launches"]) if j not in found and launch["t"] < last)
    note = f" ({dummies} allreduces launched earlier carried something else)" if dummies else ""
    assert early >= n - 1, (
        f"{early} of {n} buckets went out before the last gradient of backward arrived; expected {n - 1}: "
        f"launch each bucket from the gradient hook as soon as it is full{note}")


def _judge_hooked(sc, out, rank):
    _compare_grads(sc, out)
    _through_launches(sc, out, rank)


def _judge_no_sync(sc, out, rank):
    n = len(sc.buckets)
    launched, outside = out["launched_after"], out["outside_after"]
    assert launched[2] == 0 and outside[2] == 0, (
        f"{launched[2]} allreduces (and {outside[2]} other collectives) during the 3 micro-steps inside "
        "no_sync(): expected none")
    assert launched[-1] == n, f"{launched[-1]} allreduces in the synchronized step for {n} buckets"
    _compare_grads(sc, out)
    _through_launches(sc, out, rank)


_JUDGES = {C_SYNC: _judge_sync, C_ONCE: _judge_once, C_UNUSED: _judge_unused, C_OVERLAP: _judge_overlap,
           C_HOOKED: _judge_hooked, C_NOSYNC: _judge_no_sync, C_UNUSED_HOOKED: _judge_unused}


def _verdict(name: str, scenarios: list[Scenario], results, rank: int):
    """None (passed) or (exception type name, message) for one check on one rank, the scenarios in
    order: what a scenario raised in the worker, else what its outputs show."""
    try:
        assert isinstance(results, list), f"the ranks sent no outputs for {name!r}"
        assert len(results) <= len(scenarios), (  # fewer: a scenario raised and ended the check (below)
            f"{len(results)} outputs came back for {name!r}, which ran {len(scenarios)} scenarios")
        for i, sc in enumerate(scenarios):
            assert i < len(results) and isinstance(results[i], dict), f"{sc.what}: no outputs came back"
            if "raised" in results[i]:
                kind, message, where = (str(x) for x in results[i]["raised"])
                return kind, f"{message}{where}"
            out = results[i]["ok"]
            _store_used(out)
            _JUDGES[name](sc, out, rank)
    except (AssertionError, Flagged) as exc:
        return type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "assertion failed"
    except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:
        return "AssertionError", f"the outputs that came back are malformed ({type(exc).__name__}: {exc})"
    return None


def group_ddp(ctx):
    import torch

    from scaletrain.models import GPT, make_batch
    start = time.monotonic()
    torch.set_num_threads(1)
    plan = _plan(checks.trial_seeds(1, salt=33)[0])   # every reference, before any student code runs
    cfg, n_params = _cfg(), len(list(GPT(_cfg()).parameters()))
    send = {"world_size": P, "wait_s": WAIT_S, "spawn_timeout_s": 60,
            "checks": [(name, [sc.send for sc in scenarios]) for name, scenarios in plan.items()],
            "preflight": dict(model="gpt", init_seed=0, buckets=[list(reversed(range(n_params)))],
                              cfg=dict(vocab_size=cfg.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer,
                                       n_head=cfg.n_head, n_embd=cfg.n_embd),
                              batch=tuple(make_batch(cfg, 2, seed=0)))}
    failure, per_rank = None, None
    try:
        outputs = ctx.untrusted().call(f"{PROBE}:data_parallel", "dp_data_parallel", send,
                                       timeout_s=max(20.0, ctx.timeout_s - (time.monotonic() - start) - 15))
        if not (isinstance(outputs, list) and len(outputs) == P and all(isinstance(o, dict) for o in outputs)):
            raise AssertionError(f"the ranks' outputs are malformed: {str(outputs)[:80]}")
        per_rank = [{name: _verdict(name, scenarios, outputs[rank].get(name), rank)
                     for name, scenarios in plan.items()} for rank in range(P)]
    except Exception as exc:  # noqa: BLE001 - reported inside every check below
        failure = exc
    ctx.report_ranks(DDP_CHECKS, per_rank, failure)
