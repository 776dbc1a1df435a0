"""a0's planted submissions: each a one-line edit of the solution and the outcome it must get."""

from __future__ import annotations

from autograder.attacks import function_attacks
from autograder.manifest import REPO, Planted

from .names import (C_ACT, C_ACT_CKPT, C_ACT_TP, C_BPP_FP32, C_BPP_MIXED, C_FLOPS, C_FLOPS_RECOMPUTE, C_GPT1,
                    C_MFU, C_NUMEL, C_PARAMS, C_TINY, C_TINY_CKPT, C_TINY_MEASURED, C_ZERO, C_ZERO_EVEN,
                    C_ZERO_PAPER, F, SRC)

_RETURN = "    return embeddings + n_layer * per_layer + 2 * h + head"


def _attacks() -> tuple[Planted, ...]:
    """Attacks on the grader itself, each in place of task 0.1's answer (issue 13's catalogue).
    The static check forbids importlib, sys, inspect, builtins..., so each reaches for what it
    wants the way the static check cannot see; the trusted split must leave it nothing to earn."""
    attacks = function_attacks(
        checks=[C_PARAMS], module="scaletrain.memory", source=str(REPO / SRC),
        call="gpt_num_params(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, hidden=hidden, "
             "tied_embeddings=tied_embeddings)")
    return tuple(Planted(name, F, (_RETURN, body), groups=("formulas",), expect={C_PARAMS: outcome})
                 for name, (body, outcome) in attacks.items())


PLANTED = (
        Planted("task 0.3 left unimplemented", F,
            ("    per_layer = s * b * h * (4 * e + 2)", "    raise NotImplementedError('a0 task 0.3')\n    per_layer = s * b * h * (4 * e + 2)"),
            groups=("formulas",),
            expect={C_ACT: "failed",
                    C_GPT1: "failed",
                    C_PARAMS: "passed",
                    C_ZERO: "passed"}),
    Planted("mixed precision forgets the fp32 master copy (K = 8, not 12)", F,
            ("return 2, 2, 4 + moments", "return 2, 2, moments"), groups=("formulas",),
            expect={C_BPP_MIXED: "failed",
                    C_BPP_FP32: "passed",
                    C_ZERO_PAPER: "passed",
                    C_ZERO: "passed",
                    C_ACT_CKPT: "passed"}),
    # issue 27: a boundary the public tests exercise (10 parameters on 3 ranks) costs hidden marks too
    Planted("ZeRO shard rounded down (floor(Ψ/N), not ceil)", F,
            ("shard = -(-num_params // world_size)", "shard = num_params // world_size"), groups=("formulas",),
            expect={C_ZERO: "failed",
                    C_ZERO_EVEN: "passed",
                    C_ZERO_PAPER: "passed"}),
    # small mistakes cost their case's share only
    Planted("tensor parallelism divides the activations it leaves whole on every rank", F,
            ("per_layer = s * b * h * (4 * e + 2) + s * b", "per_layer = s * b * h * (4 * e + 2) // t + s * b"),
            groups=("formulas",), expect={C_ACT: "passed", C_ACT_TP: "failed", C_PARAMS: "passed"}),
    Planted("recomputation counted as half a forward (7ND)", F,
            ("(8 if recompute else 6)", "(7 if recompute else 6)"),
            groups=("flops",), expect={C_FLOPS: "passed", C_FLOPS_RECOMPUTE: "failed", C_MFU: "passed"}),
    Planted("tiny GPT: the checkpointed peak taken at the end of the forward only", F,
            ("    return max(inputs + embedding + head, inputs + embedding + layer - f * s * b * h)",
             "    return inputs + embedding + head"),
            groups=("measured",), expect={C_TINY: "passed", C_TINY_MEASURED: "passed", C_TINY_CKPT: "failed"}),
    # issue 28: a worked example answered from a table, no model behind it
    Planted("activation_bytes returns the seed's GPT-1 numbers (per sequence, checkpointed) for any shape", F,
            ("    s, b, h, L, a, t, e = seq_len, batch_size, hidden, n_layer, n_head, tp, bytes_per_element\n",
             "    return (38_535_168 if checkpointing else 349_175_808) * batch_size\n"),
            groups=("formulas",), expect={C_GPT1: "failed", C_ACT: "failed", C_ACT_CKPT: "failed"}),
    Planted("infinite loop", F, ("return (8 if recompute else 6) * num_params * num_tokens", "while True: pass"),
            groups=("flops",), expect={C_FLOPS: "timeout", C_MFU: "timeout"}),
    Planted("os._exit in mfu", F, ("return 6 * num_params * tokens_per_second / peak_flops_per_second",
                                   "import os; os._exit(3)"),
            groups=("flops",), expect={C_FLOPS: "passed", C_MFU: "error"}),
    Planted("exits the process with a success code at import", F,
            ("from dataclasses import dataclass, replace", "import os; os._exit(0)"), groups=("flops",),
            expect={C_FLOPS: "error", C_MFU: "error"}),
    *_attacks(),
    Planted("syntax error", F, ("def mfu(*,", "def mfu(*,,"),
            expect={C_FLOPS: "error", C_NUMEL: "error"}),
    Planted("copies the reference", F, ("from dataclasses import dataclass, replace",
                                        "from dataclasses import dataclass, replace\nfrom scaletrain import memory as _ref"),
            expect={C_PARAMS: "flagged", C_TINY_MEASURED: "flagged"}),
)
