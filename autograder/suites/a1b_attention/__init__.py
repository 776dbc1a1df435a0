"""Assignment a1b: FlashAttention forward and backward, and the fused cross-entropy, in Triton.

Every group is *trusted* (`Group.trusted`), as in a1: this module never imports the submission.
The sandboxed worker (autograder/probes/a1b_attention.py) launches the student's kernels through
the grader's own copy of the given wrappers into NaN-filled outputs; inputs go over as data,
outputs come back, and the reference -- float64 torch (scaled_dot_product_attention,
cross_entropy), computed here before the student's call -- and the verdicts stay here.

Graded on any machine: without a GPU the kernels run through the Triton interpreter, and each is
compiled for sm_80 by Triton's compiler.  On a GPU the speed group times the kernels against
torch's SDPA math and flash paths (`not_run` on CPU, points pending).
Correctness: seeded trials on irregular lengths (1, 17, 33, 129: rows and columns ending inside
a 16-wide tile), odd batch x heads, causal and not, fp32 / fp16 / bf16, scores near 1e4 (a
running max is needed), logits near 1e4, tiles with BLOCK_M != BLOCK_N (the tile shape is the
launcher's, where the running statistics live is the student's: any design must hold for any
tile); max-norm relative error (scaletrain.testing). Each check grades one property (ragged or
tile-multiple lengths, causal, one dtype, other tiles, forward or backward, dQ by the dq kernel or
by the dK/dV kernel's atomic adds).
A task's compile check is granted only when its kernels' correctness checks passed in the same run
(`Check.needs`, `grade.with_values`): an empty kernel compiles too.
Anti-cheat: no attention / softmax / loss library call in the student files (static check) and
none at run time (a TorchDispatchMode flags aten's kernels), and the check "keeps no n x n
matrix" flags any tensor of n x n elements made during the kernel call.
Roles: `names` (files, kernels, check names), `planted`, `judge` (trials and groups), `judge_speed` (GPU).
"""

from autograder.manifest import Check, Group, Manifest, Task

from .names import (AT, C_BF16, C_BWD, C_BWD_ATOMIC, C_BWD_BF16, C_BWD_CAUSAL, C_BWD_EVEN, C_BWD_FP16, C_BWD_TILES,
                    C_CAUSAL, C_CE_BWD, C_CE_FWD, C_CE_HUGE, C_DENSE, C_FP16, C_FWD_TILES, C_HUGE, C_SMOKE, CE,
                    COMPUTES, FORBIDDEN, SOURCES, SPEED, TRITON_KERNELS, compile_check)
from .planted import PLANTED

_S = "autograder.suites.a1b_attention."

MANIFEST = Manifest(
    assignment="a1b", folder="a1b_attention", title="FlashAttention and the fused cross-entropy",
    files=SOURCES,
    tasks=(
        Task("1b.1", "FlashAttention forward: online softmax over key tiles, the causal skip", file=AT,
             functions=("attention_fwd_kernel",)),
        Task("1b.2", "FlashAttention backward: P recomputed from the log-sum-exp", file=AT,
             functions=("attention_bwd_dkdv_kernel", "attention_bwd_dq_kernel")),
        Task("1b.3", "Fused cross-entropy with label smoothing, forward and backward", file=CE,
             functions=("cross_entropy_fwd_kernel", "cross_entropy_bwd_kernel")),
    ),
    forbidden={AT: FORBIDDEN, CE: FORBIDDEN},
    groups=(
        Group("smoke", _S + "judge:group_smoke", timeout_s=120, trusted=True, checks=(
            Check("1b.1", C_SMOKE, 8), Check("1b.1", C_HUGE, 4), Check("1b.1", C_CAUSAL, 8), Check("1b.1", C_DENSE, 4),
        )),
        Group("attention", _S + "judge:group_attention", timeout_s=300, trusted=True, checks=(
            Check("1b.1", C_FP16, 2), Check("1b.1", C_BF16, 1), Check("1b.1", C_FWD_TILES, 1),
            Check("1b.2", C_BWD, 6), Check("1b.2", C_BWD_EVEN, 3), Check("1b.2", C_BWD_CAUSAL, 4),
            Check("1b.2", C_BWD_FP16, 3), Check("1b.2", C_BWD_BF16, 3), Check("1b.2", C_BWD_TILES, 3),
            Check("1b.2", C_BWD_ATOMIC, 2),
        )),
        Group("cross_entropy", _S + "judge:group_cross_entropy", timeout_s=120, trusted=True, checks=(
            Check("1b.3", C_CE_FWD, 5), Check("1b.3", C_CE_BWD, 5), Check("1b.3", C_CE_HUGE, 4),
        )),
        Group("compile_triton", _S + "judge:group_compile_triton", timeout_s=300, trusted=True, checks=tuple(
            Check(task, compile_check(task), 2, needs=COMPUTES[task]) for task in TRITON_KERNELS)),
        Group("gpu_speed", _S + "judge_speed:group_gpu_speed", timeout_s=600, needs_gpu=True, trusted=True, checks=(
            Check("1b.1", SPEED["1b.1"], 10), Check("1b.2", SPEED["1b.2"], 8),
        )),
    ),
    planted=PLANTED,
    public_boundary=('causal mask off by one (hides the diagonal)',),
)
