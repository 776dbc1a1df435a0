"""a6's probe: the student's tensor-parallel operators, layers (and the given attention on them), loss,
sequence-parallel pair and 3D grid run on gloo ranks on the inputs the trusted side sends, with what
they did measured from outside.

`run_ranks(jobs, world_size, pg_timeout_s, timeout_s)`: one spawn; a job of t ranks runs on the
first t (t = 2, 3: subgroups made here; the grid's builds on every rank, with the groups the
student's `build` makes). Each job is one call of the student's code; every rank of its group
returns the raw outputs:
  * the tensors it produced (outputs, input gradients, parameter gradients, the weights a layer
    took from the unsharded one), read after the call;
  * bytes handed to torch.distributed `isend` / `send` in the forward and in the backward, counted
    by a wrapper installed before the student's files are imported (not `record_send`'s counter);
  * for the loss: the most elements of any tensor an aten op produced during forward and backward
    (a TorchDispatchMode), and the bytes autograd saved for backward (saved-tensor hooks);
  * for the GPT: every parameter's gradient by name, the loss, this rank's logits, the bytes saved
    while its blocks ran forward;
  * for a grid's build: the Mesh's coordinates, ranks and positions per axis, and which ranks a
    sum over each of its groups reached (our ring, not the student's code).
`grid(layouts)`: the student's coords, rank_of and groups per layout, without processes. A layer
whose forward fails still returns the weights it took (as "partial"). Nothing here knows an
expected value: the references, the slices, the byte formulas and the verdicts are in the package
autograder/suites/a6_tensor_parallel/. torch's tensor parallel API (DTensor, parallelize_module)
and torch's collectives are trapped at run time in the student's modules; our ring collectives
(scaletrain.comm) are the wire.
"""

from __future__ import annotations

import contextlib
import re

from autograder.checks import forbid_calls, student_module
from autograder.probes.common import install_send_counter, run_jobs, spawn_ranks, where
from autograder.wire import short

STEMS = ("tp_operators", "tp_layers", "tp_cross_entropy", "tp_sequence", "tp_mesh")
LIBRARY = ("scaletrain.tp.operators", "scaletrain.tp.layers", "scaletrain.tp.cross_entropy", "scaletrain.tp.sequence",
           "scaletrain.mesh")
AXES = ("dp", "pp", "tp")
FORBIDDEN_AT_RUN_TIME = ("torch.distributed.all_reduce", "torch.distributed.all_gather",
                         "torch.distributed.all_gather_into_tensor", "torch.distributed.reduce_scatter",
                         "torch.distributed.reduce_scatter_tensor", "torch.distributed.all_gather_single",
                         "torch.distributed.reduce_scatter_single", "torch.distributed.broadcast",
                         "torch.distributed.tensor.parallel.parallelize_module",
                         "torch.distributed.tensor.distribute_tensor")


def _out(t):
    import torch
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        return short(f"{type(t).__name__}: {t!r}", 200)
    t = t.detach().as_subclass(torch.Tensor).clone()
    return t.reshape(1) if t.dim() == 0 else t  # the wire carries no 0-dim tensor: a loss comes back as (1,)


def _backward(y, w):
    """(y * w).sum().backward() when the shapes agree; else say why it was skipped."""
    import torch
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(w.shape):
        return f"backward skipped: the output has shape {tuple(getattr(y, 'shape', ()))}, expected {tuple(w.shape)}"
    (y * w).sum().backward()
    return None


def _linear(weight, bias):
    import torch
    import torch.nn as nn
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        lin.weight.copy_(weight)
        if bias is not None:
            lin.bias.copy_(bias)
    return lin


def _saved_bytes(params):
    """Context: yields a function giving the bytes of distinct storages autograd saved so far
    (`params` skipped)."""
    import torch
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t

    @contextlib.contextmanager
    def tracking():
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield lambda: sum(seen.values())
    return tracking()


def _largest():
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    import torch

    class Largest(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.most = 0

        @classmethod
        def _should_skip_dynamo(cls):  # else the first dispatch imports torch._dynamo (seconds)
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for x in tree_leaves(out):
                if isinstance(x, torch.Tensor):
                    self.most = max(self.most, x.numel())
            return out
    return Largest()


# ---------------------------------------------------------------- one call of the student's code per job

def _operator(m, job, r, group, sent):
    """f, g, gather or scatter of the last dimension: forward on this rank's input, backward of sum(y*w)."""
    fn = {"f": m["tp_operators"].copy_to_tp, "g": m["tp_operators"].reduce_from_tp,
          "gather": m["tp_operators"].gather_from_tp, "scatter": m["tp_operators"].scatter_to_tp,
          "sp_gather": m["tp_sequence"].gather_from_sp, "sp_scatter": m["tp_sequence"].reduce_scatter_to_sp}[job["op"]]
    x = job["x"][r].clone().requires_grad_(True)
    mark = sent.total
    y = fn(x, group, "ring")
    forward = sent.since(mark)
    out = {"y": _out(y), "sent_forward": forward}
    mark = sent.total
    out["skipped"] = _backward(y, job["w"][r])
    out["sent_backward"], out["x_grad"] = sent.since(mark), _out(x.grad)
    return out


def _layer(m, job, r, group, sent):
    """A column- or row-parallel layer made from the given unsharded weights."""
    layers = m["tp_layers"]
    full = _linear(job["weight"], job["bias"])
    if job["layer"] == "column":
        layer = layers.ColumnParallelLinear.from_linear(full, tp_group=group, gather_output=job["flag"],
                                                        parts=job["parts"], backend="ring")
    else:
        layer = layers.RowParallelLinear.from_linear(full, tp_group=group, input_is_parallel=job["flag"],
                                                     backend="ring")
    out = {"weight": _out(layer.weight), "bias": _out(layer.bias)}
    try:  # the weights it took are evidence even when its forward then fails
        x = job["x"][r].clone().requires_grad_(True)
        mark = sent.total
        y = layer(x)
        out.update(y=_out(y), sent_forward=sent.since(mark))
        mark = sent.total
        out["skipped"] = _backward(y, job["w"][r])
    except Exception as exc:
        exc.partial = out
        raise
    out.update(sent_backward=sent.since(mark), x_grad=_out(x.grad), weight_grad=_out(layer.weight.grad),
               bias_grad=_out(None if layer.bias is None else layer.bias.grad))
    return out


def _attention(m, job, r, group, sent):
    """The given `ParallelSelfAttention` on the student's column-parallel QKV (parts=3) and row-parallel
    projection, made from the unsharded attention's weights."""
    from scaletrain.tp.attention import ParallelSelfAttention
    layers = m["tp_layers"]
    qkv = layers.ColumnParallelLinear.from_linear(_linear(job["qkv_w"], job["qkv_b"]), tp_group=group, parts=3,
                                                  backend="ring")
    proj = layers.RowParallelLinear.from_linear(_linear(job["proj_w"], job["proj_b"]), tp_group=group,
                                                input_is_parallel=True, backend="ring")
    out = {"qkv_w": _out(qkv.weight)}
    try:  # the rows it took are evidence even when its forward then fails
        attn = ParallelSelfAttention(qkv, proj, job["n_head"])
        x = job["x"].clone().requires_grad_(True)
        y = attn(x)
        out["y"] = _out(y)
        out["skipped"] = _backward(y, job["w"])
    except Exception as exc:
        exc.partial = out
        raise
    out.update(x_grad=_out(x.grad), qkv_w_grad=_out(qkv.weight.grad), qkv_b_grad=_out(qkv.bias.grad),
               proj_w_grad=_out(proj.weight.grad))
    return out


def _mlp(m, job, r, group, sent):
    """Column (h -> 4h) -> GeLU -> row (4h -> h): the bytes of one tensor-parallel MLP."""
    import torch.nn as nn
    layers = m["tp_layers"]
    mlp = nn.Sequential(layers.ColumnParallelLinear.from_linear(_linear(job["w1"], job["b1"]), tp_group=group),
                        nn.GELU(), layers.RowParallelLinear.from_linear(_linear(job["w2"], job["b2"]), tp_group=group))
    x = job["x"].clone().requires_grad_(True)
    mark = sent.total
    y = mlp(x)
    out = {"y": _out(y), "sent_forward": sent.since(mark)}
    mark = sent.total
    out["skipped"] = _backward(y, job["w"])
    out.update(sent_backward=sent.since(mark), x_grad=_out(x.grad))
    return out


def _loss(m, job, r, group, sent):
    """The vocabulary-parallel cross-entropy of this rank's logits slice."""
    logits = job["logits"][r].clone().requires_grad_(True)
    largest = _largest()
    with largest:
        with _saved_bytes([]) as saved:
            loss = m["tp_cross_entropy"].vocab_parallel_cross_entropy(logits, job["targets"], group, "ring")
            held = saved()
        mark = sent.total
        skipped = None
        if hasattr(loss, "backward") and getattr(loss, "requires_grad", False):
            loss.backward()
        else:
            skipped = "the loss does not require grad"
    return {"loss": _out(loss), "grad": _out(logits.grad), "largest": largest.most, "saved": held,
            "sent_backward": sent.since(mark), "skipped": skipped}


def _gather_linear(m, job, r, group, sent):
    """The sequence-parallel column linear: all-gather of the sequence shard, linear, saving the shard only."""
    import torch.nn as nn
    weight, bias = nn.Parameter(job["weight"][r].clone()), nn.Parameter(job["bias"][r].clone())
    x = job["x"][r].clone().requires_grad_(True)
    with _saved_bytes([weight, bias]) as saved:
        mark = sent.total
        y = m["tp_sequence"].sequence_gather_linear(x, weight, bias, group, "ring")
        out = {"y": _out(y), "sent_forward": sent.since(mark), "saved": saved()}
    mark = sent.total
    out["skipped"] = _backward(y, job["w"][r])
    out.update(sent_backward=sent.since(mark), x_grad=_out(x.grad), weight_grad=_out(weight.grad),
               bias_grad=_out(bias.grad))
    return out


def _gpt(m, job, r, group, sent):
    """The library's `parallelize` (running the student's layers) on the tiny GPT: loss, logits,
    gradients by name, bytes, and the bytes saved while the blocks ran forward."""
    from scaletrain.models import GPT, GPTConfig
    from scaletrain.tp.gpt import allreduce_sequence_parallel_grads, parallelize

    model = parallelize(GPT(GPTConfig(**job["cfg"]), seed=job["seed"]), group, sequence_parallel=job["sp"])
    params = list(model.parameters())
    marks: list[int] = []
    with _saved_bytes(params) as saved:
        hooks = [model.blocks[0].register_forward_pre_hook(lambda *_: marks.append(saved())),
                 model.blocks[-1].register_forward_hook(lambda *_: marks.append(saved()))]
        mark = sent.total
        logits, loss = model(job["idx"], job["targets"])
        forward = sent.since(mark)
    for h in hooks:
        h.remove()
    mark = sent.total
    loss.backward()
    backward = sent.since(mark)
    allreduce_sequence_parallel_grads(model, group)
    return {"loss": _out(loss), "logits": _out(logits), "sent_forward": forward, "sent_backward": backward,
            "blocks_saved": marks[-1] - marks[0] if len(marks) == 2 else None,
            "grads": {n: _out(p.grad) for n, p in model.named_parameters()}}


def _mesh(m, job, r, group, sent):
    """The student's `ParallelDims(...).build` on every rank of the world, then, per axis, what the
    Mesh says (coordinates, ranks, position in the group) and which ranks a sum over its group reaches
    (each rank adds rank + 1 at its own index; our ring allreduce, not the student's code)."""
    import torch
    import torch.distributed as dist
    from scaletrain.tp.collectives import allreduce

    dp, pp, tp = job["layout"]
    mesh = m["tp_mesh"].ParallelDims(dp=dp, pp=pp, tp=tp).build(timeout_s=job["timeout_s"])
    out = {"coords": [mesh.coords.dp, mesh.coords.pp, mesh.coords.tp], "ranks": {}, "position": {}, "reached": {}}
    for axis in AXES:
        g = getattr(mesh, f"{axis}_group")
        out["ranks"][axis] = [int(x) for x in getattr(mesh, f"{axis}_ranks")]
        out["position"][axis] = dist.get_rank(g)
        mark = torch.zeros(dist.get_world_size())
        mark[r] = r + 1
        total = allreduce(mark, g, "ring")
        out["reached"][axis] = [i for i, v in enumerate(total.tolist()) if v == i + 1]
    return out


def grid(layouts: list) -> list:
    """Per (dp, pp, tp) layout, the student's pure grid: every rank's coords, `rank_of` of each of
    them, and `groups(axis)` of each axis (or the error it raised)."""
    dims_class = student_module("tp_mesh").ParallelDims
    out = []
    for dp, pp, tp in layouts:
        try:
            dims = dims_class(dp=dp, pp=pp, tp=tp)
            coords = [dims.coords(r) for r in range(dp * pp * tp)]
            coords = [[int(c.dp), int(c.pp), int(c.tp)] for c in coords]
            out.append({"coords": coords, "rank_of": [int(dims.rank_of(dp=a, pp=b, tp=c)) for a, b, c in coords],
                        "groups": {axis: [[int(x) for x in g] for g in dims.groups(axis)] for axis in AXES}})
        except Exception as exc:  # noqa: BLE001 - each layout's failure is data for the trusted side
            out.append({"error": [type(exc).__name__ if re.fullmatch(r"\w+", type(exc).__name__) else "Exception",
                                  short(str(exc).splitlines()[0] if str(exc) else "", 400) + where(exc)]})
    return out


RUNNERS = {"operator": _operator, "layer": _layer, "attention": _attention, "mlp": _mlp, "loss": _loss,
           "gather_linear": _gather_linear, "gpt": _gpt, "mesh": _mesh}


def _rank(rank: int, world_size: int, jobs: list, pg_timeout_s: float) -> dict:
    """Every job on this rank (`autograder.probes.common.run_jobs`): {job name: {"ok": outputs} |
    {"error": [type name, message]} | {"idle": True}}; a job of t ranks runs on the first t."""
    import datetime
    import importlib

    import torch
    import torch.distributed as dist

    sent = install_send_counter()  # before the student's files bind any name of torch.distributed
    mods = {stem: student_module(stem) for stem in STEMS}
    guarded = tuple(mods.values()) + tuple(importlib.import_module(name) for name in LIBRARY)
    timeout = datetime.timedelta(seconds=pg_timeout_s)
    groups = {t: dist.new_group(list(range(t)), timeout=timeout) for t in (2, 3)}
    groups[world_size] = None  # the mesh jobs build their own groups on every rank

    def run(job: dict):
        torch.manual_seed(0)  # layers made by __init__ before from_linear copies into them
        with forbid_calls(*FORBIDDEN_AT_RUN_TIME, modules=guarded):
            return RUNNERS[job["kind"]](mods, job, rank, groups[job["t"]], sent)

    return run_jobs(rank, jobs, run, size_key="t")


def load(ranks: bool = True) -> bool:
    """Import the student's files (an import error becomes every check's outcome); start the server
    the ranks fork from, so its imports overlap with this process's."""
    if ranks:
        from multiprocessing import forkserver

        from scaletrain.launch import _context

        if _context().get_start_method() == "forkserver":
            forkserver.ensure_running()
    for stem in STEMS:
        student_module(stem)
    return True


def run_ranks(jobs: list, world_size: int, pg_timeout_s: float, timeout_s: float) -> list:
    """The jobs on `world_size` spawned ranks: one dict per rank (see `_rank`)."""
    return spawn_ranks(_rank, world_size, jobs, pg_timeout_s, timeout_s=timeout_s, stems=STEMS)
