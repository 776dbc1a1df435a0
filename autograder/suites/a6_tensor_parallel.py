"""Assignment a6: tensor and sequence parallelism (`assignments/a6_tensor_parallel/`).

The group is *trusted* (`Group.trusted`): this process never imports the submission. The probe
`autograder.probes.a6_tensor_parallel` runs the student's f and g, the column and row layers, the
vocabulary-parallel loss and the sequence-parallel pair in the sandboxed worker, on one spawn of 3
gloo ranks (t = 3: all of them; t = 2: a subgroup), on hidden shapes and weights sent from here, and
returns raw outputs. Everything that decides a verdict is here:

- references independent of the student's code: the unsharded `nn.Linear`, `F.cross_entropy` on
  the whole logits, the one-process `scaletrain.models.GPT`, sums done in one process; the slice
  each rank must hold (`scaletrain.tp.shard`, `scaletrain.tp.gpt.gpt_shard`);
- bytes: what each rank handed to `isend` (counted by the probe below the student's code) against
  the closed forms of `scaletrain.tp.cost` (f: nothing forward, one allreduce backward; the MLP one
  allreduce of b·s·h each way; the GPT 4 per layer, the seminar's equation 5);
- memory: the largest tensor the loss ever made (at most N·V/t elements: never the whole logits),
  what the sequence-parallel linear saved (the shard only), and what the GPT's blocks saved against
  `scaletrain.tp.activations` (Korthikanti's sbh(10 + 24/t + ...) and sbh(34/t + ...) adapted to CPU).

Bytes and memory are evidence measured in the worker: the loss's memory, the GPT's bytes and the
blocks' saved bytes are granted only when the loss's or the GPT's values passed in the same run
(`Check.needs`, `grade.with_values`): a loss of zeros makes no whole logits either.

A deadlocked collective ends after PG_TIMEOUT_S as `timeout` (the jobs after it are not run). torch's
tensor-parallel API (DTensor, parallelize_module) and collectives are forbidden in the student files,
statically and at run time; the wire is the course's ring (assignment a2).
"""

from __future__ import annotations

import random

from autograder import checks
from autograder.attacks import IMPORTER, report_forger
from autograder.manifest import REPO, Check, Group, Manifest, Planted, Task

OPS, LAYERS, LOSS, SEQ = "tp_operators.py", "tp_layers.py", "tp_cross_entropy.py", "tp_sequence.py"
MESH = "tp_mesh.py"
PROBE = "autograder.probes.a6_tensor_parallel:"
WORLD = 4             # t = 2 and t = 3 on subgroups; the 3D grid's builds on all 4
SIZES = (2, 3)
PG_TIMEOUT_S = 10.0   # a collective that waits longer is a deadlock
SPAWN_TIMEOUT_S = 150
RTOL = 2e-5           # fp32, sums in another order than one process
AXES = ("dp", "pp", "tp")
TORCH_TP = ("torch.distributed.tensor", "torch.distributed.all_reduce", "torch.distributed.all_gather",
            "torch.distributed.all_gather_into_tensor", "torch.distributed.all_gather_single",
            "torch.distributed.reduce_scatter", "torch.distributed.reduce_scatter_tensor",
            "torch.distributed.reduce_scatter_single", "torch.distributed.broadcast", "torch.nn.parallel",
            "importlib", "__import__", "exec", "eval")

C_FG_FWD = "f and g forward: f the identity, g the sum over the ranks (t = 2, 3)"
C_FG_BWD = "f and g backward: f's the sum over the ranks, g's the identity (t = 2, 3)"
C_FG_BYTES = "f and g send one allreduce each: f in the backward, g in the forward (bytes at isend)"
C_LAST = "gather and scatter of the last dimension, each the other's backward"
C_COL_FWD = "column-parallel layer forward: its rows of the weight and bias, its slice of the output"
C_COL_BWD = "column-parallel layer backward: input gradient summed over the ranks, its rows' weight and bias gradients"
C_ROW_FWD = "row-parallel layer forward: its columns of the weight, the whole bias, the unsharded output"
C_ROW_BWD = "row-parallel layer backward: its input slice's gradient, its columns' weight gradient, the bias gradient"
C_QKV = "attention split by heads: each rank holds whole heads of Q, K and V; output and gradients equal one device"
C_MLP = "column -> GeLU -> row: one allreduce of b·s·h forward and one backward"
C_GPT = "tensor-parallel GPT equals one process (loss, logits slice, every gradient; t = 2, 3)"
C_GPT_BYTES = "tensor-parallel GPT sends 4 allreduces of b·s·h per layer (+ embedding, head, loss)"
C_CE_FWD = "vocabulary-parallel cross-entropy: the loss equals F.cross_entropy on the whole logits, on every rank"
C_CE_BWD = "vocabulary-parallel cross-entropy: the gradient of this rank's logits equals the whole-logits one"
C_CE_STABLE = "vocabulary-parallel cross-entropy stays finite and exact for logits in the thousands"
C_CE_MEM = "the loss never makes a tensor of the whole logits (at most N·V/t elements)"
C_SP_PAIR_FWD = "sequence all-gather / reduce-scatter forward (values and bytes)"
C_SP_PAIR_BWD = "sequence all-gather / reduce-scatter backward: each the other's conjugate (values and bytes)"
C_SP_LIN = "sequence-gather linear equals the unsharded layer (output, every gradient, one all-gather forward)"
C_SP_LIN_SAVED = "sequence-gather linear saves only its (b, s/t, h) shard for backward"
C_SP_GPT = "GPT with sequence parallelism equals one process (t = 2, 3)"
C_SP_MEM = "blocks save sbh(10 + 24/t)-form bytes with TP, sbh(34/t)-form with SP (CPU fp32 form)"
C_SP_BYTES = "sequence parallelism sends tensor parallelism's bytes plus 2 re-gathers per layer"
C_MESH_GRID = "3D grid: coords and rank_of inverse; each axis's groups partition the ranks, position = coordinate"
C_MESH_NODES = "3D grid: every tp group is consecutive ranks (whole tp groups inside a node)"
C_MESH_BUILD = "3D grid on 4 ranks: every rank builds every group; a sum over each group reaches exactly its ranks"
CHECKS = (C_FG_FWD, C_FG_BWD, C_FG_BYTES, C_LAST, C_COL_FWD, C_COL_BWD, C_ROW_FWD, C_ROW_BWD, C_QKV, C_MLP, C_GPT,
          C_GPT_BYTES, C_CE_FWD, C_CE_BWD, C_CE_STABLE, C_CE_MEM, C_SP_PAIR_FWD, C_SP_PAIR_BWD, C_SP_LIN,
          C_SP_LIN_SAVED, C_SP_GPT, C_SP_MEM, C_SP_BYTES, C_MESH_GRID, C_MESH_NODES, C_MESH_BUILD)

_FROM_LINEAR_COLUMN = "            layer.weight.copy_(shard(linear.weight, **where))\n"


def _attacks() -> tuple[Planted, ...]:
    """Attacks on the grader itself (issue 13's catalogue), each in place of the column layer's weight
    slicing, which they leave undone: under the trusted split they earn nothing."""
    attacks = {
        "forges 'passed' lines in every report it can find (and at exit)": (
            report_forger(list(CHECKS)).replace("    ", "            ", 1).replace("\n    ", "\n            ") +
            "            forge(); atexit.register(forge)\n", "failed"),
        "patches the grader's classify through sys.modules": (
            f"            ctx = {IMPORTER}('autograder.context', fromlist=['x'])\n"
            "            ctx.classify = lambda exc, submission: ('passed', '')\n", "failed"),
        "reads the expected weights out of the caller's frames": (
            "            import sys as _sys\n"
            "            frame = _sys._getframe()\n"
            "            while frame is not None:\n"
            "                for key in ('want', 'expected', 'ref'):\n"
            "                    if hasattr(frame.f_locals.get(key), 'shape'):\n"
            "                        layer.weight.copy_(frame.f_locals[key])\n"
            "                frame = frame.f_back\n", "failed"),
        "imports the reference layers by a name built at run time": (
            f"            ref = {IMPORTER}('scaletrain.tp.la' + 'yers', fromlist=['x'])\n"
            "            layer.weight.copy_(ref.ColumnParallelLinear.from_linear(linear, tp_group=layer.tp_group, "
            "parts=layer.parts).weight)\n", "error"),
        "reads the reference from the grader's disk": (
            f"            code = open({str(REPO / 'lib/scaletrain/tp/layers.py')!r}).read()\n"
            "            scope = {'__name__': 'stolen'}\n"
            f"            {IMPORTER}('builtins').exec(code, scope)\n"
            "            layer.weight.copy_(scope['ColumnParallelLinear'].from_linear(linear, tp_group=layer.tp_group, "
            "parts=layer.parts).weight)\n", "error"),
    }
    return tuple(Planted(name, LAYERS, (_FROM_LINEAR_COLUMN, body), expect={C_COL_FWD: outcome, C_ROW_FWD: "passed"})
                 for name, (body, outcome) in attacks.items())


_FULL_LOGITS = (
    "        from scaletrain.tp.collectives import all_gather as _gather\n"
    "        full = _gather(logits.detach(), -1, group, backend)                     # (N, V): the whole logits\n"
    "        probs = torch.softmax(full, dim=-1)\n"
    "        loss = -torch.log_softmax(full, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)\n"
    "        ctx.save_for_backward(probs, targets)\n"
    "        ctx.rank, ctx.v = rank, logits.shape[-1]\n"
    "        return loss\n")
_FULL_LOGITS_BACKWARD = (
    "        probs, targets = ctx.saved_tensors\n"
    "        grad = probs.clone()\n"
    "        grad[torch.arange(grad.shape[0]), targets] -= 1\n"
    "        grad = grad[:, ctx.rank * ctx.v:(ctx.rank + 1) * ctx.v]\n"
    "        return grad.mul_(grad_loss.unsqueeze(-1)), None, None, None\n")


def _cut(source: str, start: str, end: str) -> str:
    """The text of `source` from the line starting with `start` to the line before `end`."""
    text = (REPO / source).read_text()
    i = text.index(start)
    return text[i:text.index(end, i)]


def _planted() -> tuple[Planted, ...]:
    ce_forward = _cut("lib/scaletrain/tp/cross_entropy.py", "        m = allreduce_max(", "        # END SOLUTION")
    ce_backward = _cut("lib/scaletrain/tp/cross_entropy.py", "        probs, local, outside = ctx.saved_tensors",
                       "        # END SOLUTION")
    return (
        Planted("f's backward does not allreduce", OPS,
                ("        return allreduce(grad, ctx.group, ctx.backend), None, None\n",
                 "        return grad, None, None\n"),
                expect={C_FG_FWD: "passed", C_FG_BWD: "failed", C_FG_BYTES: "failed", C_COL_FWD: "passed",
                        C_COL_BWD: "failed", C_GPT: "failed", C_CE_FWD: "passed"}),
        Planted("row layer split along the wrong dimension", LAYERS,
                ("            layer.weight.copy_(shard(linear.weight, dim=1, rank=layer.tp_rank, "
                 "world_size=layer.tp_world_size))\n",
                 "            layer.weight = nn.Parameter(linear.weight.detach().chunk(layer.tp_world_size, dim=0)"
                 "[layer.tp_rank].clone())  # rows, as a column layer would\n"),
                expect={C_ROW_FWD: "failed", C_ROW_BWD: "failed", C_COL_FWD: "passed", C_FG_FWD: "passed"}),
        Planted("row layer adds its bias before the sum (t times)", LAYERS,
                (("        partial = F.linear(x, self.weight)  # X_r·W_rᵀ: this rank's share of the sum\n",
                  "        partial = F.linear(x, self.weight, self.bias)\n"),
                 ("        return y if self.bias is None else y + self.bias  # after the sum: added once, not t times\n",
                  "        return y\n")),
                # the GPT's biases start at zero: only its sequence-parallel bias gradients show it
                expect={C_ROW_FWD: "failed", C_ROW_BWD: "passed", C_COL_FWD: "passed", C_COL_BWD: "passed",
                        C_MLP: "failed", C_GPT: "passed", C_SP_GPT: "failed"}),
        Planted("QKV split as one block instead of per head", LAYERS,
                ("world_size=layer.tp_world_size, parts=layer.parts)", "world_size=layer.tp_world_size, parts=1)"),
                expect={C_QKV: "failed", C_COL_FWD: "passed", C_ROW_FWD: "passed", C_GPT: "failed"}),
        Planted("the loss gathers the whole logits", LOSS,
                ((ce_forward, _FULL_LOGITS), (ce_backward, _FULL_LOGITS_BACKWARD)),
                expect={C_CE_FWD: "passed", C_CE_BWD: "passed", C_CE_MEM: "failed", C_GPT: "passed"}),
        Planted("the loss skips the maximum (exp overflows on large logits)", LOSS,
                ("        m = allreduce_max(logits.detach().amax(dim=-1), group, backend)       # (N,)\n",
                 "        m = torch.zeros(logits.shape[0], dtype=logits.dtype)  # no stabilization\n"),
                expect={C_CE_FWD: "passed", C_CE_BWD: "passed", C_CE_STABLE: "failed", C_GPT: "passed"}),
        # issue 28: memory evidence beside a wrong loss (it never makes the whole logits: it makes nothing)
        Planted("the loss is zeros (no tensor of the whole logits, no loss either)", LOSS,
                ("        ctx.save_for_backward(probs, local, outside)\n        return loss\n",
                 "        ctx.save_for_backward(probs, local, outside)\n        return torch.zeros_like(loss)\n"),
                expect={C_CE_FWD: "failed", C_CE_BWD: "passed", C_CE_MEM: "failed"}),
        Planted("the sequence-gather linear saves the gathered input", SEQ,
                ("    return SequenceGatherLinear.apply(x, weight, bias, group, backend)\n",
                 "    return F.linear(gather_from_sp(x, group, backend), weight, bias)  # autograd saves (b, s, h)\n"),
                expect={C_SP_LIN: "passed", C_SP_LIN_SAVED: "failed", C_SP_PAIR_FWD: "passed", C_SP_GPT: "passed",
                        C_SP_MEM: "failed"}),
        Planted("g sums an all-gather of every partial instead of allreducing", OPS,
                ("        return allreduce(x, group, backend)\n",
                 "        from scaletrain.tp.collectives import all_gather as _gather\n"
                 "        return _gather(x.unsqueeze(0), 0, group, backend).sum(0)"
                 "  # (t-1)·n sent, not 2(t-1)/t·n\n"),
                expect={C_FG_FWD: "passed", C_FG_BWD: "passed", C_FG_BYTES: "failed", C_GPT: "passed",
                        C_GPT_BYTES: "failed"}),
        Planted("imports torch's tensor-parallel API", LAYERS,
                ("import torch.nn as nn\n",
                 "import torch.nn as nn\n"
                 "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel\n"),
                expect={C_COL_FWD: "flagged", C_ROW_BWD: "flagged", C_GPT: "flagged", C_FG_FWD: "passed"}),
        Planted("g allreduces on rank 0 only (deadlock)", OPS,
                ("        return allreduce(x, group, backend)\n",
                 "        return allreduce(x, group, backend) if torch.distributed.get_rank(group) == 0"
                 " else x.clone()\n"),
                expect={C_FG_FWD: "timeout", C_GPT: "timeout", C_MESH_GRID: "passed"}, timeout_s=120),
        Planted("the loss kills its process (crash)", LOSS,
                (("import torch\n", "import os\n\nimport torch\n"),
                 ("        m = allreduce_max(", "        os._exit(3)\n        m = allreduce_max(")),
                expect={C_CE_FWD: "error", C_FG_FWD: "error"}),
        Planted("3D grid with tp outermost: tp groups strided across nodes", MESH,
                (("        dp = rank // (self.pp * self.tp)\n        pp, tp = rank // self.tp % self.pp, rank % self.tp\n",
                  "        tp = rank // (self.dp * self.pp)\n        dp, pp = rank // self.pp % self.dp, rank % self.pp\n"),
                 ("        return (dp * self.pp + pp) * self.tp + tp\n", "        return (tp * self.dp + dp) * self.pp + pp\n")),
                expect={C_MESH_GRID: "passed", C_MESH_NODES: "failed", C_MESH_BUILD: "passed", C_GPT: "passed"}),
        Planted("3D grid: rank_of swaps pp and tp", MESH,
                ("        return (dp * self.pp + pp) * self.tp + tp\n", "        return (dp * self.tp + tp) * self.pp + pp\n"),
                expect={C_MESH_GRID: "failed", C_MESH_NODES: "failed", C_MESH_BUILD: "passed"}),
        Planted("3D grid: each rank creates only the groups it belongs to", MESH,
                ("        for axis in axes:\n            for ranks in self.groups(axis):\n"
                 "                group = dist.new_group(ranks, timeout=timeout)\n",
                 "        for axis in axes:\n            for ranks in [g for g in self.groups(axis) if rank in g]:\n"
                 "                group = dist.new_group(ranks, timeout=timeout)\n"),
                expect={C_MESH_GRID: "passed", C_MESH_NODES: "passed", C_MESH_BUILD: "timeout", C_GPT: "passed"}),
        *_attacks(),
    )


MANIFEST = Manifest(
    assignment="a6", folder="a6_tensor_parallel", title="Tensor, sequence and 3D parallelism",
    files={OPS: "lib/scaletrain/tp/operators.py", LAYERS: "lib/scaletrain/tp/layers.py",
           LOSS: "lib/scaletrain/tp/cross_entropy.py", SEQ: "lib/scaletrain/tp/sequence.py",
           MESH: "lib/scaletrain/mesh.py"},
    tasks=(
        Task("6.1", "The conjugate operators f and g (and the last-dimension gather/scatter)", file=OPS,
             functions=("forward", "backward")),
        Task("6.2", "Column- and row-parallel linear layers, and the per-head slice of a fused weight", file=LAYERS,
             functions=("shard", "from_linear", "forward")),
        Task("6.3", "Vocabulary-parallel cross-entropy", file=LOSS, functions=("forward", "backward")),
        Task("6.4", "Sequence parallelism: the all-gather / reduce-scatter pair", file=SEQ,
             functions=("forward", "backward")),
        Task("6.5", "3D parallelism: the rank grid and its process groups", file=MESH,
             functions=("coords", "rank_of", "new_groups")),
    ),
    forbidden={OPS: TORCH_TP + ("scaletrain.tp.operators",),
               LAYERS: TORCH_TP + ("scaletrain.tp.layers", "scaletrain.tp.ColumnParallelLinear",
                                   "scaletrain.tp.RowParallelLinear", "scaletrain.tp.shard", "scaletrain.tp.shard_like",
                                   "scaletrain.tp.gpt", "scaletrain.tp.verify"),
               LOSS: TORCH_TP + ("scaletrain.tp.cross_entropy", "scaletrain.tp.vocab_parallel_cross_entropy"),
               SEQ: TORCH_TP + ("scaletrain.tp.sequence",),
               MESH: TORCH_TP + ("scaletrain.mesh", "scaletrain.train", "torch.distributed.device_mesh",
                                 "torch.distributed.init_device_mesh", "torch.distributed.DeviceMesh")},
    groups=(
        Group("ranks", "autograder.suites.a6_tensor_parallel:group_ranks", timeout_s=300, trusted=True, checks=(
            Check("6.1", C_FG_FWD, 1), Check("6.1", C_FG_BWD, 2), Check("6.1", C_FG_BYTES, 1, needs=(C_FG_FWD, C_FG_BWD)),
            Check("6.1", C_LAST, 1),
            Check("6.2", C_COL_FWD, 1), Check("6.2", C_COL_BWD, 1), Check("6.2", C_ROW_FWD, 1), Check("6.2", C_ROW_BWD, 1),
            Check("6.2", C_QKV, 2), Check("6.2", C_MLP, 1),
            Check("6.2", C_GPT, 3),
            Check("6.2", C_GPT_BYTES, 1, needs=(C_GPT,)),
            Check("6.3", C_CE_FWD, 1), Check("6.3", C_CE_BWD, 1), Check("6.3", C_CE_STABLE, 1),
            Check("6.3", C_CE_MEM, 2, needs=(C_CE_FWD,)),
            Check("6.4", C_SP_PAIR_FWD, 1), Check("6.4", C_SP_PAIR_BWD, 1), Check("6.4", C_SP_LIN, 1),
            Check("6.4", C_SP_LIN_SAVED, 1, needs=(C_SP_LIN,)), Check("6.4", C_SP_GPT, 2),
            Check("6.4", C_SP_MEM, 2, needs=(C_GPT, C_SP_GPT)),
            Check("6.4", C_SP_BYTES, 1, needs=(C_SP_GPT,)),
            Check("6.5", C_MESH_GRID, 2), Check("6.5", C_MESH_NODES, 1, needs=(C_MESH_GRID,)),
            Check("6.5", C_MESH_BUILD, 2),
        )),
    ),
    planted=_planted(),
)


# ---------------------------------------------------------------- hidden inputs (this side only)

CFG = dict(vocab_size=78, block_size=12, n_layer=2, n_head=6, n_embd=30)  # 78, 6 and 30 divide by 2 and 3
PUBLIC_CFG = dict(vocab_size=64, block_size=8, n_layer=2, n_head=4, n_embd=16)  # the public test's GPT, t = 2


def _randn(gen, *shape, scale: float = 1.0):
    import torch
    return torch.randn(*shape, generator=gen) * scale


def _jobs(seed: int) -> dict[str, list[dict]]:
    """Per check, its jobs (inputs the probe runs on); the same job may serve several checks."""
    import torch
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    b, s = rng.choice((1, 3)), rng.choice((5, 7))
    need: dict[str, list[dict]] = {}
    for t in SIZES:
        n = 6 * rng.randint(1, 4)                                   # a last dimension every t divides
        for op in ("f", "g", "gather", "scatter"):
            full = op in ("f", "scatter")
            xs = [_randn(gen, b, s, n if full or op == "g" else n // t) for _ in range(t)]
            if op in ("f", "scatter"):
                xs = [xs[0]] * t                                     # the same input on every rank
            w_shape = (b, s, n if op in ("f", "g", "gather") else n // t)
            job = {"name": f"{op} t={t}", "kind": "operator", "op": op, "t": t, "x": xs,
                   "w": [_randn(gen, *w_shape) for _ in range(t)]}
            for check in ((C_FG_FWD, C_FG_BWD, C_FG_BYTES) if op in ("f", "g") else (C_LAST,)):
                need.setdefault(check, []).append(job)
        for layer, flags in (("column", (False, True)), ("row", (True, False))):
            for flag in flags:
                parts = 1
                d_in = rng.choice((7, 17)) if layer == "column" else 6 * rng.randint(1, 4)
                d_out = 6 * rng.randint(1, 3) if layer == "column" else rng.choice((5, 13))
                weight, bias = _randn(gen, d_out, d_in, scale=0.3), _randn(gen, d_out)
                x = _randn(gen, b, s, d_in)
                if layer == "row" and flag:
                    xs = [x.narrow(-1, r * d_in // t, d_in // t).contiguous() for r in range(t)]
                else:
                    xs = [x] * t
                w = _randn(gen, b, s, d_out)
                if layer == "column" and not flag:
                    from scaletrain.tp.layers import shard
                    ws = [shard(w, dim=2, rank=r, world_size=t, parts=parts) for r in range(t)]
                else:
                    ws = [w] * t
                job = {"name": f"{layer} flag={flag} t={t}", "kind": "layer", "layer": layer, "flag": flag, "t": t,
                       "parts": parts, "weight": weight, "bias": bias, "x": xs, "w": ws, "x_full": x, "w_full": w}
                for check in ((C_COL_FWD, C_COL_BWD) if layer == "column" else (C_ROW_FWD, C_ROW_BWD)):
                    need.setdefault(check, []).append(job)
        for heads in (t, t * rng.choice((2, 3))):                  # head counts t divides, irregular head sizes
            h = heads * rng.choice((3, 5))
            need.setdefault(C_QKV, []).append(
                {"name": f"attention a={heads} t={t}", "kind": "attention", "t": t, "n_head": heads,
                 "qkv_w": _randn(gen, 3 * h, h, scale=0.3), "qkv_b": _randn(gen, 3 * h),
                 "proj_w": _randn(gen, h, h, scale=0.3), "proj_b": _randn(gen, h),
                 "x": _randn(gen, b, s, h), "w": _randn(gen, b, s, h)})
        h = 6 * rng.randint(1, 2)
        need.setdefault(C_MLP, []).append(
            {"name": f"mlp t={t}", "kind": "mlp", "t": t, "w1": _randn(gen, 4 * h, h, scale=0.3),
             "b1": _randn(gen, 4 * h),
             "w2": _randn(gen, h, 4 * h, scale=0.3), "b2": _randn(gen, h), "x": _randn(gen, b, s, h),
             "w": _randn(gen, b, s, h)})
        rows, vocab = rng.choice((7, 15)), 6 * rng.randint(3, 7)
        logits, targets = _randn(gen, rows, vocab, scale=6.0), torch.randint(0, vocab, (rows,), generator=gen)
        job = {"name": f"loss t={t}", "kind": "loss", "t": t, "targets": targets, "full": logits,
               "logits": [logits.narrow(-1, r * vocab // t, vocab // t).contiguous() for r in range(t)]}
        for check in (C_CE_FWD, C_CE_BWD, C_CE_MEM):
            need.setdefault(check, []).append(job)
        large = _randn(gen, rows, vocab, scale=3000.0)                # exp() of these overflows without a shift
        need.setdefault(C_CE_STABLE, []).append(
            {"name": f"loss large t={t}", "kind": "loss", "t": t, "targets": targets, "full": large,
             "logits": [large.narrow(-1, r * vocab // t, vocab // t).contiguous() for r in range(t)]})
        seq, width = 6 * rng.randint(1, 2), rng.choice((5, 7))
        for op in ("sp_gather", "sp_scatter"):
            shard_in = op == "sp_gather"
            xs = [_randn(gen, b, seq // t if shard_in else seq, width) for _ in range(t)]
            ws = [_randn(gen, b, seq if shard_in else seq // t, width) for _ in range(t)]
            job = {"name": f"{op} t={t}", "kind": "operator", "op": op, "t": t, "x": xs, "w": ws}
            for check in (C_SP_PAIR_FWD, C_SP_PAIR_BWD):
                need.setdefault(check, []).append(job)
        d_in, d_out = rng.choice((5, 9)), 6 * rng.randint(1, 3)
        weight, bias, x = _randn(gen, d_out, d_in, scale=0.3), _randn(gen, d_out), _randn(gen, b, seq, d_in)
        w = _randn(gen, b, seq, d_out)
        job = {"name": f"gather_linear t={t}", "kind": "gather_linear", "t": t, "seq": seq,
             "weight": [weight.narrow(0, r * d_out // t, d_out // t).contiguous() for r in range(t)],
             "bias": [bias.narrow(0, r * d_out // t, d_out // t).contiguous() for r in range(t)],
             "x": [x.narrow(1, r * seq // t, seq // t).contiguous() for r in range(t)],
             "w": [w.narrow(-1, r * d_out // t, d_out // t).contiguous() for r in range(t)],
             "full": (weight, bias, x, w)}
        for check in (C_SP_LIN, C_SP_LIN_SAVED):
            need.setdefault(check, []).append(job)
        for sp in (False, True):
            from scaletrain.models import GPTConfig, make_batch
            length = 12 if sp else s
            idx, tgt = make_batch(GPTConfig(**CFG), b, seed=seed + t, seq_len=length)
            job = {"name": f"gpt t={t} sp={sp}", "kind": "gpt", "t": t, "sp": sp, "cfg": CFG, "seed": seed % 1000,
                   "idx": idx, "targets": tgt}
            for check in ((C_SP_GPT, C_SP_MEM, C_SP_BYTES) if sp else (C_GPT, C_GPT_BYTES, C_SP_MEM)):
                need.setdefault(check, []).append(job)
    _public_gpt_jobs(need, seed)
    for layout in BUILD_LAYOUTS:  # last: a build that deadlocks leaves every job before it judged
        need.setdefault(C_MESH_BUILD, []).append({"name": f"mesh {layout}", "kind": "mesh", "t": WORLD,
                                                  "layout": layout, "timeout_s": PG_TIMEOUT_S})
    return need


BUILD_LAYOUTS = ((2, 1, 2), (1, 2, 2), (2, 2, 1))  # (dp, pp, tp) of the 4 ranks


def grid_layouts(seed: int) -> list[tuple[int, int, int]]:
    """Hidden (dp, pp, tp) layouts for the pure grid (irregular degrees, up to 48 ranks), the builds' last."""
    rng = random.Random(seed + 5)
    hidden = {(3, 1, 2), (1, 5, 3), (2, 3, 4), (1, 1, 1)}
    while len(hidden) < 7:
        hidden.add((rng.randint(1, 4), rng.randint(1, 4), rng.choice((2, 3, 4))))
    return sorted(hidden) + list(BUILD_LAYOUTS)


def _public_gpt_jobs(need: dict, seed: int) -> None:
    """The public test's GPT at t = 2, sequence lengths 7 (TP) and 8 (SP), 3 sequences; values
    checked as for the hidden GPT (issue 27: the hidden suite runs every public case)."""
    from scaletrain.models import GPTConfig, make_batch
    for sp, length in ((False, 7), (True, 8)):
        idx, tgt = make_batch(GPTConfig(**PUBLIC_CFG), 3, seed=seed + 7, seq_len=length)
        job = {"name": f"public gpt t=2 sp={sp}", "kind": "gpt", "t": 2, "sp": sp, "cfg": PUBLIC_CFG,
               "seed": seed % 1000, "idx": idx, "targets": tgt}
        need.setdefault(C_SP_GPT if sp else C_GPT, []).append(job)


# ---------------------------------------------------------------- references (this side only)

def _linear(weight, bias):
    import torch
    import torch.nn as nn
    lin = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        lin.weight.copy_(weight)
        lin.bias.copy_(bias)
    return lin


def _reference(job: dict) -> dict:
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


def _close(actual, expected, what: str) -> None:
    import torch
    if not isinstance(actual, torch.Tensor):
        raise AssertionError(f"{what}: expected a tensor of shape {tuple(expected.shape)}, got {actual!r}"[:300])
    checks.assert_close(actual, expected.to(actual.dtype) if actual.dtype.is_floating_point else expected,
                        rtol=RTOL, what=what)


def _bytes(got, want: int, what: str, hint: str) -> None:
    if got != want:
        raise AssertionError(f"{what}: handed {got} B to isend, expected {want} B ({hint})")


# ---------------------------------------------------------------- judging one rank's outputs

def _judge_operator(job, out, ref, r, check):
    import torch
    from scaletrain.tp.cost import allreduce_bytes, gather_bytes

    op, t, xs, ws = job["op"], job["t"], job["x"], job["w"]
    at = f"{op} (t={t}), rank {r}"
    cat_w = lambda dim: torch.cat(ws, dim=dim)  # noqa: E731
    n_x = xs[r].numel()
    if op == "f":
        want = (xs[r], sum(ws), 0, allreduce_bytes(n_x, t),
                "nothing forward, one allreduce of the input's size backward")
    elif op == "g":
        want = (sum(xs), ws[r], allreduce_bytes(n_x, t), 0, "one allreduce forward, nothing backward")
    elif op == "gather":
        k = xs[r].shape[-1]
        want = (torch.cat(xs, dim=-1), ws[r].narrow(-1, r * k, k), gather_bytes(n_x * t, t), 0,
                "an all-gather forward, nothing backward")
    elif op == "scatter":
        k = xs[r].shape[-1] // t
        want = (xs[r].narrow(-1, r * k, k), cat_w(-1), 0, gather_bytes(n_x, t),
                "nothing forward, an all-gather backward")
    elif op == "sp_gather":
        k = xs[r].shape[1]
        want = (torch.cat(xs, dim=1), sum(ws).narrow(1, r * k, k), gather_bytes(n_x * t, t), gather_bytes(n_x * t, t),
                "an all-gather forward, a reduce-scatter backward")
    else:  # sp_scatter
        k = xs[r].shape[1] // t
        want = (sum(xs).narrow(1, r * k, k), cat_w(1), gather_bytes(n_x, t), gather_bytes(n_x, t),
                "a reduce-scatter forward, an all-gather backward")
    y, grad, fwd, bwd, hint = want
    parts = OPERATOR_PARTS[check]
    if "y" in parts:
        _close(out["y"], y, f"{at}: forward output")
    if "grad" in parts:
        if out.get("skipped"):
            raise AssertionError(f"{at}: {out['skipped']}")
        _close(out["x_grad"], grad, f"{at}: input gradient")
    if "fwd" in parts:
        _bytes(out["sent_forward"], fwd, f"{at}, forward", hint)
    if "bwd" in parts:
        _bytes(out["sent_backward"], bwd, f"{at}, backward", hint)


# what each check judges of an operator's job: forward output, input gradient, bytes of each phase
OPERATOR_PARTS = {C_FG_FWD: ("y",), C_FG_BWD: ("grad",), C_FG_BYTES: ("fwd", "bwd"), C_LAST: ("y", "grad", "fwd", "bwd"),
                  C_SP_PAIR_FWD: ("y", "fwd"), C_SP_PAIR_BWD: ("grad", "bwd")}


def _layer_at(job, r) -> str:
    flag = "gather_output" if job["layer"] == "column" else "input_is_parallel"
    return f"{job['layer']}-parallel layer ({flag}={job['flag']}, t={job['t']}), rank {r}"


def _judge_weights(job, out, r):
    """The slices of the unsharded weight and bias the layer took (judged before anything it computed)."""
    from scaletrain.tp.layers import shard

    t, parts, at = job["t"], job["parts"], _layer_at(job, r)
    if job["layer"] == "column":
        where = dict(dim=0, rank=r, world_size=t, parts=parts)
        weight, bias = shard(job["weight"], **where), shard(job["bias"], **where)
        hint = "rows [r·out/t, (r+1)·out/t) of torch's (out, in) weight"
    else:
        weight, bias = shard(job["weight"], dim=1, rank=r, world_size=t), job["bias"]
        hint = "columns [r·in/t, (r+1)·in/t) of torch's (out, in) weight, the whole bias"
    for name, got, want in (("weight", out["weight"], weight), ("bias", out["bias"], bias)):
        shape = tuple(getattr(got, "shape", ()))
        if shape != tuple(want.shape):
            raise AssertionError(f"{at}: holds a {name} of shape {shape}, expected {tuple(want.shape)}: {hint}")
        _close(got, want, f"{at}: {name} taken from the unsharded layer ({hint})")


def _judge_layer(job, out, ref, r, check):
    """Forward (C_COL_FWD, C_ROW_FWD): the slices it took, its output, its forward bytes. Backward
    (C_COL_BWD, C_ROW_BWD): its input, weight and bias gradients, its backward bytes."""
    from scaletrain.tp.cost import allreduce_bytes, gather_bytes
    from scaletrain.tp.layers import shard

    t, flag, column = job["t"], job["flag"], job["layer"] == "column"
    at, rows = _layer_at(job, r), dict(dim=0, rank=r, world_size=t)
    d_out, d_in = job["weight"].shape
    b_s = job["x_full"].numel() // d_in
    _judge_weights(job, out, r)
    if check in (C_COL_FWD, C_ROW_FWD):
        _close(out["y"], ref["y"] if (not column or flag) else shard(ref["y"], dim=2, rank=r, world_size=t),
               f"{at}: output")
        if column:
            _bytes(out["sent_forward"], gather_bytes(b_s * d_out, t) if flag else 0, f"{at}, forward",
                   "nothing, or one all-gather with gather_output")
        else:
            _bytes(out["sent_forward"], allreduce_bytes(b_s * d_out, t), f"{at}, forward",
                   "g: one allreduce of the partial sums")
        return
    if out.get("skipped"):
        raise AssertionError(f"{at}: {out['skipped']}")
    x_grad = ref["x_grad"]
    if not column and flag:
        x_grad = x_grad.narrow(-1, r * (d_in // t), d_in // t)
    _close(out["x_grad"], x_grad, f"{at}: input gradient")
    w_grad = shard(ref["weight_grad"], **rows) if column else shard(ref["weight_grad"], dim=1, rank=r, world_size=t)
    _close(out["weight_grad"], w_grad, f"{at}: weight gradient")
    _close(out["bias_grad"], shard(ref["bias_grad"], **rows) if column else ref["bias_grad"], f"{at}: bias gradient")
    if column:
        _bytes(out["sent_backward"], allreduce_bytes(b_s * d_in, t), f"{at}, backward", "f: one allreduce of dL/dX")
    else:
        _bytes(out["sent_backward"], 0 if flag else gather_bytes(b_s * d_in, t), f"{at}, backward",
               "nothing, or one all-gather of the input's gradient when the layer sliced X itself")


def _held_rows(job, local, r) -> list[int]:
    """The rows of the unsharded QKV weight that rank r's (3h/t, h) slice holds, checked to be whole
    heads, the same heads in Q, K and V, in block order (the property every correct split has)."""
    import torch
    full, t, heads = job["qkv_w"], job["t"], job["n_head"]
    h, at = full.shape[1], f"attention (a={heads} heads, t={t}), rank {r}"
    d, mine = h // heads, heads // t
    if not isinstance(local, torch.Tensor) or tuple(local.shape) != (3 * h // t, h):
        raise AssertionError(f"{at}: holds a QKV weight of shape {tuple(getattr(local, 'shape', ()))}, expected "
                             f"{(3 * h // t, h)}: a/t = {mine} heads of {d} rows in each of Q, K and V")
    rows = []
    for i, row in enumerate(local):
        hit = (full == row).all(dim=1).nonzero().flatten().tolist()
        if not hit:
            raise AssertionError(f"{at}: row {i} of its QKV weight is no row of the unsharded weight")
        rows.append(hit[0])
    blocks = [rows[k * h // t:(k + 1) * h // t] for k in range(3)]
    for k, name in enumerate("QKV"):
        if any(not k * h <= i < (k + 1) * h for i in blocks[k]):
            raise AssertionError(f"{at}: block {k} of its QKV weight (its {name}) holds rows outside the unsharded "
                                 f"{name} rows [{k * h}, {(k + 1) * h}); the output must be its share of Q, K, V in order")
    heads_of = [sorted({(i - k * h) // d for i in blocks[k]}) for k in range(3)]
    for k, name in enumerate("QKV"):
        want = [(i - k * h) for i in blocks[k]]
        whole = [x * d + j for x in heads_of[k] for j in range(d)]
        if len(heads_of[k]) != mine or want != whole:
            raise AssertionError(f"{at}: its {name} rows {want[:8]}{'...' if len(want) > 8 else ''} are not {mine} "
                                 f"whole heads of {d} rows each (heads {heads_of[k]}): a head split over ranks "
                                 "needs the others' rows to compute its attention")
    if not heads_of[0] == heads_of[1] == heads_of[2]:
        raise AssertionError(f"{at}: holds Q of heads {heads_of[0]}, K of {heads_of[1]}, V of {heads_of[2]}: "
                             "a head's attention needs its own Q, K and V")
    return rows


def _judge_attention(job, out, ref, r, check):
    t, at = job["t"], f"attention (a={job['n_head']} heads, t={job['t']}), rank {r}"
    rows = _held_rows(job, out["qkv_w"], r)
    _close(out["y"], ref["y"], f"{at}: output (the row-parallel projection takes its heads' columns in rank order)")
    if out.get("skipped"):
        raise AssertionError(f"{at}: {out['skipped']}")
    _close(out["x_grad"], ref["x_grad"], f"{at}: input gradient")
    _close(out["qkv_w_grad"], ref["qkv_w_grad"][rows], f"{at}: gradient of its QKV rows")
    _close(out["qkv_b_grad"], ref["qkv_b_grad"][rows], f"{at}: gradient of its QKV bias")
    k = ref["proj_w_grad"].shape[1] // t
    _close(out["proj_w_grad"], ref["proj_w_grad"].narrow(1, r * k, k), f"{at}: gradient of its projection columns")


def _judge_mlp(job, out, ref, r, check):
    from scaletrain.tp.cost import allreduce_bytes
    at, n = f"MLP (t={job['t']}), rank {r}", job["x"].numel()
    _close(out["y"], ref["y"], f"{at}: output")
    if out.get("skipped"):
        raise AssertionError(f"{at}: {out['skipped']}")
    _close(out["x_grad"], ref["x_grad"], f"{at}: input gradient")
    for phase in ("forward", "backward"):
        _bytes(out[f"sent_{phase}"], allreduce_bytes(n, job["t"]), f"{at}, {phase}",
               "one allreduce of b·s·h: the GeLU runs on each rank's columns, no communication between the layers")


def _judge_loss(job, out, ref, r, check):
    t, (rows, vocab) = job["t"], job["full"].shape
    at = f"cross-entropy (N={rows}, V={vocab}, t={t}), rank {r}"
    if check == C_CE_MEM:
        if out["largest"] > rows * vocab // t:
            raise AssertionError(f"{at}: a tensor of {out['largest']} elements was made; this rank's logits have "
                                 f"{rows * vocab // t} and the whole logits {rows * vocab}: reduce the max, the "
                                 "target logit and the sum of exponentials instead of gathering the logits")
        limit = 4 * rows * vocab // t + 16 * rows
        if out["saved"] > limit:
            raise AssertionError(f"{at}: saved {out['saved']} B for backward, at most {limit} (this rank's softmax "
                                 "slice and per-row indices)")
        return
    if check == C_CE_STABLE:
        at += f", logits up to {float(job['full'].abs().max()):.0f}"
    if check in (C_CE_FWD, C_CE_STABLE):
        _close(out["loss"], ref["loss"].reshape(1), f"{at}: loss")
    if check in (C_CE_BWD, C_CE_STABLE):
        if out.get("skipped"):
            raise AssertionError(f"{at}: {out['skipped']}")
        k = vocab // t
        _close(out["grad"], ref["grad"].narrow(-1, r * k, k), f"{at}: gradient of this rank's logits")


def _judge_gather_linear(job, out, ref, r, check):
    from scaletrain.tp.cost import gather_bytes
    t, seq = job["t"], job["seq"]
    at = f"sequence-gather linear (s={seq}, t={t}), rank {r}"
    d_out = job["full"][0].shape[0]
    k, c = seq // t, d_out // t
    shard_bytes = job["x"][r].numel() * 4
    if check == C_SP_LIN_SAVED:
        if out["saved"] > shard_bytes:
            raise AssertionError(f"{at}: saved {out['saved']} B for backward, at most {shard_bytes} (the (b, s/t, h) "
                                 "shard; the gathered input is t times that): save the shard, all-gather it again in "
                                 "backward")
        return
    _close(out["y"], ref["y"].narrow(-1, r * c, c), f"{at}: output (the whole sequence, this rank's columns)")
    if out.get("skipped"):
        raise AssertionError(f"{at}: {out['skipped']}")
    _close(out["x_grad"], ref["x_grad"].narrow(1, r * k, k), f"{at}: gradient of this rank's sequence shard")
    _close(out["weight_grad"], ref["weight_grad"].narrow(0, r * c, c), f"{at}: weight gradient")
    _close(out["bias_grad"], ref["bias_grad"].narrow(0, r * c, c), f"{at}: bias gradient")
    _bytes(out["sent_forward"], gather_bytes(job["x"][r].numel() * t, t), f"{at}, forward", "one all-gather")


def _judge_gpt(job, out, ref, r, check):
    from scaletrain.tp import activations, cost
    from scaletrain.tp.gpt import gpt_shard

    t, sp, cfg = job["t"], job["sp"], job["cfg"]
    at = f"GPT (t={t}, sequence_parallel={sp}), rank {r}"
    b, s = job["idx"].shape
    if check in (C_GPT, C_SP_GPT):
        _close(out["loss"], ref["loss"].reshape(1), f"{at}: loss")
        v = cfg["vocab_size"] // t
        _close(out["logits"], ref["logits"].narrow(-1, r * v, v), f"{at}: this rank's logits")
        grads = out["grads"]
        for name, full in ref["grads"].items():
            if name not in grads:
                raise AssertionError(f"{at}: no gradient named {name}")
            _close(grads[name], gpt_shard(name, full, rank=r, world_size=t), f"{at}: gradient of {name}")
    elif check in (C_GPT_BYTES, C_SP_BYTES):
        kw = dict(batch_size=b, seq_len=s, hidden=cfg["n_embd"], n_layer=cfg["n_layer"], t=t, sequence_parallel=sp)
        for phase in ("forward", "backward"):
            want = cost.gpt_step_bytes(**kw, forward=phase == "forward", backward=phase == "backward")
            _bytes(out[f"sent_{phase}"], want, f"{at}, {phase}",
                   "per layer the conjugates of 2 all-gathers and 2 reduce-scatters of b·s·h, and 2 re-gathers "
                   "in the backward" if sp else "per layer 2 allreduces of b·s·h each way (equation 5)")
    else:
        want = cfg["n_layer"] * activations.block_activation_bytes(
            batch_size=b, seq_len=s, hidden=cfg["n_embd"], n_head=cfg["n_head"], tp=t, sequence_parallel=sp)
        if out["blocks_saved"] != want:
            split = ("every activation split t ways" if sp
                     else "LayerNorm and projection inputs whole, the rest split t ways")
            raise AssertionError(f"{at}: the blocks saved {out['blocks_saved']} B for backward, the formula "
                                 f"{want} B ({split})")


def _grid_at(layout) -> str:
    dp, pp, tp = layout
    return f"3D grid dp={dp}, pp={pp}, tp={tp} ({dp * pp * tp} ranks)"


def judge_grid(layout, got) -> None:
    """`got` (the probe's `grid` for `layout`): coords and rank_of inverse and in range; per axis, the
    groups partition the ranks into groups of the degree, sharing the other coordinates, in the order of
    their coordinate on the axis (a rank's position in its group is its coordinate)."""
    at, degrees, n = _grid_at(layout), dict(zip(AXES, layout)), layout[0] * layout[1] * layout[2]
    if "error" in got:
        raise AssertionError(f"{at}: raised {got['error'][0]}: {got['error'][1]}")
    coords = [tuple(c) for c in got["coords"]]
    for r, c in enumerate(coords):
        if any(not 0 <= v < d for v, d in zip(c, layout)):
            raise AssertionError(f"{at}: coords({r}) = (dp, pp, tp) {c}, outside the degrees {layout}")
        if got["rank_of"][r] != r:
            raise AssertionError(f"{at}: rank_of{c} = {got['rank_of'][r]}, but coords({r}) = {c}: not inverse")
    for k, axis in enumerate(AXES):
        groups = got["groups"][axis]
        if sorted(r for g in groups for r in g) != list(range(n)):
            raise AssertionError(f"{at}: the {axis} groups {groups[:6]} do not hold every rank exactly once")
        for g in groups:
            if len(g) != degrees[axis]:
                raise AssertionError(f"{at}: the {axis} group {g} has {len(g)} ranks, {axis} = {degrees[axis]}")
            if [coords[r][k] for r in g] != list(range(degrees[axis])):
                raise AssertionError(f"{at}: in the {axis} group {g} the ranks' {axis} coordinates are "
                                     f"{[coords[r][k] for r in g]}, not 0..{degrees[axis] - 1} in order")
            if len({tuple(v for i, v in enumerate(coords[r]) if i != k) for r in g}) != 1:
                raise AssertionError(f"{at}: the {axis} group {g} holds ranks that differ on another axis "
                                     f"(coords {[coords[r] for r in g]})")


def judge_nodes(layout, got) -> None:
    """Each tp group is tp consecutive ranks starting at a multiple of tp: inside one node whenever tp
    divides the GPUs per node (ranks numbered node by node)."""
    tp = layout[2]
    for g in got["groups"]["tp"]:
        if g != list(range(g[0], g[0] + tp)) or g[0] % tp:
            raise AssertionError(f"{_grid_at(layout)}: the tp group {g} is not {tp} consecutive ranks from a multiple "
                                 f"of {tp}: on nodes of 8 GPUs its allreduces (one per layer, forward and backward) "
                                 "would cross the slower links between nodes")


def _judge_mesh(job, out, ref, r, check):
    """One rank's Mesh after the student's build, against the student's own grid for the layout
    (judged valid by `judge_grid` first) and what a sum over each group reached."""
    layout, got = tuple(job["layout"]), ref.get("grid")
    at = f"{_grid_at(layout)}, build on rank {r}"
    if got is None:
        raise AssertionError(f"{at}: the grid's coords and groups did not come back")
    judge_grid(layout, got)
    if tuple(out["coords"]) != tuple(got["coords"][r]):
        raise AssertionError(f"{at}: Mesh.coords {tuple(out['coords'])}, but coords({r}) = {tuple(got['coords'][r])}")
    for k, axis in enumerate(AXES):
        mine = next(g for g in got["groups"][axis] if r in g)
        if out["ranks"][axis] != mine:
            raise AssertionError(f"{at}: mesh.{axis}_ranks {out['ranks'][axis]}, but groups('{axis}') puts rank {r} "
                                 f"in {mine}")
        if out["position"][axis] != got["coords"][r][k]:
            raise AssertionError(f"{at}: position {out['position'][axis]} in mesh.{axis}_group, but its {axis} "
                                 f"coordinate is {got['coords'][r][k]}")
        if out["reached"][axis] != mine:
            raise AssertionError(f"{at}: a sum over mesh.{axis}_group reached ranks {out['reached'][axis]}, expected "
                                 f"{mine}: the group object is not the group of those ranks")


JUDGES = {"operator": _judge_operator, "layer": _judge_layer, "attention": _judge_attention, "mlp": _judge_mlp, "loss": _judge_loss,
          "gather_linear": _judge_gather_linear, "gpt": _judge_gpt, "mesh": _judge_mesh}


def _rank_failure(jobs: list[dict], per_rank: list) -> Exception | None:
    """The first failure among `jobs` on any rank, rebuilt for `classify`: a rank's own error before
    a timeout its peer saw waiting for it (and before a gloo transport error)."""
    from autograder.untrusted import StudentCrash

    for job in jobs:
        errors = [out[job["name"]]["error"] for out in per_rank[:job["t"]] if "error" in out.get(job["name"], {})]
        if not errors:
            continue
        own = [e for e in errors if e[0] != "TimeoutError" and "gloo/transport" not in e[1]
               and "Connection closed" not in e[1]]
        kind, message = (own or [e for e in errors if e[0] == "TimeoutError"] or errors)[0]
        known = {"AssertionError": AssertionError, "NotImplementedError": NotImplementedError,
                 "Flagged": checks.Flagged, "TimeoutError": TimeoutError}
        return known[kind](message) if kind in known else StudentCrash(f"{kind}: {message}")
    return None


def _wire_job(job: dict) -> dict:
    """What the probe receives: the inputs, never the parts only this side uses."""
    return {k: v for k, v in job.items() if k not in ("full", "x_full", "w_full")}


def group_ranks(ctx):
    import torch
    torch.set_num_threads(1)  # the ranks have the cores
    seed = checks.trial_seeds(1, salt=66)[0]
    need, layouts = _jobs(seed), grid_layouts(seed)
    jobs = list({j["name"]: j for js in need.values() for j in js}.values())
    refs = {job["name"]: _reference(job) for job in jobs}  # before any student code runs
    worker, failure, ranks_ok, per_rank, grids = ctx.untrusted(), None, False, [], None
    try:
        worker.call(PROBE + "load", timeout_s=90)
        per_rank = worker.call(PROBE + "run_ranks", [_wire_job(j) for j in jobs], WORLD, PG_TIMEOUT_S,
                               SPAWN_TIMEOUT_S, timeout_s=SPAWN_TIMEOUT_S + 30)
        if not (isinstance(per_rank, list) and len(per_rank) == WORLD and all(isinstance(o, dict) for o in per_rank)):
            raise AssertionError(f"the ranks' outputs are malformed: {str(per_rank)[:80]}")
        ranks_ok = True
        grids = worker.call(PROBE + "grid", layouts, timeout_s=30)  # after the ranks: a hang here costs 6.5 only
        if not (isinstance(grids, list) and len(grids) == len(layouts) and all(isinstance(g, dict) for g in grids)):
            raise AssertionError(f"the grid's outputs are malformed: {str(grids)[:80]}")
    except Exception as exc:  # noqa: BLE001 - reported inside every check below
        failure = exc
    for job in need[C_MESH_BUILD]:
        refs[job["name"]]["grid"] = None if grids is None else grids[layouts.index(tuple(job["layout"]))]
    for name in CHECKS:
        with ctx.check(name):
            if failure is not None and (not ranks_ok or name in (C_MESH_GRID, C_MESH_NODES)):
                raise failure
            if name in (C_MESH_GRID, C_MESH_NODES):
                for layout, got in zip(layouts, grids):
                    try:
                        (judge_grid if name == C_MESH_GRID else judge_nodes)(layout, got)
                    except (KeyError, TypeError, IndexError, ValueError) as exc:
                        raise AssertionError(f"{_grid_at(layout)}: the outputs that came back are malformed "
                                             f"({type(exc).__name__}: {exc})") from None
                continue
            for job in need[name]:  # job by job: a layer's weights are judged before its forward's failure
                for r in range(job["t"]):
                    partial = per_rank[r].get(job["name"], {}).get("partial")
                    if job["kind"] == "layer" and isinstance(partial, dict):
                        _judge_weights(job, partial, r)
                    elif job["kind"] == "attention" and isinstance(partial, dict):
                        _held_rows(job, partial.get("qkv_w"), r)
                problem = _rank_failure([job], per_rank)
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
