"""a6's group: the references computed before any student code runs, one spawn of the ranks in the
sandboxed worker (`autograder.probes.a6_tensor_parallel`), and each check's verdict, job by job."""

from __future__ import annotations

from autograder import checks

from .inputs import grid_layouts, jobs_by_check, wire_job
from .judge_layers import held_rows, judge_attention, judge_layer, judge_mlp, judge_operator, judge_weights
from .judge_mesh import grid_at, judge_grid, judge_mesh, judge_nodes
from .judge_model import judge_gather_linear, judge_gpt, judge_loss
from .names import CHECKS, C_MESH_BUILD, C_MESH_GRID, C_MESH_NODES, PG_TIMEOUT_S, PROBE, SPAWN_TIMEOUT_S, WORLD

JUDGES = {"operator": judge_operator, "layer": judge_layer, "attention": judge_attention, "mlp": judge_mlp,
          "loss": judge_loss, "gather_linear": judge_gather_linear, "gpt": judge_gpt, "mesh": judge_mesh}


def _linear(weight, bias):
    import torch
    import torch.nn as nn
    lin = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        lin.weight.copy_(weight)
        lin.bias.copy_(bias)
    return lin


def reference(job: dict) -> dict:
    """What the unsharded computation gives for `job` (before any student code runs)."""
    import torch.nn.functional as F

    kind = job["kind"]
    if kind == "layer" or kind == "gather_linear":
        weight, bias, x, w = ((job["weight"], job["bias"], job["x_full"], job["w_full"]) if kind == "layer"
                              else job["full"])
        lin, x = _linear(weight, bias), x.clone().requires_grad_(True)
        y = lin(x)
        (y * w).sum().backward()
        return {"y": y.detach(), "x_grad": x.grad, "weight_grad": lin.weight.grad, "bias_grad": lin.bias.grad}
    if kind == "attention":
        from scaletrain.models import CausalSelfAttention, GPTConfig
        h = job["x"].shape[-1]
        attn = CausalSelfAttention(GPTConfig(n_embd=h, n_head=job["n_head"]))
        attn.qkv, attn.proj = _linear(job["qkv_w"], job["qkv_b"]), _linear(job["proj_w"], job["proj_b"])
        x = job["x"].clone().requires_grad_(True)
        y = attn(x)
        (y * job["w"]).sum().backward()
        return {"y": y.detach(), "x_grad": x.grad, "qkv_w_grad": attn.qkv.weight.grad,
                "qkv_b_grad": attn.qkv.bias.grad, "proj_w_grad": attn.proj.weight.grad}
    if kind == "mlp":
        l1, l2 = _linear(job["w1"], job["b1"]), _linear(job["w2"], job["b2"])
        x = job["x"].clone().requires_grad_(True)
        y = l2(F.gelu(l1(x)))
        (y * job["w"]).sum().backward()
        return {"y": y.detach(), "x_grad": x.grad}
    if kind == "loss":
        logits = job["full"].clone().requires_grad_(True)
        loss = F.cross_entropy(logits, job["targets"])
        loss.backward()
        return {"loss": loss.detach(), "grad": logits.grad}
    if kind == "gpt":
        from scaletrain.models import GPT, GPTConfig
        model = GPT(GPTConfig(**job["cfg"]), seed=job["seed"])
        logits, loss = model(job["idx"], job["targets"])
        loss.backward()
        return {"loss": loss.detach(), "logits": logits.detach(),
                "grads": {n: p.grad for n, p in model.named_parameters()}}
    return {}  # operators: sums over the ranks, computed where they are judged


def _run(ctx, jobs: list[dict], layouts: list) -> tuple[Exception | None, list, list | None]:
    """The ranks' jobs in one spawn, then the pure grid: (the failure, per rank outputs or [], the grids
    or None). The grid runs after the ranks: a hang in it costs task 6.5 only."""
    worker, per_rank = ctx.untrusted(), []
    try:
        worker.call(PROBE + "load", timeout_s=90)
        answer = worker.call(PROBE + "run_ranks", [wire_job(j) for j in jobs], WORLD, PG_TIMEOUT_S,
                             SPAWN_TIMEOUT_S, timeout_s=SPAWN_TIMEOUT_S + 30)
        if not (isinstance(answer, list) and len(answer) == WORLD and all(isinstance(o, dict) for o in answer)):
            raise AssertionError(f"the ranks' outputs are malformed: {str(answer)[:80]}")
        per_rank = answer
        grids = worker.call(PROBE + "grid", layouts, timeout_s=30)
        if not (isinstance(grids, list) and len(grids) == len(layouts) and all(isinstance(g, dict) for g in grids)):
            raise AssertionError(f"the grid's outputs are malformed: {str(grids)[:80]}")
    except Exception as exc:  # noqa: BLE001 - reported inside the checks it reaches
        return exc, per_rank, None
    return None, per_rank, grids


def _judge_grids(name: str, layouts: list, grids: list) -> None:
    """Each layout's coords and groups (the probe's `grid`); one that raised fails as it raised."""
    for layout, got in zip(layouts, grids):
        error = got.get("error")
        if isinstance(error, list) and len(error) == 2:
            kind, message = error
            known = {"NotImplementedError": NotImplementedError, "AssertionError": AssertionError,
                     "Flagged": checks.Flagged}
            raise (known[kind] if kind in known else checks.StudentCrash)(f"{grid_at(layout)}: {kind}: {message}")
        try:
            (judge_grid if name == C_MESH_GRID else judge_nodes)(layout, got)
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            raise AssertionError(f"{grid_at(layout)}: the outputs that came back are malformed "
                                 f"({type(exc).__name__}: {exc})") from None


def _judge_jobs(name: str, jobs: list[dict], per_rank: list, refs: dict) -> None:
    """Job by job: a layer's weights (and the attention's QKV rows) are judged before its forward's failure."""
    for job in jobs:
        for r in range(job["t"]):
            partial = per_rank[r].get(job["name"], {}).get("partial")
            if job["kind"] == "layer" and isinstance(partial, dict):
                judge_weights(job, partial, r)
            elif job["kind"] == "attention" and isinstance(partial, dict):
                held_rows(job, partial.get("qkv_w"), r)
        problem = checks.rank_failure([job], per_rank, size_key="t")
        if problem is not None:
            raise problem
        for r in range(job["t"]):
            entry = per_rank[r].get(job["name"], {})
            if "ok" not in entry:
                raise AssertionError(f"{job['name']}: rank {r} sent no outputs")
            try:
                JUDGES[job["kind"]](job, entry["ok"], refs[job["name"]], r, name)
            except (KeyError, TypeError, IndexError, AttributeError) as exc:
                raise AssertionError(f"{job['name']}, rank {r}: the outputs that came back are malformed "
                                     f"({type(exc).__name__}: {exc})") from None


def group_ranks(ctx):
    import torch
    torch.set_num_threads(1)  # the ranks have the cores
    seed = checks.trial_seeds(1, salt=66)[0]
    need, layouts = jobs_by_check(seed), grid_layouts(seed)
    jobs = list({j["name"]: j for js in need.values() for j in js}.values())
    refs = {job["name"]: reference(job) for job in jobs}  # before any student code runs
    failure, per_rank, grids = _run(ctx, jobs, layouts)
    for job in need[C_MESH_BUILD]:
        refs[job["name"]]["grid"] = None if grids is None else grids[layouts.index(tuple(job["layout"]))]
    for name in CHECKS:
        with ctx.check(name):
            grid_check = name in (C_MESH_GRID, C_MESH_NODES)
            if failure is not None and (not per_rank or grid_check):
                raise failure
            if grid_check:
                _judge_grids(name, layouts, grids)
            else:
                _judge_jobs(name, need[name], per_rank, refs)
