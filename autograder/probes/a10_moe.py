"""a10's probe: the student's router, load-balancing loss, capacity, grouping, dispatch/combine and
all-to-all run on the inputs the trusted side sends; raw outputs come back.

One process: each function takes a list of jobs and returns one dict per job (tensors read after
the call, gradients of a weighted sum the trusted side chose, the inputs as they are afterwards).
The MoE layer is the course's `scaletrain.moe.layer.MoE`, whose router, losses, capacity and
grouping are, in the grading build, the student's files.

Ranks (`run_ranks`): one spawn; the group of a job of size p is the first p ranks. Bytes are
counted where they are handed to torch.distributed `isend` / `send` (a wrapper installed before
the student's files are imported) and by the course's `comm_counter` (the student's `record_send`
calls), forward and backward apart. torch's collectives are trapped while the student's code runs.
Nothing here knows an expected value: references and verdicts are in autograder/suites/a10_moe/.
"""

from __future__ import annotations

from autograder.checks import forbid_calls, forbid_collectives, student_module
from autograder.probes.common import install_send_counter, run_jobs, spawn_ranks
from autograder.wire import short

STEMS = ("moe_router", "moe_losses", "moe_capacity", "moe_dispatch", "moe_all_to_all")
P2P_BATCH = ("torch.distributed.batch_isend_irecv",)


def _out(t):
    import torch
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        return short(f"{type(t).__name__}: {t!r}", 200)
    t = torch.empty(t.shape, dtype=t.dtype).copy_(t.detach())  # row-major strides, even for a (T, 1) transpose
    return t.reshape(1) if t.dim() == 0 else t  # the wire carries no 0-dim tensor


def _leaf(t):
    return t.clone().requires_grad_(True)


def _weighted_backward(y, w, aux=None) -> str | None:
    """(y * w).sum() (+ aux, when it requires grad) .backward() when y is a tensor of w's shape that
    requires grad; else why not."""
    import torch
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(w.shape):
        return f"backward skipped: got shape {tuple(getattr(y, 'shape', ()))}, expected {tuple(w.shape)}"
    if not y.requires_grad:
        return "backward skipped: the output does not require grad (no gradient reaches the inputs)"
    loss = (y * w.to(y.dtype)).sum()
    if isinstance(aux, torch.Tensor) and aux.requires_grad:
        loss = loss + aux.sum()
    loss.backward()
    return None


def load(ranks: bool = False) -> bool:
    """Import the student's files (an import error becomes every check's outcome)."""
    for stem in STEMS:
        student_module(stem)
    import scaletrain.moe.layer  # noqa: F401 - the layer imports the student's files as the library
    return True


def route(jobs: list) -> list:
    m = student_module("moe_router")
    out = []
    for job in jobs:
        logits = _leaf(job["logits"])
        r = m.top_k_routing(logits, job["k"], normalize=job["normalize"])
        got = {"probs": _out(r.probs), "experts": _out(r.experts), "gates": _out(r.gates)}
        got["skipped"] = _weighted_backward(r.gates, job["w"])
        got.update(grad=_out(logits.grad), logits_after=_out(logits))
        out.append(got)
    return out


def balance(jobs: list) -> list:
    m = student_module("moe_losses")
    out = []
    for job in jobs:
        probs, experts = _leaf(job["probs"]), job["experts"].clone()
        loss = m.load_balancing_loss(probs, experts)
        got = {"loss": _out(loss)}
        if getattr(loss, "requires_grad", False):
            loss.backward()
        got.update(grad=_out(probs.grad), experts_after=_out(experts))
        out.append(got)
    return out


def capacity(jobs: list) -> list:
    m = student_module("moe_capacity")
    return [m.expert_capacity(**job) for job in jobs]


def keep(jobs: list) -> list:
    m = student_module("moe_capacity")
    out = []
    for job in jobs:
        cap = m.apply_capacity(job["experts"].clone(), job["num_experts"], job["capacity"])
        out.append({"position": _out(cap.position), "kept": _out(cap.kept), "dropped": cap.dropped,
                    "dropped_tokens": cap.dropped_tokens})
    return out


def group(jobs: list) -> list:
    m = student_module("moe_dispatch")
    out = []
    for job in jobs:
        g = m.group_by_expert(job["token"].clone(), job["expert"].clone(), job["gate"].clone(), job["num_experts"])
        out.append({"token": _out(g.token), "gate": _out(g.gate), "counts": [int(c) for c in g.counts]})
    return out


def dispatch_combine(jobs: list) -> list:
    """dispatch(x) for given groups, then combine(y) of given expert outputs, and their gradients."""
    m = student_module("moe_dispatch")
    out = []
    for job in jobs:
        x, y, gate = _leaf(job["x"]), _leaf(job["y"]), _leaf(job["gate"])
        groups = m.Groups(token=job["token"].clone(), gate=gate, counts=list(job["counts"]))
        rows = m.dispatch(x, groups)
        got = {"rows": _out(rows), "rows_skipped": _weighted_backward(rows, job["w_rows"])}
        combined = m.combine(y, groups, job["tokens"])
        got.update(out=_out(combined), skipped=_weighted_backward(combined, job["w"]))
        got.update(x_grad=_out(x.grad), y_grad=_out(y.grad), gate_grad=_out(gate.grad))
        out.append(got)
    return out


def _moe(job):
    """The course's MoE layer (the student's files inside) with the weights the trusted side sent."""
    import torch
    from scaletrain.moe.layer import MoE, MoEConfig

    w = job["weights"]
    layer = MoE(w["router"].shape[1], MoEConfig(**job["cfg"])).to(w["router"].dtype)
    with torch.no_grad():
        layer.router.weight.copy_(w["router"])
        for name in ("w1", "b1", "w2", "b2"):
            getattr(layer.experts, name).copy_(w[name])
    return layer


def layer(jobs: list) -> list:
    out = []
    for job in jobs:
        moe = _moe(job)
        x = _leaf(job["x"])
        y = moe(x)
        got = {"out": _out(y), "aux": _out(moe.aux_loss), "dropped": moe.stats.dropped,
               "dropped_tokens": moe.stats.dropped_tokens, "kept": [int(c) for c in moe.stats.kept]}
        got["skipped"] = _weighted_backward(y, job["w"], moe.aux_loss)
        got["grads"] = {"x": _out(x.grad), "router": _out(moe.router.weight.grad),
                        **{n: _out(getattr(moe.experts, n).grad) for n in ("w1", "b1", "w2", "b2")}}
        out.append(got)
    return out


# ---------------------------------------------------------------- ranks

def _a2a(job, r, group, sent):
    """Equal (`splits` None) or variable all-to-all of this rank's rows, then the backward."""
    from scaletrain.comm.counter import comm_counter
    m = student_module("moe_all_to_all")
    x = _leaf(job["x"][r])
    with sent.phase() as fwd, comm_counter() as counted:
        if job["splits"] is None:
            y, recv = m.all_to_all(x, group), None
        else:
            given = [row[r] for row in job["splits"]] if job["recv_given"] else None
            y, recv = m.all_to_all_v(x, job["splits"][r], given, group)
    got = {"y": _out(y), "recv_splits": recv, "sent_forward": fwd.bytes, "counted_forward": counted.bytes_sent}
    with sent.phase() as bwd, comm_counter() as counted:
        got["skipped"] = _weighted_backward(y, job["w"][r])
    got.update(x_grad=_out(x.grad), sent_backward=bwd.bytes, counted_backward=counted.bytes_sent)
    return got


def _ep(job, r, group, sent):
    """The MoE layer with its experts sharded over `group` (the course's ExpertParallel, on the
    student's all-to-all): output, gradients, and where this rank's shard starts."""
    from scaletrain.moe.expert_parallel import ExpertParallel
    moe = _moe(job)
    moe.experts = ExpertParallel(moe.experts, group)
    x = _leaf(job["x"][r])
    y = moe(x)
    got = {"out": _out(y), "aux": _out(moe.aux_loss), "first": moe.experts.local.first}
    got["skipped"] = _weighted_backward(y, job["w"][r], moe.aux_loss)
    got["grads"] = {"x": _out(x.grad), "router": _out(moe.router.weight.grad),
                    **{n: _out(getattr(moe.experts.local, n).grad) for n in ("w1", "b1", "w2", "b2")}}
    return got


RUNNERS = {"a2a": _a2a, "ep": _ep}


def _rank(rank: int, world_size: int, jobs: list, pg_timeout_s: float) -> dict:
    """Every job on this rank (`run_jobs`): the group of a job of size p is the first p ranks."""
    import datetime

    import torch.distributed as dist

    sent = install_send_counter()  # before the student's files bind any name of torch.distributed
    mods = tuple(student_module(stem) for stem in STEMS)
    timeout = datetime.timedelta(seconds=pg_timeout_s)
    groups = {p: dist.new_group(list(range(p)), timeout=timeout) for p in range(1, world_size + 1)}

    def run(job):
        with forbid_collectives(*mods), forbid_calls(*P2P_BATCH, modules=mods):
            return RUNNERS[job["kind"]](job, rank, groups[job["p"]], sent)
    return run_jobs(rank, jobs, run, size_key="p")


def run_ranks(jobs: list, world_size: int, pg_timeout_s: float, timeout_s: float) -> list:
    """The jobs on `world_size` spawned ranks: one dict per rank (see `_rank`)."""
    return spawn_ranks(_rank, world_size, jobs, pg_timeout_s, timeout_s=timeout_s, stems=STEMS)
