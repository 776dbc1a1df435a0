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
causal mode, fp32 / fp16 / bf16; comparison by max-norm relative error (scaletrain.ops.testing:
an all-zeros softmax scores 1.0 and fails); inputs must be unmodified.
Anti-cheat: no softmax / layer-norm library call in the student files (static check) and none at
run time (a TorchDispatchMode in the worker flags aten's softmax or layer-norm kernels).
A compile check (Triton's or nvcc's) is granted only when that kernel's correctness checks passed
in the same run (`Check.needs`, `grade.with_values`): an empty kernel compiles too.
Speed (GPU): this process's clock around worker calls that run a batch of the student's calls
(minus an empty batch), against naive composed PyTorch and torch's native op timed here on the
same inputs; >= 2x naive and >= 0.9x native at 8192 x 8192 fp32; the batch's last output is
sampled and checked; above peak bandwidth or > 10x native is flagged.
"""

from __future__ import annotations

import random
import statistics
import time

from autograder import checks
from autograder.attacks import kernel_attacks
from autograder.manifest import REPO, Check, Group, Manifest, Planted, Task

SM, LN, SMC, LNC = "softmax_triton.py", "layer_norm_triton.py", "softmax.cu", "layer_norm.cu"
_S = "autograder.suites.a1_kernels"
PROBE = "autograder.probes.a1_kernels:"

_FORBIDDEN_PY = ("torch.softmax", "torch.log_softmax", "torch.layer_norm", "torch.nn", "torch.special",
                 "torch.ops", "torch._C", "torch.Tensor.softmax", "scaletrain.ops.naive", "scaletrain.ops.backends",
                 "scaletrain.ops.functional", "scaletrain.ops.cuda_ext", "scaletrain.ops.benchmark",
                 "scaletrain.ops.softmax", "scaletrain.ops.layer_norm", "scaletrain.ops.get_backend",
                 "importlib", "__import__", "exec", "eval", "runpy")
_FORBIDDEN_CU = ("torch", "ATen", "cudnn", "cub::", "<cub/")

C_SMOKE = "softmax forward on small irregular shapes"
C_HUGE = "softmax forward: huge logits stay finite (row max subtracted)"
C_PREFIX = "softmax forward on a long row whose first tile is fully masked"
C_LN_DX = "layer_norm backward dx on hidden shapes, long rows included"
C_DWDB = "layer_norm backward dweight and dbias"
C_SM_FWD = "softmax forward on hidden irregular and 3-D shapes"
C_SM_BWD = "softmax backward on hidden shapes, long rows included"
C_LN_FWD = "layer_norm forward on hidden shapes, long rows, with and without affine"
# a kernel's compile check is granted only with its correctness in the same run: an empty kernel compiles
COMPUTES = {"1.1": (C_SMOKE, C_SM_FWD), "1.2": (C_SM_BWD,), "1.3": (C_LN_FWD,), "1.4": (C_LN_DX,), "1.5": (C_DWDB,)}
TRITON_KERNELS = {"1.1": ("softmax_triton", "softmax_fwd_kernel"), "1.2": ("softmax_triton", "softmax_bwd_kernel"),
                  "1.3": ("layer_norm_triton", "layer_norm_fwd_kernel"),
                  "1.4": ("layer_norm_triton", "layer_norm_bwd_dx_kernel"),
                  "1.5": ("layer_norm_triton", "layer_norm_bwd_dwdb_kernel")}
CUDA_KERNELS = {"1.6": (SMC, "forward", ("softmax_fwd",)), "1.7": (SMC, "backward", ("softmax_bwd",)),
                "1.8": (LNC, "forward", ("layer_norm_fwd",)), "1.9": (LNC, "backward", ("layer_norm_bwd",))}


EMULATED = {"1.6": "CUDA softmax forward matches torch (CPU emulation): every bucket, masks, causal, 3 dtypes",
            "1.7": "CUDA softmax backward matches torch (CPU emulation): every bucket, 3 dtypes",
            "1.8": "CUDA layer_norm forward matches torch (CPU emulation): every bucket, 3 dtypes",
            "1.9": "CUDA layer_norm backward matches torch (CPU emulation): dx, dweight, dbias"}
# Bugs the emulator must catch (the selftest plants them; tests/test_cuda_cpu.py too): file, old, new.
CUDA_BUGS = {
    "CUDA softmax that writes zeros": (SMC, "for (int k = 0; k < VEC; ++k) v[c][k] *= inv_sum;",
                                       "for (int k = 0; k < VEC; ++k) v[c][k] = 0.f;"),
    "CUDA dweight/dbias without the __syncthreads between shared-memory writes and reads": (
        LNC, "  sb[threadIdx.y][threadIdx.x] = acc_b;\n  __syncthreads();\n",
        "  sb[threadIdx.y][threadIdx.x] = acc_b;\n"),
    "CUDA softmax sum reduced with wrong shuffle offsets (32 .. 2: lane ^ 32 is the lane itself, 1 is missing)": (
        SMC, "const float inv_sum = 1.f / row_reduce<THREADS>(thread_sum, SumOp());",
        "float total = thread_sum;\n  for (int m = kWarp; m > 1; m >>= 1)"
        " total += __shfl_xor_sync(0xffffffffu, total, m);\n  const float inv_sum = 1.f / total;"),
    "CUDA softmax with an off-by-one row bound (reads past the end of x)": (
        SMC, "if (row >= rows) return;  // uniform", "if (row > rows) return;  // uniform"),
}
_CUDA_BUG_OUTCOMES = {  # what each bug gets, and a check of another task that must still pass
    "CUDA softmax that writes zeros": {EMULATED["1.6"]: "failed", EMULATED["1.7"]: "passed"},
    "CUDA dweight/dbias without the __syncthreads between shared-memory writes and reads": {
        EMULATED["1.9"]: "error", EMULATED["1.8"]: "passed"},
    "CUDA softmax sum reduced with wrong shuffle offsets (32 .. 2: lane ^ 32 is the lane itself, 1 is missing)": {
        EMULATED["1.6"]: "failed", EMULATED["1.7"]: "passed"},
    "CUDA softmax with an off-by-one row bound (reads past the end of x)": {EMULATED["1.6"]: "error"},
}


def _triton_compile_check(task: str) -> str:
    return f"{TRITON_KERNELS[task][1]} compiles for sm_80 (Triton compiler)"


def _cuda_compile_check(task: str) -> str:
    cu, what, _ = CUDA_KERNELS[task]
    return f"{cu} {what} kernels compile for sm_80 (nvcc): no register spills, every kernel stores"


_ZEROS = ("y = num / tl.sum(num, axis=1)[:, None]", "y = num * 0.0")
_END_OF_KERNELS = "\n\ndef softmax_fwd("


def _attacks() -> tuple[Planted, ...]:
    """Attacks on the grader itself (issue 13's catalogue, `attacks.kernel_attacks`), each beside a
    softmax kernel that writes zeros: under the trusted split they earn nothing."""
    attacks = kernel_attacks(file=SM, kernel="softmax_fwd_kernel", anchor=_END_OF_KERNELS,
                             result_line="        y = num / tl.sum(num, axis=1)[:, None]\n", result="y",
                             zero="num * 0.0", checks=[C_SMOKE, C_HUGE], source=str(REPO / "kernels" / SM))
    return tuple(Planted(name, SM, replace, groups=("smoke",), expect={C_SMOKE: outcome})
                 for name, (replace, outcome) in attacks.items())


_TORCH_WRAPPER = ("    y = torch.empty_like(x)\n",
                  "    e = (x.float() - x.float().amax(-1, keepdim=True)).exp()\n"
                  "    return (e / e.sum(-1, keepdim=True)).to(x.dtype)\n    y = torch.empty_like(x)\n")


MANIFEST = Manifest(
    assignment="a1", folder="a1_kernels", title="Fused softmax and LayerNorm kernels",
    files={SM: "kernels/softmax_triton.py", LN: "kernels/layer_norm_triton.py",
           SMC: "kernels/softmax.cu", LNC: "kernels/layer_norm.cu"},
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
    forbidden={SM: _FORBIDDEN_PY, LN: _FORBIDDEN_PY, SMC: _FORBIDDEN_CU, LNC: _FORBIDDEN_CU},
    groups=(
        Group("smoke", f"{_S}:group_smoke", timeout_s=60, trusted=True, checks=(
            Check("1.1", C_SMOKE, 5),
            Check("1.1", C_HUGE, 4),
        )),
        Group("softmax", f"{_S}:group_softmax", timeout_s=180, trusted=True, checks=(
            Check("1.1", C_SM_FWD, 5),
            Check("1.1", "softmax forward on rows longer than one tile", 4),
            Check("1.1", "softmax forward with broadcast masks and causal mode", 5),
            Check("1.1", C_PREFIX, 2),
            Check("1.1", "softmax forward with fp16 and bf16 storage", 3),
            Check("1.2", C_SM_BWD, 6),
            Check("1.2", "softmax backward with fp16 and bf16 storage", 2),
        )),
        Group("layer_norm", f"{_S}:group_layer_norm", timeout_s=180, trusted=True, checks=(
            Check("1.3", C_LN_FWD, 7),
            Check("1.3", "layer_norm forward when |mean| is 1000x the standard deviation", 3),
            Check("1.3", "layer_norm forward with fp16 and bf16 storage", 2),
            Check("1.4", C_LN_DX, 7),
            Check("1.4", "layer_norm backward dx with fp16 and bf16 storage", 2),
            Check("1.5", C_DWDB, 5),
        )),
        Group("compile_triton", f"{_S}:group_compile_triton", timeout_s=300, trusted=True, checks=tuple(
            Check(task, _triton_compile_check(task), 1, needs=COMPUTES[task]) for task in TRITON_KERNELS)),
        Group("compile_cuda", f"{_S}:group_compile_cuda", timeout_s=300, trusted=True, checks=tuple(
            Check(task, _cuda_compile_check(task), 1, needs=(EMULATED[task],)) for task in CUDA_KERNELS)),
        Group("emulated_cuda", f"{_S}:group_emulated_cuda", timeout_s=300, trusted=True, checks=(
            Check("1.6", EMULATED["1.6"], 3),
            Check("1.7", EMULATED["1.7"], 2),
            Check("1.8", EMULATED["1.8"], 2),
            Check("1.9", EMULATED["1.9"], 2),
        )),
        Group("gpu_triton", f"{_S}:group_gpu_triton", timeout_s=600, needs_gpu=True, trusted=True, checks=(
            Check("1.1", "Triton softmax forward speed: >= 2x naive, >= 0.9x native", 2),
            Check("1.2", "Triton softmax backward speed: >= 2x naive, >= 0.9x native", 2),
            Check("1.3", "Triton layer_norm forward speed: >= 2x naive, >= 0.9x native", 2),
            Check("1.4", "Triton layer_norm backward speed: >= 2x naive, >= 0.9x native", 2),
        )),
        Group("gpu_cuda", f"{_S}:group_gpu_cuda", timeout_s=900, needs_gpu=True, trusted=True, checks=(
            Check("1.6", "CUDA softmax forward matches torch (all buckets, masks, causal, 3 dtypes)", 1),
            Check("1.7", "CUDA softmax backward matches torch", 1),
            Check("1.8", "CUDA layer_norm forward matches torch", 1),
            Check("1.9", "CUDA layer_norm backward matches torch (dx, dweight, dbias)", 1),
            Check("1.6", "CUDA softmax forward speed: >= 2x naive, >= 0.9x native", 2),
            Check("1.7", "CUDA softmax backward speed: >= 2x naive, >= 0.9x native", 2),
            Check("1.8", "CUDA layer_norm forward speed: >= 2x naive, >= 0.9x native", 2),
            Check("1.9", "CUDA layer_norm backward speed: >= 2x naive, >= 0.9x native", 2),
        )),
    ),
    planted=(
        Planted("softmax that returns zeros", SM, _ZEROS, groups=("smoke",), expect={C_SMOKE: "failed"}),
        Planted("no max subtraction (overflows)", SM,
                ("num = tl.exp(x - row_max[:, None])  # padding", "num = tl.exp(x)  # padding"), groups=("smoke",),
                expect={C_SMOKE: "passed", C_HUGE: "failed"}),
        Planted("calls torch.softmax", SM, ("    y = torch.empty_like(x)\n", "    y = torch.softmax(x, -1)\n"),
                groups=("smoke",), expect={C_SMOKE: "flagged", C_HUGE: "flagged"}),
        Planted("the wrapper computes softmax in torch; the kernel is the untouched stub", SM,
                (_TORCH_WRAPPER, ("    col = tl.arange(0, BLOCK_N)\n    if SINGLE_TILE:\n        x = _load_scores(",
                                  "    col = tl.arange(0, BLOCK_N)\n    raise NotImplementedError('softmax_fwd_kernel')"
                                  "\n    if SINGLE_TILE:\n        x = _load_scores(")),
                groups=("smoke",), expect={C_SMOKE: "failed", C_HUGE: "failed"}),
        Planted("the wrapper computes softmax in torch; the kernel stores nothing", SM,
                (_TORCH_WRAPPER, ("        tl.store(y_ptr + row[:, None] * cols + col[None, :], y, mask=out)\n", "")),
                groups=("smoke",), expect={C_SMOKE: "failed"}),
        # issue 28: compile points for a kernel that computes nothing, beside a wrapper computing in torch
        Planted("the forward kernel stores zeros, the wrapper computes in torch: it compiles", SM,
                (_TORCH_WRAPPER, _ZEROS),
                groups=("smoke", "compile_triton"),
                expect={C_SMOKE: "failed", _triton_compile_check("1.1"): "failed"}),
        Planted("the online softmax without its all -inf prefix guard", SM,
                (("scale = tl.where(m_new == float(\"-inf\"), 0.0, tl.exp(m - m_new))", "scale = tl.exp(m - m_new)"),
                 ("num = tl.where(x == float(\"-inf\"), 0.0, tl.exp(x - m_new[:, None]))",
                  "num = tl.exp(x - m_new[:, None])")),
                groups=("softmax",), expect={C_PREFIX: "failed", "softmax forward on rows longer than one tile": "passed"}),
        Planted("the slide's slip: one power of rstd short (sigma where sigma^2 belongs)", LN,
                ("c = rstd * (sum_gx - mean * sum_g) / n", "c = (sum_gx - mean * sum_g) / n"),
                groups=("layer_norm",),
                expect={C_LN_DX: "failed", C_DWDB: "passed",
                        "layer_norm forward on hidden shapes, long rows, with and without affine": "passed"}),
        Planted("infinite loop in the kernel", SM,
                ("        row_max = tl.max(x, axis=1)\n",
                 "        while True:\n            pass\n        row_max = tl.max(x, axis=1)\n"),
                groups=("smoke",), expect={C_SMOKE: "timeout"},
                timeout_s=8),  # the plant hangs: no need to wait the group's 60 s
        *_attacks(),
        *(Planted(name, file, (old, new), groups=("emulated_cuda",), expect=_CUDA_BUG_OUTCOMES[name])
          for name, (file, old, new) in CUDA_BUGS.items()),
    ),
)


# ---- the student's kernels, reached through the worker ------------------------------------------

def _storage(t):
    """The elements a (possibly expanded) tensor reaches, flat: a broadcast mask travels as its
    own few elements, not as rows x cols."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.as_strided((span,), (1,))


def _send(value):
    from scaletrain.ops.mask import MaskView

    if isinstance(value, MaskView):
        return {"mask": _storage(value.tensor), "view": list(value.kernel_args())}
    return value


def _on(value, device):
    if isinstance(value, tuple):
        return tuple(_on(v, device) for v in value)
    return value.to(device) if hasattr(value, "to") else value


def remote_backend(ctx, kernels: str = "triton", skip: tuple[str, ...] = ()):
    """The student's kernels as a scaletrain.ops Backend whose four functions run in the worker
    (each call: inputs out, outputs back); `skip`: kernels the grader's wrapper does not launch."""
    from scaletrain.ops.backends import Backend

    worker = ctx.untrusted()
    device = "cpu" if kernels == "cuda-cpu" else ctx.device  # the emulator runs on the CPU even beside a GPU
    kw = dict(device=device, kernels=kernels, interpret=ctx.device != "cuda", skip=list(skip))

    def op(name):
        def call(*args):
            return _on(worker.call(PROBE + "run", name, [_send(a) for a in args], **kw), args[0].device)
        return call
    return Backend(name=f"student {kernels}", softmax_fwd=op("softmax_fwd"), softmax_bwd=op("softmax_bwd"),
                   layer_norm_fwd=op("layer_norm_fwd"), layer_norm_bwd=op("layer_norm_bwd"), dtypes=())


def _start(ctx):
    """The worker, forked before this process has threads of its own (torch makes some)."""
    ctx.untrusted().start()
    from scaletrain.ops import conformance
    return conformance


def group_smoke(ctx):
    cf = _start(ctx)
    st, dev = remote_backend(ctx), ctx.device
    with ctx.check(C_SMOKE):
        for i, shape in enumerate(checks.IRREGULAR_ROWS):
            cf.softmax_forward(st, shape, seed=checks.trial_seeds(6)[i], device=dev)
    with ctx.check(C_HUGE):
        cf.huge_logits(st, device=dev)


def group_softmax(ctx):
    cf = _start(ctx)
    st, dev = remote_backend(ctx), ctx.device
    seeds = checks.trial_seeds(8, salt=1)  # the public tests' shapes (issue 27) come last in each list
    with ctx.check("softmax forward on hidden irregular and 3-D shapes"):
        for shape, seed in zip([(613, 781), (3, 37, 129), (100, 3), (2, 2, 5, 11), (2, 3, 45)], seeds):
            cf.softmax_forward(st, shape, seed=seed, scale=5.0, device=dev)
    with ctx.check("softmax forward on rows longer than one tile"):
        for shape, seed in zip([(3, 9001), (2, 16411), (2, 9001)], seeds):
            cf.softmax_forward(st, shape, seed=seed, device=dev)
    with ctx.check("softmax forward with broadcast masks and causal mode"):
        cases = [dict(shape=(2, 3, 37, 37), mask_shape=(2, 1, 1, 37), pad=True, causal=True),
                 dict(shape=(2, 3, 37, 37), mask_shape=(37, 37)), dict(shape=(3, 41, 41), causal=True),
                 dict(shape=(2, 3, 2, 4, 5), mask_shape=(2, 1, 2, 1, 5)),
                 dict(shape=(2, 9001), mask_shape=(1, 9001), pad=True),
                 dict(shape=(2, 3, 17, 17), mask_shape=(2, 1, 1, 17), pad=True, causal=True)]
        for case, seed in zip(cases, seeds):
            cf.softmax_forward(st, case.pop("shape"), seed=seed, **case, device=dev)
    with ctx.check(C_PREFIX):
        cf.masked_prefix(st, device=dev)
    with ctx.check("softmax forward with fp16 and bf16 storage"):
        for dtype in ("fp16", "bf16"):
            cf.softmax_forward(st, (67, 300), dtype=dtype, seed=seeds[0], device=dev)
            cf.softmax_forward(st, (2, 9001), dtype=dtype, seed=seeds[1], device=dev)
    with ctx.check("softmax backward on hidden shapes, long rows included"):
        for shape, seed in zip([(613, 781), (7, 1), (2, 3, 45), (3, 9001), (31, 257)], seeds):
            cf.softmax_backward(st, shape, seed=seed, device=dev)
    with ctx.check("softmax backward with fp16 and bf16 storage"):
        for dtype in ("fp16", "bf16"):
            cf.softmax_backward(st, (67, 300), dtype=dtype, seed=seeds[2], device=dev)
        cf.softmax_backward(st, (16, 100), dtype="bf16", seed=seeds[3], device=dev)


def group_layer_norm(ctx):
    cf = _start(ctx)
    st, dev = remote_backend(ctx), ctx.device
    seeds = checks.trial_seeds(8, salt=2)
    shapes = [(613, 781), (7, 1), (2, 3, 45), (300, 3), (3, 9001), (31, 257)]  # the last: the public tests'
    with ctx.check("layer_norm forward on hidden shapes, long rows, with and without affine"):
        for shape, seed in zip(shapes, seeds):
            cf.layer_norm_forward(st, shape, seed=seed, offset=1.0, device=dev)
        for affine in ((False, False), (True, False), (False, True)):
            cf.layer_norm_forward(st, (50, 200), affine=affine, seed=seeds[5], device=dev)
    with ctx.check("layer_norm forward when |mean| is 1000x the standard deviation"):
        # fp32 input rounding alone is ~1e-4 here; mean(x^2) - mean(x)^2 without a shift is off by ~20%
        cf.layer_norm_forward(st, (50, 200), scale=1.0, offset=1000.0, tol=2e-4, seed=seeds[6], device=dev)
    with ctx.check("layer_norm forward with fp16 and bf16 storage"):
        for dtype in ("fp16", "bf16"):
            cf.layer_norm_forward(st, (67, 300), dtype=dtype, seed=seeds[7], device=dev)
    with ctx.check(C_LN_DX):
        for shape, seed in zip(shapes, seeds):
            cf.layer_norm_backward(st, shape, seed=seed, grads=("dx",), device=dev)
        cf.layer_norm_backward(st, (50, 200), affine=(False, False), grads=("dx",), device=dev)
    with ctx.check("layer_norm backward dx with fp16 and bf16 storage"):
        for dtype in ("fp16", "bf16"):
            cf.layer_norm_backward(st, (67, 300), dtype=dtype, grads=("dx",), seed=seeds[3], device=dev)
    # task 1.5 on its own: the wrapper launches the dx kernel (task 1.4) first; here it does not
    alone = remote_backend(ctx, skip=("layer_norm_bwd_dx_kernel",))
    with ctx.check(C_DWDB):
        for shape, seed in zip([(613, 781), (1037, 3), (3, 9001), (301, 97)], seeds):
            cf.layer_norm_backward(alone, shape, seed=seed, grads=("dweight", "dbias"), device=dev)
        cf.layer_norm_backward(alone, (67, 300), dtype="bf16", grads=("dweight", "dbias"), device=dev)


def group_compile_triton(ctx):
    worker = ctx.untrusted()
    for task, (stem, kernel) in TRITON_KERNELS.items():
        with ctx.check(_triton_compile_check(task)):
            worker.call(PROBE + "compile_triton", stem, kernel)


def group_compile_cuda(ctx):
    from scaletrain.ops.toolchain import nvcc

    results = ctx.untrusted().call(PROBE + "compile_cuda")
    for task, (cu, _, kernels) in CUDA_KERNELS.items():
        name = _cuda_compile_check(task)
        if results is None:
            ctx.record(name, "not_run", "nvcc is not installed here: the CUDA sources were not compiled")
            continue
        with ctx.check(name):
            nvcc.verdict(cu, results[cu]["returncode"], results[cu]["log"], kernels=kernels)


# ---- CUDA kernels in the CPU emulator --------------------------------------------------------------
def _emulated_shapes():
    """conformance.BUCKET_SHAPES with a few rows each (the emulator runs a few million elements a second):
    every launcher bucket; 67 rows give a partial last block of 4 warp-rows and two row groups
    of the dweight / dbias reduction."""
    from scaletrain.ops import conformance as cf

    return [(rows, cols) for (_, cols), rows in zip(cf.BUCKET_SHAPES, (67, 9, 7, 5, 6, 3, 3, 2, 2, 2))]


def group_emulated_cuda(ctx):
    cf = _start(ctx)
    worker = ctx.untrusted()
    built = worker.call(PROBE + "build_cuda_cpu")  # per .cu file: None, or (outcome, the compiler's words)
    backend, shapes = remote_backend(ctx, kernels="cuda-cpu"), _emulated_shapes()
    seeds = checks.trial_seeds(len(shapes), salt=40)
    # every bucket in fp32; fp16 / bf16 on a warp-row, a block-row and a looped shape
    cases = [(s, "fp32", seed) for s, seed in zip(shapes, seeds)]
    cases += [(shapes[i], d, seeds[i]) for i in (2, 4, 8) for d in ("fp16", "bf16")]
    trials = {
        "1.6": lambda: (
            [cf.softmax_forward(backend, s, dtype=d, seed=seed) for s, d, seed in cases],
            cf.softmax_forward(backend, (2, 1, 37, 37), mask_shape=(2, 1, 1, 37), pad=True, causal=True, seed=seeds[0]),
            cf.softmax_forward(backend, (1, 2, 130, 130), mask_shape=(130, 130), seed=seeds[1]),
            cf.softmax_forward(backend, (2, 3, 9001), mask_shape=(1, 1, 9001), pad=True, seed=seeds[2]),
            cf.huge_logits(backend), cf.masked_prefix(backend, rows=2)),
        "1.7": lambda: [cf.softmax_backward(backend, s, dtype=d, seed=seed) for s, d, seed in cases],
        "1.8": lambda: (
            [cf.layer_norm_forward(backend, s, dtype=d, seed=seed, offset=1.0) for s, d, seed in cases],
            [cf.layer_norm_forward(backend, (9, 200), affine=a, seed=seeds[3])
             for a in ((False, False), (True, False))],
            cf.layer_norm_forward(backend, (50, 200), scale=1.0, offset=1000.0, tol=2e-4, seed=seeds[4])),
        "1.9": lambda: (
            [cf.layer_norm_backward(backend, s, dtype=d, seed=seed) for s, d, seed in cases],
            cf.layer_norm_backward(backend, (9, 200), affine=(False, False), seed=seeds[5])),
    }
    for task, trial in trials.items():
        name, cu = EMULATED[task], CUDA_KERNELS[task][0]
        with ctx.check(name):
            if built[cu] is not None:
                outcome, reason = built[cu]
                raise (NotImplementedError if outcome == "not_implemented" else AssertionError)(reason)
            try:
                trial()
            except AssertionError as exc:  # wrong numbers: name the kernels that computed them
                launches = worker.call(PROBE + "cuda_cpu_launches")
                raise AssertionError(f"{str(exc).splitlines()[0]} [kernels launched: {'; '.join(launches)[:300]}]") \
                    from None


# ---- GPU only ------------------------------------------------------------------------------------
SPEED_SHAPE = (8192, 8192)  # 256 MB per fp32 tensor: launch overheads are a few % of the time
CHECK_SHAPES = ((2048, 8192), (1823, 781))  # correctness first, where a trial fits the wire
SPEED_PAIRS = 5             # timed batches per side, alternating; the verdict is the median of their ratios
SPEED_REPS = 40             # calls per timed batch (tens of ms: the worker call's own cost is subtracted)
SAMPLES = 512               # positions of each timed batch's last output that are checked
SPEED_CHECKS = {("softmax", "fwd"): "softmax forward", ("softmax", "bwd"): "softmax backward",
                ("layer_norm", "fwd"): "layer_norm forward", ("layer_norm", "bwd"): "layer_norm backward"}


def _student_batch(worker, op, direction, *, reps, positions, **kw):
    """Seconds per call of the student's kernel: a batch of `reps` calls timed from here, less an
    empty batch (the worker call's own cost); and the last output at `positions`."""
    start = time.perf_counter()
    worker.call(PROBE + "time_batch", op, direction, reps=0, **kw)
    middle = time.perf_counter()
    sample = worker.call(PROBE + "time_batch", op, direction, reps=reps, positions=positions, **kw)
    end = time.perf_counter()
    return max((end - middle) - (middle - start), 1e-9) / reps, sample


def _baseline_batch(fn, inputs, reps: int) -> float:
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn(inputs)
    sync()
    return (time.perf_counter() - start) / reps


def speed_ratios(ctx, op: str, direction: str, *, kernels: str, shape=SPEED_SHAPE, pairs: int = SPEED_PAIRS,
                 reps: int = SPEED_REPS, interpret: bool = False) -> dict:
    """{"x naive", "x native", "GB/s", "seconds"}: medians over `pairs` alternating batches of
    the student's calls (in the worker) and of naive and native (here, on the same inputs, which
    both sides make from one seed); every batch's last output sampled against native's."""
    import torch
    from scaletrain import bench
    from scaletrain.ops import naive
    from scaletrain.ops.backends import Backend
    from scaletrain.ops.benchmark import OP_CALLS, make_inputs
    from scaletrain.ops.testing import TOLERANCE, assert_rel_close

    device = "cuda" if torch.cuda.is_available() else "cpu"
    seed = checks.trial_seeds(1, salt=30)[0]
    torch.manual_seed(seed)
    inputs = make_inputs(op, *shape, torch.float32, device)
    call_backend, call_native = OP_CALLS[(op, direction)]
    naive_backend = Backend.from_modules("torch", naive, naive)
    expected = call_native(inputs)
    expected = (expected[0] if isinstance(expected, tuple) else expected).flatten()
    rng = random.Random(seed)
    student, vs_naive, vs_native = [], [], []
    for _ in range(pairs):
        positions = [rng.randrange(expected.numel()) for _ in range(SAMPLES)]
        seconds, sample = _student_batch(ctx.untrusted(), op, direction, reps=reps, positions=positions,
                                         m=shape[0], n=shape[1], dtype="fp32", seed=seed, kernels=kernels,
                                         interpret=interpret)
        assert_rel_close(sample.to(device), expected[torch.as_tensor(positions, device=device)],
                         tol=TOLERANCE[torch.float32], what=f"{op} {direction}: the timed calls' output")
        native = _baseline_batch(call_native, inputs, reps)
        slow = _baseline_batch(lambda t: call_backend(naive_backend, t), inputs, reps)
        student.append(seconds)
        vs_naive.append(slow / seconds)
        vs_native.append(native / seconds)
    seconds = statistics.median(student)
    nbytes = (2 if direction == "fwd" else 3) * shape[0] * shape[1] * 4
    return {"seconds": seconds, "GB/s": bench.gbps(nbytes, seconds), "x naive": statistics.median(vs_naive),
            "x native": statistics.median(vs_native)}


def _speed(ctx, label: str, kernels: str, backend) -> None:
    """Each op's speed check, after a correctness trial of that op at the checked shapes."""
    from scaletrain.ops import conformance as cf
    from scaletrain.ops.benchmark import peak_gbps

    trials = {("softmax", "fwd"): cf.softmax_forward, ("softmax", "bwd"): cf.softmax_backward,
              ("layer_norm", "fwd"): cf.layer_norm_forward, ("layer_norm", "bwd"): cf.layer_norm_backward}
    peak = peak_gbps()
    for (op, direction), what in SPEED_CHECKS.items():
        with ctx.check(f"{label} {what} speed: >= 2x naive, >= 0.9x native"):
            try:
                for shape in CHECK_SHAPES:
                    trials[(op, direction)](backend, shape, device="cuda")
            except (AssertionError, NotImplementedError) as exc:
                ctx.skip(f"graded after correctness, which failed: {str(exc).splitlines()[0]}")
            row = speed_ratios(ctx, op, direction, kernels=kernels)
            summary = f"{row['GB/s']:.0f} GB/s, {row['x naive']:.2f}x naive, {row['x native']:.2f}x native"
            if (peak and row["GB/s"] > 1.05 * peak) or row["x native"] > 10:
                raise checks.Flagged(f"implausible timing: {summary}, peak {peak} GB/s")
            assert row["x naive"] >= 2.0 and row["x native"] >= 0.9, f"too slow: {summary}"
            ctx.note(summary)


def group_gpu_triton(ctx):
    _start(ctx)
    _speed(ctx, "Triton", "triton", remote_backend(ctx))


def group_gpu_cuda(ctx):
    cf = _start(ctx)
    worker = ctx.untrusted()
    try:
        worker.call(PROBE + "build_cuda")
        build_error = None
    except Exception as exc:  # noqa: BLE001 - one build for every check: report it on each
        lines = str(exc).splitlines() or [type(exc).__name__]
        build_error = "the CUDA extension did not build: " + next((ln for ln in lines if "error" in ln), lines[-1])
    backend, dev = remote_backend(ctx, kernels="cuda"), "cuda"
    trials = {
        "CUDA softmax forward matches torch (all buckets, masks, causal, 3 dtypes)": lambda: (
            [cf.softmax_forward(backend, s, dtype=d, device=dev) for s in cf.BUCKET_SHAPES for d in cf.DTYPES],
            cf.softmax_forward(backend, (2, 3, 129, 129), mask_shape=(2, 1, 1, 129), pad=True, causal=True, device=dev),
            cf.softmax_forward(backend, (2, 3, 1031, 1031), mask_shape=(1031, 1031), device=dev),
            cf.huge_logits(backend, device=dev), cf.masked_prefix(backend, device=dev)),
        "CUDA softmax backward matches torch": lambda: [
            cf.softmax_backward(backend, s, dtype=d, device=dev) for s in cf.BUCKET_SHAPES for d in cf.DTYPES],
        "CUDA layer_norm forward matches torch": lambda: (
            [cf.layer_norm_forward(backend, s, dtype=d, offset=1.0, device=dev)
             for s in cf.BUCKET_SHAPES for d in cf.DTYPES],
            cf.layer_norm_forward(backend, (50, 200), scale=1.0, offset=1000.0, tol=2e-4, device=dev)),
        "CUDA layer_norm backward matches torch (dx, dweight, dbias)": lambda: [
            cf.layer_norm_backward(backend, s, dtype=d, device=dev) for s in cf.BUCKET_SHAPES for d in cf.DTYPES],
    }
    for name, trial in trials.items():
        with ctx.check(name):
            assert build_error is None, build_error
            trial()
    if build_error is None:
        _speed(ctx, "CUDA", "cuda", backend)
        return
    for what in SPEED_CHECKS.values():
        with ctx.check(f"CUDA {what} speed: >= 2x naive, >= 0.9x native"):
            raise AssertionError(build_error)
