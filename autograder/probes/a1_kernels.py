"""a1's probe: the student's kernels, launched by the grader's own wrappers.

The grading build holds the released stub of each Triton file (`kernels/*.py` there): its
wrappers (`softmax_fwd`, `layer_norm_bwd`, ...) are the given code and its kernels raise.
`_launchers` loads that copy and grafts the student's @triton.jit kernels into it, so whatever
the student's own wrappers do (compute in torch and launch nothing, say) never runs: only the
kernels write the outputs, into buffers the grader's copy fills with NaN first (an element no
kernel wrote fails the comparison). Part B's extension is built here from the student's two .cu
files beside the given binding and headers.

Each call returns outputs as data; the expected values and the verdicts are the trusted side's
(autograder/suites/a1_kernels/). The run-time guard against aten's softmax / layer-norm kernels
runs here, around the student's launches: a `Flagged` it raises comes back as `flagged`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from autograder.checks import forbid_aten
from autograder.probes.triton_kernels import NanOutputs, graft, kernels_of, triton_mode, unwrap_stub

KERNELS = {"softmax_triton": ("softmax_fwd_kernel", "softmax_bwd_kernel"),
           "layer_norm_triton": ("layer_norm_fwd_kernel", "layer_norm_bwd_dx_kernel", "layer_norm_bwd_dwdb_kernel")}
WRAPPERS = {"softmax_fwd": "softmax_triton", "softmax_bwd": "softmax_triton",
            "layer_norm_fwd": "layer_norm_triton", "layer_norm_bwd": "layer_norm_triton"}
CUDA_FILES = ("softmax.cu", "layer_norm.cu")
LIBRARY_KERNELS = ("_softmax", "softmax", "_log_softmax", "_softmax_backward_data", "native_layer_norm",
                   "layer_norm", "native_layer_norm_backward", "_fused_rms_norm")


# ---------------------------------------------------------------- the grader's launchers

class _NoLaunch:
    """Stands in for a kernel the check leaves out: `kernel[grid](...)` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def _launch_setup(stem: str, interpret: bool, *, nan_outputs: bool, skip: tuple[str, ...], tile=None,
                  programs=None):
    """The grader's wrappers with the student's kernels; `tile` (BLOCK_M, BLOCK_N): the tile the
    wrappers launch with instead of the launcher's choice (a kernel must be right for any);
    `programs`: at most that many persistent programs for LayerNorm's dx kernel. Without the dx
    kernel (`skip`), dw and db come from the second kernel alone (FUSE_DWDB off)."""
    grader = graft(stem, KERNELS[stem], interpret)
    given = {name: getattr(grader, name) for name in (*skip, "tile_shape", "FUSE_DWDB", "dx_programs")
             if hasattr(grader, name)}
    grader.torch = NanOutputs() if nan_outputs else torch
    for name in skip:
        setattr(grader, name, _NoLaunch())
    if "layer_norm_bwd_dx_kernel" in skip:
        grader.FUSE_DWDB = False
    if tile is not None:
        block_m, block_n = (int(b) for b in tile)
        grader.tile_shape = lambda x: (block_m, block_n, x.shape[1] <= block_n)
    if programs is not None:
        grader.dx_programs = lambda x, blocks: min(blocks, int(programs))
    try:
        yield grader
    finally:
        grader.torch = torch
        for name, value in given.items():
            setattr(grader, name, value)


@functools.cache
def _cuda_sources() -> Path:
    """A folder with the student's .cu files beside the given binding and headers."""
    from scaletrain.ops.backends import KERNELS_DIR
    from scaletrain.ops.cuda_ext import SOURCES

    build = Path(tempfile.mkdtemp(prefix="a1-cuda-"))
    submission = Path(os.environ["AUTOGRADER_SUBMISSION"])
    for name in SOURCES + ("kernel_utils.cuh", "launchers.h"):
        shutil.copy(submission / name if name in CUDA_FILES else KERNELS_DIR / name, build / name)
    return build


def build_cuda() -> None:
    """Build the student's extension (a minute or two); raises what the build raised."""
    from scaletrain.ops.cuda_ext import load

    load(str(_cuda_sources()))


def _cuda_backend():
    from scaletrain.ops.cuda_ext import make_backend

    return make_backend(_cuda_sources())


def build_cuda_cpu() -> dict[str, list[str] | None]:
    """Build each of the student's .cu files for the CPU emulator (on its own: one that does not
    compile leaves the other's tasks gradable). Per file None, or [outcome, reason]: an #error
    stub left in place is "not_implemented", any other compile error "failed"."""
    from scaletrain.ops.toolchain import cuda_cpu
    from scaletrain.ops.backends import KERNELS_DIR

    verdicts = {}
    for name in CUDA_FILES:
        try:
            cuda_cpu.load(_cuda_sources(), include=KERNELS_DIR, sources=(name,))
            verdicts[name] = None
        except RuntimeError as exc:
            stub = re.search(r'#error "([^"]*)"', str(exc))
            verdicts[name] = ["not_implemented", stub.group(1)] if stub else ["failed", str(exc)]
    return verdicts


def cuda_cpu_launches() -> list[str]:
    """The kernels the emulator launched in the last call (named in a failed check's message)."""
    from scaletrain.ops.toolchain import cuda_cpu

    return cuda_cpu.last_launches()


def _function(op: str, kernels: str, stack: contextlib.ExitStack, *, interpret: bool, nan_outputs: bool,
              skip: tuple[str, ...], tile=None, programs=None):
    if kernels in ("cuda", "cuda-cpu"):
        if skip or tile is not None or programs is not None:
            raise ValueError("grader bug: the CUDA extension launches its kernels itself")
        if kernels == "cuda-cpu":
            from scaletrain.ops.toolchain import cuda_cpu
            from scaletrain.ops.backends import KERNELS_DIR

            return getattr(cuda_cpu.make_backend(_cuda_sources(), include=KERNELS_DIR), op)
        return getattr(_cuda_backend(), op)
    grader = stack.enter_context(_launch_setup(WRAPPERS[op], interpret, nan_outputs=nan_outputs, skip=skip,
                                               tile=tile, programs=programs))
    return getattr(grader, op)


# ---------------------------------------------------------------- what the trusted side calls

def _arg(value, device: str):
    from scaletrain.ops.mask import MaskView

    if isinstance(value, dict) and "mask" in value:  # a MaskView sent as its storage and strides
        size1, size2, stride0, stride1, stride2, col_stride = value["view"]
        return MaskView(tensor=value["mask"].to(device), size1=size1, size2=size2, stride0=stride0,
                        stride1=stride1, stride2=stride2, col_stride=col_stride)
    return value.to(device) if isinstance(value, torch.Tensor) else value


def run(op: str, args: list, *, device: str = "cpu", kernels: str = "triton", interpret: bool = True,
        skip: tuple[str, ...] = (), tile=None, programs=None):
    """The outputs of the grader's wrapper `op` (softmax_fwd, ..., layer_norm_bwd) on `args`,
    launching the student's kernels (`kernels`: "triton", "cuda" or "cuda-cpu"); the kernels in `skip` are
    not launched (task 1.5 is graded without task 1.4's kernel); `tile`: (BLOCK_M, BLOCK_N) forced;
    `programs`: LayerNorm's dx kernel launched with at most that many persistent programs."""
    args = [_arg(a, device) for a in args]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    before = [t.clone() for t in tensors]
    with contextlib.ExitStack() as stack:
        fn = _function(op, kernels, stack, interpret=interpret, nan_outputs=True, skip=tuple(skip), tile=tile,
                       programs=programs)
        with forbid_aten(*LIBRARY_KERNELS):
            out = unwrap_stub(fn)(*args)
    if any(not torch.equal(t, b) for t, b in zip(tensors, before)):
        raise AssertionError(f"{op}: an input was modified in place")
    return out


_SPEED_INPUTS: dict = {}


def time_batch(op: str, direction: str, *, m: int, n: int, dtype: str, seed: int, reps: int,
               kernels: str = "triton", interpret: bool = False, positions=None):
    """Run the student's `op direction` `reps` times on inputs made from `seed` (the trusted side
    makes the same ones) and wait for the device; the trusted side's clock times this call.
    Returns the last call's first output at `positions` (flat indices), which it checks."""
    from scaletrain.ops.benchmark import DTYPES, OP_CALLS, make_inputs

    device = "cuda" if torch.cuda.is_available() else "cpu"
    key = (op, direction, m, n, dtype, seed)
    if key not in _SPEED_INPUTS:
        _SPEED_INPUTS.clear()
        torch.manual_seed(seed)
        _SPEED_INPUTS[key] = make_inputs(op, m, n, DTYPES[dtype], device)
    inputs, call = _SPEED_INPUTS[key], OP_CALLS[(op, direction)][0]
    out = None
    with contextlib.ExitStack() as stack:
        fn = _function(f"{op}_{direction}", kernels, stack, interpret=interpret, nan_outputs=False, skip=())
        backend = _OneOp(f"{op}_{direction}", fn)
        for _ in range(reps):
            out = call(backend, inputs)
    if device == "cuda":
        torch.cuda.synchronize()
    if out is None or positions is None:
        return None
    first = out[0] if isinstance(out, tuple) else out
    return first.flatten()[torch.as_tensor(positions, device=first.device)]


class _OneOp:
    """A Backend-shaped object with one function, for scaletrain.ops.benchmark.OP_CALLS."""

    def __init__(self, name: str, fn):
        setattr(self, name, fn)


def compile_triton(stem: str, kernel: str) -> int:
    """Compile the student's `kernel` of <stem>.py for sm_80 with Triton's real compiler;
    returns the number of configurations compiled."""
    from scaletrain.ops.toolchain.triton_compile import compile_module

    triton_mode(False)
    return len(unwrap_stub(compile_module)(kernels_of(stem), kernels=(kernel,)))


def compile_cuda() -> dict | None:
    """nvcc -Xptxas -v on the student's two .cu files (never cached here): per file, the exit
    code, the log and the PTX; None when nvcc is not installed. No Python of the submission runs
    in this worker, so what nvcc said is what the trusted side reads."""
    from scaletrain.ops.toolchain import nvcc

    submission = Path(os.environ["AUTOGRADER_SUBMISSION"])
    os.environ["SCALETRAIN_NVCC_CACHE"] = "off"
    procs = nvcc.start([submission / name for name in CUDA_FILES])
    if procs is None:
        return None
    return {name: nvcc.collect(procs[name]) for name in CUDA_FILES}
