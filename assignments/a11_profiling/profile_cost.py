# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/profile/cost.py by `python -m autograder release`; edit the source.
"""FLOPs and bytes of one profiled operation, from the shapes the profiler recorded.

training-speedup-lecture.md ("Profiling Time of Elementary Operations"): GeLU and the other
elementwise operations are "limited by memory access speed", the linear layers by arithmetic.
Which one an op is follows from its arithmetic intensity FLOPs / bytes (Williams et al. 2009,
the roofline), so each op needs both counts:

  * matmul: 2 FLOPs per multiply-add (a multiply and an add for every term of every output
    element's sum), bytes = every operand read once and the output written once, the minimum a
    kernel can move.  A linear layer's backward is two products the size of its forward one
    (dX = dY·Wᵀ and dW = Xᵀ·dY): twice its forward.
  * attention (FlashAttention's kernels): Q·Kᵀ and P·V, 4·b·a·s_q·s_k·d FLOPs forward, half of it
    when causal (the masked blocks are skipped); the backward recomputes S and forms dV, dP, dQ, dK:
    5/2 of the forward (Dao et al. 2022, §3.1 and appendix B); bytes: module 1b's minimum traffic.
  * softmax and LayerNorm: module 1's minimum traffic (`scaletrain.ops.traffic.minimum`), FLOPs a
    handful per element (they are counted so the point sits on the plot, not to rank them).
  * every other costed op is elementwise: bytes = its tensor inputs read plus an output of the
    largest input's size written (module 1's `count_traffic` convention), one FLOP per output
    element per input beyond the first (an add of two tensors: 1 per element).

Ops not modelled here (views, embedding lookups, reductions other than the above) get no cost;
they still count in the time tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from scaletrain.ops import traffic

__all__ = ["Cost", "op_cost", "itemsize", "MATMULS", "ELEMENTWISE"]

_ITEMSIZE = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "Half": 2, "BFloat16": 2,
             "long int": 8, "int": 4, "bool": 1}
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
# where `is_causal` sits among each attention kernel's arguments (native_functions.yaml). The
# efficient-attention indices read right on an H200 (2026-11-27: GPT-2's causal FLOPs halved, the
# backward 2.5x); the CUDA flash ones are unread: a wrong index only halves or doubles their FLOPs
_CAUSAL_ARG = {"aten::_scaled_dot_product_flash_attention_for_cpu": 4,
               "aten::_scaled_dot_product_flash_attention_for_cpu_backward": 7,
               "aten::_scaled_dot_product_flash_attention": 4, "aten::_scaled_dot_product_flash_attention_backward": 11,
               "aten::_scaled_dot_product_efficient_attention": 6,
               "aten::_scaled_dot_product_efficient_attention_backward": 11}
ELEMENTWISE = ("aten::add", "aten::add_", "aten::sub", "aten::mul", "aten::mul_", "aten::div", "aten::div_",
               "aten::gelu", "aten::gelu_backward", "aten::relu", "aten::threshold_backward", "aten::silu",
               "aten::tanh", "aten::sqrt", "aten::lerp_", "aten::addcmul_", "aten::addcdiv_", "aten::copy_",
               "aten::native_dropout", "aten::masked_fill", "aten::where")
_PER_ELEMENT = {"fwd": 5, "bwd": 8}  # LayerNorm/softmax FLOPs per element: mean, var, scale... (order of magnitude)


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte moved."""
        return self.flops / self.bytes if self.bytes else math.inf


def itemsize(dtype: str) -> int:
    return _ITEMSIZE.get(dtype, 4)


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 0


def _matmul(name: str, shapes, size: int) -> Cost:
    """A product's FLOPs and bytes from the profiler's `input_shapes` (module docstring): addmm and
    baddbmm record (bias, A, B), mm and bmm (A, B); bmm's and baddbmm's operands carry a batch dimension."""
    raise NotImplementedError('a11 task 11.2: implement `_matmul` (see assignments/a11_profiling/README.md)')


def _attention(shapes, causal: bool, backward: bool, size: int) -> Cost:
    q, k = (shapes[1], shapes[2]) if backward else (shapes[0], shapes[1])  # backward: grad_out first
    b, a, s_q, d = q
    s_k = k[2]
    fwd = 4 * b * a * s_q * s_k * d / (2 if causal else 1)
    moved = traffic.attention_minimum("bwd" if backward else "fwd", b * a, s_q, d) if s_q == s_k else \
        traffic.Traffic(b * a * (s_q + 2 * s_k) * d, b * a * s_q * (d + 1))
    return Cost(fwd * (2.5 if backward else 1), moved.total * size)


def _rows(shape) -> tuple[int, int]:
    return _numel(shape) // shape[-1], shape[-1]


def op_cost(name: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[str] = (),
            concrete: Sequence = ()) -> Cost | None:
    """The FLOPs and bytes of the aten op `name` called on tensors of `shapes` (the profiler's
    `input_shapes`, `input_dtypes` and `concrete_inputs`); None for an op this model leaves out.

    `shapes` holds one entry per argument: a tensor's shape, [] for a scalar or a non-tensor.  The
    element size is the first input's dtype's (`itemsize`).  What each kind must give (module docstring):
      * MATMULS: 2 FLOPs per multiply-add of the product (a bias add not counted); bytes: every
        operand read once (a bias too) and the output written once.
      * native_layer_norm, _softmax, _log_softmax and their backwards: bytes of every row tensor
        read once and written once (LayerNorm: x in, y out; its backward: x and dy in, dx out;
        softmax's backward: y and dy in, dx out), its per-row statistics and per-column weights
        optionally; FLOPs a handful per element of x (at least 1, at most 20).
      * ELEMENTWISE: bytes of its tensor inputs read once and an output the size of the largest
        input written once; FLOPs at least 1 and at most 20 per output element; None when no
        argument is a tensor.
    """
    size = itemsize(dtypes[0]) if dtypes else 4
    shapes = [list(s) if isinstance(s, (list, tuple)) else [] for s in shapes]
    if name in MATMULS:
        return _matmul(name, shapes, size)
    if name in _CAUSAL_ARG:
        at = _CAUSAL_ARG[name]
        return _attention(shapes, bool(concrete[at]) if len(concrete) > at else False, name.endswith("_backward"), size)
    if name in ("aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::_softmax",
                "aten::_softmax_backward_data", "aten::_log_softmax", "aten::_log_softmax_backward_data"):
        raise NotImplementedError('a11 task 11.2: implement `op_cost` (see assignments/a11_profiling/README.md)')
    if name in ELEMENTWISE:
        raise NotImplementedError('a11 task 11.2: implement `op_cost` (see assignments/a11_profiling/README.md)')
    return None
