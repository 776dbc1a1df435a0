"""a1's planted submissions: each an edit of the solution's files and the outcome it must get;
`CUDA_BUGS`, the CUDA bugs the emulator must catch, are planted here and in tests/test_cuda_cpu.py."""

from __future__ import annotations

from autograder.attacks import kernel_attacks
from autograder.manifest import REPO, Planted

from .names import (C_DWDB, C_HUGE, C_LN_PARTIALS, C_LN_DX, C_LN_FWD, C_PREFIX, C_SM_CAUSAL, C_SM_FWD, C_SM_LONG,
                    C_SM_MASK, C_SMOKE, EMULATED, LN, LNC, SM, SMC, triton_compile_check)

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
    "CUDA one-pass dweight partial sums of dy * x, not dy * x-hat": (
        LNC, "acc_w[c][k] += dv[c][k] * ((xv[c][k] - mu) * r);", "acc_w[c][k] += dv[c][k] * xv[c][k];"),
    "CUDA launcher edited to take the second pass everywhere (right numbers, no partial rows)": (
        LNC, "const bool one_pass = need && one_pass_fits<T, kThreads, kChunks>();", "const bool one_pass = false;"),
}
CUDA_BUG_OUTCOMES = {  # what each bug gets, and a check of another task that must still pass
    "CUDA softmax that writes zeros": {EMULATED["1.6"]: "failed", EMULATED["1.7"]: "passed"},
    "CUDA dweight/dbias without the __syncthreads between shared-memory writes and reads": {
        EMULATED["1.9"]: "error", EMULATED["1.8"]: "passed"},
    "CUDA softmax sum reduced with wrong shuffle offsets (32 .. 2: lane ^ 32 is the lane itself, 1 is missing)": {
        EMULATED["1.6"]: "failed", EMULATED["1.7"]: "passed"},
    "CUDA softmax with an off-by-one row bound (reads past the end of x)": {EMULATED["1.6"]: "error"},
    "CUDA one-pass dweight partial sums of dy * x, not dy * x-hat": {EMULATED["1.9"]: "failed",
                                                                     EMULATED["1.8"]: "passed"},
    "CUDA launcher edited to take the second pass everywhere (right numbers, no partial rows)": {
        EMULATED["1.9"]: "failed", EMULATED["1.8"]: "passed"},
}


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


PLANTED = (
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
            expect={C_SMOKE: "failed", triton_compile_check("1.1"): "failed"}),
    Planted("the online softmax without its all -inf prefix guard", SM,
            (("scale = tl.where(m_new == float(\"-inf\"), 0.0, tl.exp(m - m_new))", "scale = tl.exp(m - m_new)"),
             ("num = tl.where(x == float(\"-inf\"), 0.0, tl.exp(x - m_new[:, None]))",
              "num = tl.exp(x - m_new[:, None])")),
            groups=("softmax",), expect={C_PREFIX: "failed", C_SM_LONG: "passed"}),
    # small slips cost their case's share: the causal diagonal, the mask's middle index
    Planted("causal mode hides the diagonal too (>= for >)", SM,
            ("x = tl.where(col[None, :] > (row % causal_len)[:, None]", "x = tl.where(col[None, :] >= (row % causal_len)[:, None]"),
            groups=("softmax",), expect={C_SM_CAUSAL: "failed", C_SM_MASK: "passed", C_SM_FWD: "passed",
                                         C_SM_LONG: "passed"}),
    Planted("the mask's middle leading index taken modulo without dividing first", SM,
            ("i1 = (row // m_size2) % m_size1", "i1 = row % m_size1"),
            groups=("softmax",), expect={C_SM_MASK: "failed", C_SM_FWD: "passed", C_SM_LONG: "passed"}),
    Planted("the slide's slip: one power of rstd short (sigma where sigma^2 belongs)", LN,
            ("c = rstd * (sum_gx - mean * sum_g) / n", "c = (sum_gx - mean * sum_g) / n"),
            groups=("layer_norm",),
            expect={C_LN_DX: "failed", C_DWDB: "passed", C_LN_PARTIALS: "passed",
                    C_LN_FWD: "passed"}),
    Planted("dw's partial sums of dy * x, not dy * x-hat", LN,
            ("acc_w += tl.sum(dy * ((x - mean[:, None]) * rstd[:, None]), axis=0)", "acc_w += tl.sum(dy * x, axis=0)"),
            groups=("layer_norm",), expect={C_LN_PARTIALS: "failed", C_LN_DX: "passed", C_DWDB: "passed"}),
    Planted("persistent programs that step by one row block, not by the number of programs", LN,
            ("for block in range(tl.program_id(0), tl.cdiv(rows, BLOCK_M), tl.num_programs(0)):",
             "for block in range(tl.program_id(0), tl.cdiv(rows, BLOCK_M)):"),
            groups=("layer_norm",),  # dx is right (written again, with the same values); the sums count rows twice
            expect={C_LN_PARTIALS: "failed", C_LN_DX: "passed", C_DWDB: "passed"}),
    Planted("infinite loop in the kernel", SM,
            ("        row_max = tl.max(x, axis=1)\n",
             "        while True:\n            pass\n        row_max = tl.max(x, axis=1)\n"),
            groups=("smoke",), expect={C_SMOKE: "timeout"},
            timeout_s=8),  # the plant hangs: no need to wait the group's 60 s
    *_attacks(),
    *(Planted(name, file, (old, new), groups=("emulated_cuda",), expect=CUDA_BUG_OUTCOMES[name])
      for name, (file, old, new) in CUDA_BUGS.items()),
)
