"""a1b's probe: the student's FlashAttention and cross-entropy kernels, launched by the grader's wrappers.

The design of a1's probe (autograder/probes/a1_kernels.py): the grading build holds the released
stub of each Triton file, whose wrappers (`attention_fwd`, `cross_entropy_bwd`, ...) are given
code; `triton_kernels.graft` loads that copy and puts the student's @triton.jit kernels in place of its stubs,
so the student's own wrappers never run and only the kernels write the outputs, into buffers
filled with NaN first.  The expected values and the verdicts are the trusted side's
(autograder/suites/a1b_attention/).

Run-time guards around the student's launches: aten's attention, softmax and loss kernels are
forbidden, and (for the check that asks) so is any tensor of >= `max_elements` elements, the
size of the n x n score matrix: FlashAttention never materializes it, so a kernel launch that
does (a patched launcher computing in torch) comes back `flagged`.
"""

from __future__ import annotations

import contextlib

import torch

from autograder.checks import Flagged, forbid_aten
from autograder.probes.triton_kernels import NanOutputs, graft, kernels_of, triton_mode, unwrap_stub

KERNELS = {"attention_triton": ("attention_fwd_kernel", "attention_bwd_dkdv_kernel", "attention_bwd_dq_kernel"),
           "cross_entropy_triton": ("cross_entropy_fwd_kernel", "cross_entropy_bwd_kernel")}
WRAPPERS = {"attention_fwd": "attention_triton", "attention_bwd": "attention_triton",
            "cross_entropy_fwd": "cross_entropy_triton", "cross_entropy_bwd": "cross_entropy_triton"}
LIBRARY_KERNELS = ("_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
                   "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
                   "_scaled_dot_product_cudnn_attention", "_softmax", "_log_softmax", "logsumexp",
                   "nll_loss_forward", "nll_loss_nd", "cross_entropy_loss")


@contextlib.contextmanager
def _no_tensor_of(max_elements: int | None):
    """Flag any aten op whose floating-point output has >= max_elements elements (None: no limit)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class SizeGuard(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            # floating tensors only: the interpreter copies arguments through uint8 views of their storage
            big = [t.numel() for t in tree_leaves(out)
                   if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() >= max_elements]
            if big:
                raise Flagged(f"`{func.overloadpacket.__name__}` made a tensor of {big[0]} elements inside the "
                              f"kernel call: the n x n score matrix ({max_elements}) must never exist")
            return out

    if max_elements is None:
        yield
        return
    with SizeGuard():
        yield


def run(op: str, args: list, *, device: str = "cpu", interpret: bool = True, max_elements: int | None = None,
        dq_atomics: bool = False):
    """The outputs of the grader's wrapper `op` (attention_fwd, attention_bwd, cross_entropy_fwd,
    cross_entropy_bwd) on `args`, launching the student's kernels; inputs must come back unmodified.
    dq_atomics: attention_bwd with its DQ_BY_ATOMICS on (dQ from the dK/dV kernel's atomic adds, the
    dq kernel not launched), as a1's probe switches FUSE_DWDB."""
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    before = [t.clone() for t in tensors]
    grader = graft(WRAPPERS[op], KERNELS[WRAPPERS[op]], interpret)
    grader.torch = NanOutputs()
    if dq_atomics:
        grader.DQ_BY_ATOMICS = True
    try:
        with forbid_aten(*LIBRARY_KERNELS), _no_tensor_of(max_elements):
            out = unwrap_stub(getattr(grader, op))(*args)
    finally:
        grader.torch = torch
        if dq_atomics:
            grader.DQ_BY_ATOMICS = False
    if any(not torch.equal(t, b) for t, b in zip(tensors, before)):
        raise AssertionError(f"{op}: an input was modified in place")
    return out


def compile_triton(stem: str, kernel: str) -> int:
    """Compile the student's `kernel` of <stem>.py for sm_80 with Triton's real compiler."""
    from scaletrain.ops.toolchain.attention_compile import compile_fused

    triton_mode(False)
    return len(unwrap_stub(compile_fused)(kernels_of(stem), kernels=(kernel,)))


_SPEED_INPUTS: dict = {}


def time_batch(direction: str, *, seed: int, reps: int, positions=None, device: str = "cuda",
               interpret: bool = False, **shape):
    """`reps` calls of `direction` ("fwd": the grader's attention_fwd; "fwd+bwd": attention_fwd
    then attention_bwd, as the autograd Function runs them) on the student's kernels, on
    attention_benchmark.speed_inputs(GRADED | shape, seed=seed) made and kept here (32 MB tensors never
    cross the wire: their encoding swamped the kernels' milliseconds), then a sync; the
    trusted side's clock times this call.  Returns the last O (fwd) or dQ (fwd+bwd) at `positions`."""
    from scaletrain.ops.attention_benchmark import GRADED, batch_seconds, speed_inputs

    spec = {**GRADED, **shape}
    key = (seed, device, tuple(sorted(spec.items())))
    if key not in _SPEED_INPUTS:
        _SPEED_INPUTS.clear()
        q, k, v, do = speed_inputs(spec, device=device, seed=seed)
        _SPEED_INPUTS[key] = tuple(t.view(-1, *t.shape[2:]) for t in (q, k, v, do))  # (batch x heads, n, d)
    grader = graft(WRAPPERS["attention_fwd"], KERNELS["attention_triton"], interpret)
    last = []  # only the last output stays alive, as in a plain loop

    def call(*args):
        last[:] = [_fwd_bwd(grader, direction, spec["causal"], *args)]
    batch_seconds(call, _SPEED_INPUTS[key], reps)
    if not last or positions is None:
        return None
    return last[0].flatten()[torch.as_tensor(positions, device=last[0].device)]


def _fwd_bwd(grader, direction: str, causal: bool, q, k, v, do):
    o, lse = unwrap_stub(grader.attention_fwd)(q, k, v, causal)
    if direction == "fwd":
        return o
    return unwrap_stub(grader.attention_bwd)(do, q, k, v, o, lse, causal)[0]
