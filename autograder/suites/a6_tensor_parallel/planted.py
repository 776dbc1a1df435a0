"""a6's planted submissions: a wrong answer per task (f's backward, the row layer's split and bias, the QKV
slice, the loss's memory, zeros and stabilization, the sequence-gather linear's saved input, g's
bytes, the 3D grid's layout, rank_of and group creation), a forbidden import, a deadlock, a crash,
and the attacks on the grader, each with the outcomes it must get."""

from __future__ import annotations

from autograder.attacks import IMPORTER, report_forger
from autograder.manifest import REPO, Planted

from .names import (CHECKS, C_CE_BWD, C_CE_FWD, C_CE_MEM, C_CE_STABLE, C_COL_BWD, C_COL_FWD, C_FG_BWD, C_FG_BYTES,
                    C_FG_FWD, C_GPT, C_GPT_BYTES, C_MESH_BUILD, C_MESH_GRID, C_MESH_NODES, C_MLP, C_QKV, C_ROW_BWD,
                    C_ROW_FWD, C_SP_GPT, C_SP_LIN, C_SP_LIN_SAVED, C_SP_MEM, C_SP_PAIR_FWD, LAYERS, LOSS, MESH, OPS,
                    SEQ)

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


_COORDS = "        dp = rank // (self.pp * self.tp)\n        pp, tp = rank // self.tp % self.pp, rank % self.tp\n"
_RANK_OF = "        return (dp * self.pp + pp) * self.tp + tp\n"


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
                 ("        return y if self.bias is None else y + self.bias"
                  "  # after the sum: added once, not t times\n",
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
                ((_COORDS, "        tp = rank // (self.dp * self.pp)\n"
                            "        dp, pp = rank // self.pp % self.dp, rank % self.pp\n"),
                 (_RANK_OF, "        return (tp * self.dp + dp) * self.pp + pp\n")),
                expect={C_MESH_GRID: "passed", C_MESH_NODES: "failed", C_MESH_BUILD: "passed", C_GPT: "passed"}),
        Planted("3D grid: rank_of swaps pp and tp", MESH,
                (_RANK_OF, "        return (dp * self.tp + tp) * self.pp + pp\n"),
                expect={C_MESH_GRID: "failed", C_MESH_NODES: "failed", C_MESH_BUILD: "passed"}),
        Planted("3D grid: each rank creates only the groups it belongs to", MESH,
                ("        for axis in axes:\n            for ranks in self.groups(axis):\n"
                 "                group = dist.new_group(ranks, timeout=timeout)\n",
                 "        for axis in axes:\n            for ranks in [g for g in self.groups(axis) if rank in g]:\n"
                 "                group = dist.new_group(ranks, timeout=timeout)\n"),
                # gloo pairs the ranks' new_group calls by their order: the ranks wait for peers that never
                # come, or join another group's peers and sum over the wrong ranks (seen in CI)
                expect={C_MESH_GRID: "passed", C_MESH_NODES: "passed", C_MESH_BUILD: ("timeout", "failed"),
                        C_GPT: "passed"}),
        *_attacks(),
    )


PLANTED = _planted()
