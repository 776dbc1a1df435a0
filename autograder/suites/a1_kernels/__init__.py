"""Assignment a1: fused softmax and LayerNorm kernels, in Triton (part A) and CUDA C++ (part B).

Every group is *trusted* (`Group.trusted`): this module never imports the submission. The
sandboxed worker (autograder/probes/a1_kernels.py) launches the student's kernels through the
grader's own copy of the given wrappers, into outputs it fills with NaN first, so only the
student's kernels can produce the numbers (wrappers that compute in torch are never called);
inputs go over as data, outputs come back, and the reference, computed here first in float64
with torch's native ops, and the verdicts stay here.

Part A is graded on any machine: without a GPU the kernels run through the Triton interpreter,
and each kernel is compiled for sm_80 by Triton's real compiler. Part B's .cu files are compiled
by nvcc for sm_80 where nvcc exists (else `not_run`), in a worker that runs no Python of the
submission, and the verdict (errors, spills, kernels that never store) is read here from nvcc's
own report. On any machine they also run, unmodified, in the CUDA-on-CPU emulator
(scaletrain.ops.toolchain.cuda_cpu: host C++ with 32-lane warps, block barriers, guarded buffers) at small
shapes covering every launcher bucket: the `emulated_cuda` group. The GPU confirms that
correctness on the device and times the kernels (`not_run` here, points pending).

Correctness: seeded trials on hidden irregular shapes, every row-length regime (one element,
short rows sharing a program, rows longer than one tile, a fully masked first tile), masks and
causal mode, fp32 / fp16 / bf16, and tiles other than the launcher's (the kernels' design, how many
passes and where the running statistics live, is the student's: it must hold for any tile);
comparison by max-norm relative error (scaletrain.ops.testing: an all-zeros softmax scores 1.0 and
fails); inputs must be unmodified. Each check grades one property (ragged or power-of-two shapes,
long rows, masks, causal, one dtype, other tiles, forward or backward), so a slip costs its share.
Anti-cheat: no softmax / layer-norm library call in the student files (static check) and none at
run time (a TorchDispatchMode in the worker flags aten's softmax or layer-norm kernels).
A compile check (Triton's or nvcc's) is granted only when that kernel's correctness checks passed
in the same run (`Check.needs`, `grade.with_values`): an empty kernel compiles too.
Speed (GPU): this process's clock around worker calls that run a batch of the student's calls
(minus an empty batch), against naive composed PyTorch and torch's native op timed here on the
same inputs; >= 2x naive and >= 0.9x native at 8192 x 8192 fp32; the batch's last output is
sampled and checked; above peak bandwidth or > 10x native is flagged.
Roles: `names` (files, kernels, check names), `planted` (with CUDA_BUGS), `judge` (Triton kernels),
`judge_cuda` (nvcc and the emulator), `judge_speed` (GPU).
"""

from autograder.manifest import Check, Group, Manifest, Task

from .names import (C_DWDB, C_HUGE, C_LN_PARTIALS, C_LN_AFFINE, C_LN_BF16, C_LN_DX, C_LN_DX_BF16, C_LN_DX_FP16, C_LN_DX_NO_W,
                    C_LN_DX_TILES, C_LN_FP16, C_LN_FWD, C_LN_SHIFT, C_LN_TILES, C_PREFIX, C_SM_BF16, C_SM_BWD,
                    C_SM_BWD_BF16, C_SM_BWD_EVEN, C_SM_BWD_FP16, C_SM_BWD_TILES, C_SM_CAUSAL, C_SM_EVEN, C_SM_FP16,
                    C_SM_FWD, C_SM_LONG, C_SM_MASK, C_SM_TILES, C_SMOKE, COMPUTES, CUDA_KERNELS, EMULATED,
                    FORBIDDEN_CU, FORBIDDEN_PY, GPU_CUDA, LN, LNC, SM, SMC, SOURCES, SPEED_CHECKS, TRITON_KERNELS,
                    cuda_compile_check, speed_check, triton_compile_check)
from .planted import PLANTED

_S = "autograder.suites.a1_kernels."
_SPEED_TASKS = {("softmax", "fwd"): ("1.1", "1.6"), ("softmax", "bwd"): ("1.2", "1.7"),
                ("layer_norm", "fwd"): ("1.3", "1.8"), ("layer_norm", "bwd"): ("1.4", "1.9")}

MANIFEST = Manifest(
    assignment="a1", folder="a1_kernels", title="Fused softmax and LayerNorm kernels",
    files=SOURCES,
    tasks=(
        Task("1.1", "Triton softmax forward: stable, masked, causal", file=SM,
             functions=("_load_scores", "softmax_fwd_kernel")),
        Task("1.2", "Triton softmax backward", file=SM, functions=("softmax_bwd_kernel",)),
        Task("1.3", "Triton LayerNorm forward: one-pass shifted moments", file=LN,
             functions=("_moments", "layer_norm_fwd_kernel")),
        Task("1.4", "Triton LayerNorm backward for x: the alpha/beta rewrite", file=LN,
             functions=("_dx", "layer_norm_bwd_dx_kernel")),
        Task("1.5", "Triton LayerNorm backward for weight and bias: a cross-row reduction", file=LN,
             functions=("layer_norm_bwd_dwdb_kernel",)),
        Task("1.6", "CUDA softmax forward", file=SMC, functions=("softmax_fwd_rows", "softmax_fwd_looped")),
        Task("1.7", "CUDA softmax backward", file=SMC, functions=("softmax_bwd_rows", "softmax_bwd_looped")),
        Task("1.8", "CUDA LayerNorm forward", file=LNC, functions=("moments", "layer_norm_fwd_rows", "layer_norm_fwd_looped")),
        Task("1.9", "CUDA LayerNorm backward for x", file=LNC,
             functions=("layer_norm_dx", "layer_norm_bwd_rows", "layer_norm_bwd_looped")),
    ),
    forbidden={SM: FORBIDDEN_PY, LN: FORBIDDEN_PY, SMC: FORBIDDEN_CU, LNC: FORBIDDEN_CU},
    groups=(
        Group("smoke", _S + "judge:group_smoke", timeout_s=60, trusted=True, checks=(
            Check("1.1", C_SMOKE, 4), Check("1.1", C_HUGE, 3),
        )),
        Group("softmax", _S + "judge:group_softmax", timeout_s=240, trusted=True, checks=(
            Check("1.1", C_SM_FWD, 4), Check("1.1", C_SM_EVEN, 1), Check("1.1", C_SM_LONG, 4),
            Check("1.1", C_SM_MASK, 3), Check("1.1", C_SM_CAUSAL, 2), Check("1.1", C_PREFIX, 2),
            Check("1.1", C_SM_FP16, 2), Check("1.1", C_SM_BF16, 1), Check("1.1", C_SM_TILES, 2),
            Check("1.2", C_SM_BWD, 3), Check("1.2", C_SM_BWD_EVEN, 2), Check("1.2", C_SM_BWD_FP16, 1),
            Check("1.2", C_SM_BWD_BF16, 1), Check("1.2", C_SM_BWD_TILES, 1),
        )),
        Group("layer_norm", _S + "judge:group_layer_norm", timeout_s=240, trusted=True, checks=(
            Check("1.3", C_LN_FWD, 5), Check("1.3", C_LN_AFFINE, 2), Check("1.3", C_LN_SHIFT, 2),
            Check("1.3", C_LN_FP16, 1), Check("1.3", C_LN_BF16, 1), Check("1.3", C_LN_TILES, 1),
            Check("1.4", C_LN_DX, 4), Check("1.4", C_LN_DX_NO_W, 2), Check("1.4", C_LN_DX_FP16, 1),
            Check("1.4", C_LN_DX_BF16, 1), Check("1.4", C_LN_DX_TILES, 1), Check("1.4", C_LN_PARTIALS, 2),
            Check("1.5", C_DWDB, 3),
        )),
        Group("compile_triton", _S + "judge:group_compile_triton", timeout_s=300, trusted=True, checks=tuple(
            Check(task, triton_compile_check(task), 1, needs=COMPUTES[task]) for task in TRITON_KERNELS)),
        Group("compile_cuda", _S + "judge_cuda:group_compile_cuda", timeout_s=300, trusted=True, checks=tuple(
            Check(task, cuda_compile_check(task), 1, needs=(EMULATED[task],)) for task in CUDA_KERNELS)),
        Group("emulated_cuda", _S + "judge_cuda:group_emulated_cuda", timeout_s=300, trusted=True, checks=(
            Check("1.6", EMULATED["1.6"], 3), Check("1.7", EMULATED["1.7"], 2),
            Check("1.8", EMULATED["1.8"], 2), Check("1.9", EMULATED["1.9"], 2),
        )),
        Group("gpu_triton", _S + "judge_speed:group_gpu_triton", timeout_s=600, needs_gpu=True, trusted=True,
              checks=tuple(Check(_SPEED_TASKS[key][0], speed_check("Triton", what), 2)
                           for key, what in SPEED_CHECKS.items())),
        Group("gpu_cuda", _S + "judge_speed:group_gpu_cuda", timeout_s=900, needs_gpu=True, trusted=True, checks=(
            *(Check(task, name, 1) for task, name in GPU_CUDA.items()),
            *(Check(_SPEED_TASKS[key][1], speed_check("CUDA", what), 2) for key, what in SPEED_CHECKS.items()),
        )),
    ),
    planted=PLANTED,
    public_boundary=('the online softmax without its all -inf prefix guard',),
)
