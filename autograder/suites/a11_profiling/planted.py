"""a11's planted submissions: each an edit of the solution and the outcomes it must get."""

from __future__ import annotations

from autograder.attacks import IMPORTER, function_attacks
from autograder.manifest import REPO, Planted

from .names import (C_BREAKDOWN, C_CAT_BWD, C_CAT_FWD, C_CAT_ONE, C_CAT_SYS, C_COUNTED, C_DROP_FREE, C_EW, C_GATES,
                    C_IDENTITY, C_KEEP, C_MFU, C_MM_BYTES, C_MM_FLOPS, C_NORM, C_SCALED, C_THETA, CATEGORIES_F, COST,
                    PLD, SOURCES, TABLES)

_CATEGORISE = ('    name = name.rpartition("evaluate_function: ")[2] or name'
               "  # the autograd node inside the engine's wrapper\n")
_BREAKDOWN = "    out: dict[tuple[str, str], float] = defaultdict(float)\n"
_MATMUL = "    return Cost(2 * batch * m * n * k, (operands + batch * m * n) * size)\n"
# torch counting the product for the student: the module's name hidden from the static check
_FLOP_COUNTER = ("    import torch\n"
                 f"    flop_counter = {IMPORTER}('torch.utils.flop_' + 'counter', fromlist=['x'])\n"
                 "    counter = flop_counter.FlopCounterMode(display=False)\n"
                 "    with counter:\n"
                 "        product = getattr(torch, name.removeprefix('aten::'))\n"
                 "        product(*[torch.empty(s, device='meta') for s in shapes if s])\n"
                 "    return Cost(counter.get_total_flops(), (operands + batch * m * n) * size)\n")
_KEEP = "    return [1.0 - i / num_layers * (1.0 - th) for i in range(1, num_layers + 1)]\n"
_GATES = "    draws = torch.rand(len(probs), generator=generator)\n"
_HEAD = "    logits = model.lm_head(model.ln_f(x))\n"
_BRANCHES = ("            x = x + block.attn(block.ln1(x)) / p\n            x = x + block.mlp(block.ln2(x)) / p\n")
# two designs that skip a dropped block's gradient, not its work, each beside gates that ignore the
# generator given: a plant per pair, not per attack (each check is judged on its own; selftest's time is shared)
_SKIPS_GRADIENT_NOT_WORK = {C_DROP_FREE: "failed", C_GATES: "failed", C_IDENTITY: "passed", C_SCALED: "passed",
                            C_KEEP: "passed"}
# the public test's names, answered from a table: right there, 'other' everywhere else
_PUBLIC_TABLE = ('    return ({"aten::addmm": "matmul", "aten::mm": "matmul", "aten::_softmax": "normalization",\n'
                 '            "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",\n'
                 '            "aten::native_layer_norm": "normalization", "aten::gelu": "activation",\n'
                 '            "aten::add": "elementwise", "aten::mul_": "elementwise", "AddmmBackward0": "matmul",\n'
                 '            "GeluBackward0": "activation", "aten::_foreach_mul_": "optimizer",\n'
                 '            "autograd::engine::evaluate_function: NativeLayerNormBackward0": "normalization",\n'
                 '            "c10d::allreduce_": "communication", "nccl:all_reduce": "communication"}\n'
                 '            .get(name, "other"))\n')


def _attacks() -> tuple[Planted, ...]:
    """Attacks on the grader itself (issue 13's catalogue), each in place of `category_seconds`'s
    answer (called once per profile: the report forger walks /tmp at each call): under the trusted
    split they earn nothing."""
    attacks = function_attacks(checks=[C_BREAKDOWN], module="scaletrain.profile.tables",
                               source=str(REPO / SOURCES[TABLES]), call="category_seconds(prof)")
    return tuple(Planted(name, TABLES, (_BREAKDOWN, body + "\n"), groups=("analysis",),
                         expect={C_BREAKDOWN: outcome, C_MFU: "passed"})
                 for name, (body, outcome) in attacks.items())


PLANTED = (
    # 11.1
    Planted("the engine's evaluate_function wrapper read as it is (its node not taken out)", CATEGORIES_F,
            (_CATEGORISE, ""), groups=("analysis",),
            expect={C_CAT_BWD: "failed", C_CAT_FWD: "passed", C_CAT_SYS: "passed"}),
    Planted("a table of the public test's names, 'other' for the rest (semantic cheat)", CATEGORIES_F,
            (_CATEGORISE, _PUBLIC_TABLE), groups=("analysis",),
            expect={C_CAT_FWD: "failed", C_CAT_BWD: "failed", C_CAT_SYS: "failed", C_CAT_ONE: "failed"}),
    *_attacks(),
    # 11.2
    Planted("matmul FLOPs off by 2x (one per multiply-add)", COST, (_MATMUL, _MATMUL.replace("2 * batch", "batch")),
            groups=("analysis",), expect={C_MM_FLOPS: "failed", C_MM_BYTES: "passed", C_EW: "passed"}),
    Planted("backward of LayerNorm and softmax priced as the forward (bytes that ignore the backward)", COST,
            ('        direction = "bwd" if "backward" in name else "fwd"\n', '        direction = "fwd"\n'),
            groups=("analysis",), expect={C_NORM: "failed", C_MM_FLOPS: "passed", C_EW: "passed"}),
    Planted("matmul cost of the public example for every shape (semantic cheat)", COST,
            (_MATMUL, "    return Cost(2 * 37 * 29 * 53, 4 * (37 * 53 + 53 * 29 + 37 * 29))\n"), groups=("analysis",),
            expect={C_MM_FLOPS: "failed", C_MM_BYTES: "failed", C_CAT_FWD: "passed"}),
    Planted("matmul FLOPs counted by torch's FlopCounterMode on meta tensors, imported at run time", COST,
            (_MATMUL, _FLOP_COUNTER), groups=("analysis",),
            expect={C_MM_FLOPS: "flagged", C_MM_BYTES: "flagged", C_CAT_FWD: "passed"}),
    Planted("op_cost loops forever on a matmul", COST, (_MATMUL, "    while True:\n        pass\n"),
            groups=("analysis",), timeout_s=40,
            expect={C_MM_FLOPS: "timeout", C_NORM: "timeout", C_CAT_FWD: "passed", C_BREAKDOWN: "passed"}),
    Planted("op_cost kills its process (crash)", COST, (_MATMUL, "    import os\n    os._exit(3)\n"),
            groups=("analysis",), expect={C_MM_FLOPS: "error", C_EW: "error", C_CAT_BWD: "passed", C_MFU: "passed"}),
    Planted("the reference imported (forbidden)", COST, ("from scaletrain.ops import traffic\n",
                                                         "from scaletrain.ops import traffic\n"
                                                         "from scaletrain.profile import cost as _reference\n"),
            groups=("analysis",), expect={C_MM_FLOPS: "flagged", C_NORM: "flagged", C_CAT_FWD: "passed"}),
    # 11.3
    Planted("MFU from the forward's FLOPs only (2NT: the backward ignored)", TABLES,
            ("    model = memory.training_flops(num_params=num_params, num_tokens=tokens)\n",
             "    model = memory.training_flops(num_params=num_params, num_tokens=tokens) / 3\n"),
            groups=("analysis",), expect={C_MFU: "failed", C_BREAKDOWN: "passed", C_COUNTED: "passed"}),
    # 11.4
    Planted("a schedule that drops the first layer most (keep probabilities increasing with depth)", PLD,
            (_KEEP, _KEEP.replace("range(1, num_layers + 1)]", "range(num_layers, 0, -1)]")),
            groups=("pld",), expect={C_KEEP: "failed", C_THETA: "passed"}),
    # a boundary the public tests exercise: the deepest layer's probability is θ(t)
    Planted("layer index off by one: the deepest layer keeps more than θ(t)", PLD,
            (_KEEP, _KEEP.replace("range(1, num_layers + 1)]", "range(num_layers)]")),
            groups=("pld",), expect={C_KEEP: "failed", C_THETA: "passed", C_IDENTITY: "passed"}),
    Planted("one shared draw for every layer (right frequencies, layers correlated)", PLD,
            (_GATES, "    draws = torch.rand(1, generator=generator).expand(len(probs))\n"),
            groups=("pld",), expect={C_GATES: "failed", C_KEEP: "passed"}),
    Planted("a dropped block computed and multiplied by 0 (the output right, nothing saved)", PLD,
            ("        if keep:  # Pre-LN: x + f(LN(x)); a dropped block is the identity\n" + _BRANCHES,
             "        g = 1.0 if keep else 0.0\n"
             "        x = x + g * block.attn(block.ln1(x)) / p\n"
             "        x = x + g * block.mlp(block.ln2(x)) / p\n"),
            groups=("pld",), expect={C_DROP_FREE: "failed", C_IDENTITY: "passed", C_SCALED: "passed"}),
    Planted("a dropped block run under no_grad and thrown away; gates from Python's random (frequencies right)", PLD,
            ((_BRANCHES, _BRANCHES + "        else:\n            with torch.no_grad():\n                block(x)\n"),
             (_GATES, "    import random\n    draws = torch.tensor([random.random() for _ in probs])\n")),
            groups=("pld",), expect=_SKIPS_GRADIENT_NOT_WORK),
    Planted("every block run, a dropped one's output not used; gates from torch's global generator", PLD,
            ((_BRANCHES, _BRANCHES + "        else:\n            _ = block(x)\n"),
             (_GATES, "    draws = torch.rand(len(probs))\n")),
            groups=("pld",), expect=_SKIPS_GRADIENT_NOT_WORK),
    Planted("the dropped blocks taken out of the model and not put back (right logits, a changed model)", PLD,
            (_HEAD, "    model.blocks = torch.nn.ModuleList(b for b, g in zip(model.blocks, gates) if g)\n" + _HEAD),
            groups=("pld",), expect={C_IDENTITY: "failed", C_SCALED: "passed", C_GATES: "passed"}),
    Planted("kept branches not rescaled by 1/p", PLD, (_BRANCHES, _BRANCHES.replace(" / p", "")),
            groups=("pld",), expect={C_SCALED: "failed", C_IDENTITY: "passed", C_DROP_FREE: "passed"}),
    Planted("syntax error", PLD, ("def sample_gates(", "def sample_gates(("),
            groups=("pld",), expect={C_THETA: "error", C_GATES: "error", C_DROP_FREE: "error"}),
)
