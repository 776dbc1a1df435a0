"""a10's verdicts in one process: the student's router, loss, capacity, grouping, dispatch/combine and
the MoE layer built on them (run in the sandboxed worker by autograder/probes/a10_moe.py) against
the token-by-token references of reference.py, computed here before any student code runs."""

from __future__ import annotations

from autograder import checks
from autograder.suites import answers, judge_calls, part, sized

from . import inputs, reference
from .names import (C_CAP, C_DISPATCH, C_GROUP, C_KEEP, C_LAYER, C_LB, C_LB_BOUNDS, C_LB_GRAD, C_TOPK, C_TOPK_GRAD,
                    PROBE)

CALL_S = 30  # one probe call: a handful of small tensors, well under a second


def close(got, want, what: str, rtol: float | None = None, atol: float = 0.0) -> None:
    """Scale-aware comparison (scaletrain.testing) after checking that a tensor came back."""
    import torch
    from scaletrain.testing import assert_close
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: expected a tensor of shape {tuple(want.shape)}, got {str(got)[:80]}")
    assert_close(got, want.to(got.dtype) if got.dtype.is_floating_point else want, rtol=rtol, atol=atol, what=what)


def equal(got, want, what: str) -> None:
    """Exact equality of integer or boolean tensors, shape and dtype included."""
    import torch
    if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        shown = f"{got.dtype} {tuple(got.shape)}" if isinstance(got, torch.Tensor) else str(got)[:60]
        raise AssertionError(f"{what}: expected {want.dtype} of shape {tuple(want.shape)}, got {shown}")
    if not torch.equal(got, want):
        raise AssertionError(f"{what}: {got.tolist()} != expected {want.tolist()}"[:600])


def _skipped(got: dict, where: str) -> None:
    if got.get("skipped"):
        raise AssertionError(f"{where}: {got['skipped']}")


def _judge_route(asked, jobs, refs, grad: bool) -> None:
    import torch
    for (got, job), ref in zip(answers(asked, jobs, "top_k_routing answers"), refs):
        where = f"top_k_routing({job['name']})"
        close(got["logits_after"], job["logits"], f"{where}: the logits afterwards (inputs must not change)")
        if not grad:
            close(got["probs"], ref["probs"], f"{where}: probs (the softmax over experts)")
            equal(got["experts"], ref["experts"], f"{where}: experts (each token's k best, best first)")
            close(got["gates"], ref["gates"], f"{where}: gates")
        else:
            _skipped(got, f"{where}, gates")
            # atol: with k = 1 and normalize=True the gates are p/p, whose gradient is 0 up to rounding noise
            close(got["grad"], ref["grad"], f"{where}: gradient of Σ w·gates with respect to the logits",
                  atol=1e-6 if job["logits"].dtype == torch.float32 else 1e-12)


def _judge_balance(asked, jobs, refs, grad: bool) -> None:
    import torch
    for (got, job), ref in zip(answers(asked, jobs, "load_balancing_loss answers"), refs):
        where = f"load_balancing_loss({job['name']})"
        equal(got["experts_after"], job["experts"], f"{where}: experts afterwards (inputs must not change)")
        if not grad:
            close(got["loss"], torch.tensor([ref["loss"]], dtype=torch.float64), f"{where}: loss")
        else:
            close(got["grad"] if got["grad"] is not None else "no gradient reached probs", ref["grad"],
                  f"{where}: gradient with respect to probs")


def _judge_bounds(asked, jobs) -> None:
    import torch
    for got, job in answers(asked, jobs, "load_balancing_loss answers"):
        close(got["loss"], torch.tensor([job["want"]], dtype=torch.float64),
              f"load_balancing_loss({job['name']}): the loss (Switch §2.2: 1 when balanced, N when collapsed)")


def _judge_capacity(asked, jobs) -> None:
    from scaletrain.testing import assert_close
    for got, job in answers(asked, jobs, "expert_capacity answers"):
        want = reference.capacity(**job)
        if not isinstance(got, int) or isinstance(got, bool):
            raise AssertionError(f"expert_capacity({job}) returned {got!r}; expected the int {want}")
        assert_close(got, want, rtol=0, what=f"expert_capacity({', '.join(f'{k}={v}' for k, v in job.items())})")


def _judge_keep(asked, jobs) -> None:
    import torch
    for got, job in answers(asked, jobs, "apply_capacity answers"):
        where = f"apply_capacity({job['name']})"
        position, kept = reference.kept(job["experts"].tolist(), job["num_experts"], job["capacity"])
        equal(got["kept"], torch.tensor(kept), f"{where}: kept (the first C pairs per expert in priority order)")
        equal(got["position"], torch.tensor(position, dtype=torch.int64), f"{where}: position")
        dropped = sum(not v for row in kept for v in row)
        for name, want in (("dropped", dropped), ("dropped_tokens", sum(not any(row) for row in kept))):
            if got[name] != want:
                raise AssertionError(f"{where}: {name} = {got[name]!r}, expected {want}")


def _judge_group(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "group_by_expert answers"):
        where = f"group_by_expert({job['name']})"
        e, expert = job["num_experts"], job["expert"].tolist()
        want_counts = [expert.count(i) for i in range(e)]
        counts = sized(got["counts"], e, f"{where}: counts")
        if counts != want_counts:
            raise AssertionError(f"{where}: counts {counts}, expected {want_counts} (rows per expert, in expert order)")
        tokens, gates = (sized(got[key].tolist() if hasattr(got[key], "tolist") else got[key], len(expert),
                               f"{where}: {key} rows") for key in ("token", "gate"))
        start = 0
        for i, n in enumerate(want_counts):
            mine = sorted(zip(tokens[start:start + n], gates[start:start + n]))
            want = sorted((tok, g) for tok, g, ex in zip(job["token"].tolist(), job["gate"].tolist(), expert)
                          if ex == i)
            if mine != want:
                raise AssertionError(f"{where}: rows {start}..{start + n - 1} (expert {i}'s group) hold the (token, "
                                     f"gate) pairs {mine}, expected {want} in any order"[:600])
            start += n


def _judge_dispatch(asked, jobs) -> None:
    for got, job in answers(asked, jobs, "dispatch/combine answers"):
        where, ref = f"dispatch/combine({job['name']})", reference.dispatch_combine(job)
        close(got["rows"], ref["rows"], f"{where}: dispatched rows (row i is x[token[i]])")
        close(got["out"], ref["out"], f"{where}: combined output (0 for the token without rows)")
        for key in ("rows_skipped", "skipped"):
            _skipped({"skipped": got[key]}, where)
        for key, what in (("x_grad", "x"), ("y_grad", "the expert outputs"), ("gate_grad", "the gates")):
            close(got[key] if got[key] is not None else f"no gradient reached {what}", ref[key],
                  f"{where}: gradient with respect to {what}")


def _judge_layer(asked, jobs, refs) -> None:
    for (got, job), ref in zip(answers(asked, jobs, "MoE layer answers"), refs):
        where = f"MoE({job['name']})"
        close(got["out"], ref["out"], f"{where}: output (dropped tokens exactly 0)")
        close(got["aux"], ref["aux"].reshape(1), f"{where}: aux_loss (α·load balance + c_z·z-loss)")
        for key in ("dropped", "dropped_tokens", "kept"):
            if got[key] != ref[key]:
                raise AssertionError(f"{where}: stats.{key} = {got[key]!r}, expected {ref[key]!r}")
        _skipped(got, where)
        for name, want in ref["grads"].items():
            grad = got["grads"].get(name)
            close(grad if grad is not None else f"no gradient reached {name}", want, f"{where}: gradient of {name}")


def group_routing(ctx):
    """Tasks 10.1-10.3: top-k routing, the load-balancing loss, capacity."""
    import torch
    torch.set_num_threads(1)
    seed = checks.trial_seeds(1, salt=1010)[0]
    route, balance, bounds = inputs.route_jobs(seed), inputs.balance_jobs(seed), inputs.bound_jobs()
    caps, keeps = inputs.capacity_jobs(seed), inputs.keep_jobs(seed)
    route_refs = [reference.top_k(j["logits"], j["k"], j["normalize"], j["w"]) for j in route]
    balance_refs = [reference.balance(j["probs"], j["experts"]) for j in balance]
    n = len(balance)
    judge_calls(ctx, PROBE, {"route": route, "balance": balance + bounds, "capacity": caps, "keep": keeps}, {
        C_TOPK: lambda a: _judge_route(a["route"], route, route_refs, grad=False),
        C_TOPK_GRAD: lambda a: _judge_route(a["route"], route, route_refs, grad=True),
        C_LB: lambda a: _judge_balance(part(a["balance"], 0, n), balance, balance_refs, grad=False),
        C_LB_GRAD: lambda a: _judge_balance(part(a["balance"], 0, n), balance, balance_refs, grad=True),
        C_LB_BOUNDS: lambda a: _judge_bounds(part(a["balance"], n, None), bounds),
        C_CAP: lambda a: _judge_capacity(a["capacity"], caps),
        C_KEEP: lambda a: _judge_keep(a["keep"], keeps),
    }, CALL_S)


def group_dispatch(ctx):
    """Task 10.4: grouping, dispatch and combine, and the MoE layer made of every file."""
    import torch
    torch.set_num_threads(1)
    seed = checks.trial_seeds(1, salt=1012)[0]
    groups, dispatches, layers = inputs.group_jobs(seed), inputs.dispatch_jobs(seed), inputs.layer_jobs(seed)
    layer_refs = [reference.layer(j, j["x"], j["w"]) for j in layers]  # before any student code runs
    judge_calls(ctx, PROBE, {"group": groups, "dispatch_combine": dispatches, "layer": layers}, {
        C_GROUP: lambda a: _judge_group(a["group"], groups),
        C_DISPATCH: lambda a: _judge_dispatch(a["dispatch_combine"], dispatches),
        C_LAYER: lambda a: _judge_layer(a["layer"], layers, layer_refs),
    }, CALL_S)
