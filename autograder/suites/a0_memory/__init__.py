"""Assignment a0: memory and FLOPs estimation (`assignments/a0_memory/memory.py`).

Every estimator is compared with the reference `scaletrain.memory` on hidden random
configurations (seeded trials, relative error ≤ 1e-9: the answers are exact integers), with the
seed's and the ZeRO paper's worked numbers, and with bytes measured in a real CPU step
(`scaletrain.memory_measure`). A worked number or a measurement at a fixed configuration can be
answered from a table: each of those checks is granted only when the function's checks on hidden
configurations passed in the same run (`Check.needs`, `grade.with_values`). Task 0.6's design (which
tensors autograd keeps) is the student's: it is graded against bytes measured in real steps of
seeded hidden GPTs, which no table answers. Checks are split by property (fp32 / mixed; t = 1 /
t > 1 / checkpointed; N dividing Ψ or not; with and without recomputation) so that a slip in one
case costs that case's share.

Every group is *trusted* (`Group.trusted`): the suite runs in a process that never imports the
submission; `ctx.remote("memory")` calls the student's functions in the sandboxed worker and
gets numbers back, and the reference, the expected values and the verdicts stay here. Each task
is graded on its own: the expected per-rank ZeRO bytes are computed by the reference with the
*student's* bytes_per_param answers (a wrong task 0.2 costs task 0.2 only), and the ZeRO paper's
table is checked with the paper's own 16 B/param handed to the student's function.
"""

from autograder.manifest import Check, Group, Manifest, Task

from .names import (C_ACT, C_ACT_CKPT, C_ACT_TP, C_BPP_FP32, C_BPP_MIXED, C_FLOPS, C_FLOPS_RECOMPUTE, C_GPT1,
                    C_MFU, C_NUMEL, C_PARAMS, C_STATE, C_TINY, C_TINY_CKPT, C_TINY_MEASURED, C_TINY_MEASURED_CKPT,
                    C_ZERO, C_ZERO_EVEN, C_ZERO_PAPER, F, SRC)
from .planted import PLANTED

_JUDGE = "autograder.suites.a0_memory.judge:"

MANIFEST = Manifest(
    assignment="a0", folder="a0_memory", title="Memory and FLOPs of training",
    files={F: SRC},
    tasks=(
        Task("0.1", "Parameter count of a GPT", file=F, functions=("gpt_num_params",)),
        Task("0.2", "Bytes per parameter: weights, gradients, optimizer state", file=F, functions=("bytes_per_param",)),
        Task("0.3", "Activation memory (Korthikanti et al.)", file=F, functions=("activation_bytes",)),
        Task("0.4", "ZeRO stages 0-3 per-rank memory", file=F, functions=("zero_memory_per_rank",)),
        Task("0.5", "Training FLOPs and MFU", file=F, functions=("training_flops", "mfu")),
        Task("0.6", "Predict the measured activations of the tiny GPT", file=F,
             functions=("tiny_gpt_activation_bytes",)),
    ),
    # the estimators are arithmetic: no torch, no copying the reference, no import tricks
    forbidden={F: ("scaletrain", "torch", "importlib", "__import__", "exec", "eval", "sys", "gc",
                   "inspect", "builtins")},
    groups=(
        Group("formulas", _JUDGE + "group_formulas", timeout_s=60, trusted=True, checks=(
            Check("0.1", C_PARAMS, 10),
            Check("0.2", C_BPP_FP32, 5),
            Check("0.2", C_BPP_MIXED, 5),
            Check("0.3", C_GPT1, 5, needs=(C_ACT, C_ACT_CKPT)),
            Check("0.3", C_ACT, 5),
            Check("0.3", C_ACT_TP, 5),
            Check("0.3", C_ACT_CKPT, 5),
            Check("0.4", C_ZERO_PAPER, 5, needs=(C_ZERO_EVEN,)),
            Check("0.4", C_ZERO_EVEN, 10),
            Check("0.4", C_ZERO, 5),
        )),
        Group("flops", _JUDGE + "group_flops", timeout_s=15, trusted=True, checks=(
            Check("0.5", C_FLOPS, 3),
            Check("0.5", C_FLOPS_RECOMPUTE, 2),
            Check("0.5", C_MFU, 5),
        )),
        Group("measured", _JUDGE + "group_measured", timeout_s=120, trusted=True, checks=(
            Check("0.1", C_NUMEL, 5, needs=(C_PARAMS,)),
            Check("0.2", C_STATE, 5, needs=(C_BPP_FP32,)),
            Check("0.6", C_TINY, 5),
            Check("0.6", C_TINY_CKPT, 5),
            Check("0.6", C_TINY_MEASURED, 5),
            Check("0.6", C_TINY_MEASURED_CKPT, 5),
        )),
    ),
    planted=PLANTED,
    public_boundary=('ZeRO shard rounded down (floor(Ψ/N), not ceil)',),
)
