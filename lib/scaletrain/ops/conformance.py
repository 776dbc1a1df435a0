"""Conformance trials for a backend's four kernel functions, shared by the tests and the a1 grader.

Each trial builds seeded inputs, computes the reference FIRST in float64 with torch's native ops
(torch.softmax, F.layer_norm and autograd), then calls the backend inside `guard` (the grader
passes a dispatch mode that forbids aten's softmax / layer-norm kernels), and raises
AssertionError naming the case when: the output has the wrong shape or dtype, its max-norm
relative error exceeds the dtype's tolerance (testing.TOLERANCE: all zeros fails), or an input
was modified.  Shapes may have any rank; rows are all leading dims, as scaletrain.ops flattens.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from scaletrain.ops.backends import Backend
from scaletrain.ops.mask import MaskView
from scaletrain.ops.testing import TOLERANCE, assert_rel_close

__all__ = ["DTYPES", "BUCKET_SHAPES", "softmax_forward", "softmax_backward", "layer_norm_forward",
           "layer_norm_backward", "huge_logits", "masked_prefix"]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# One shape per CUDA launcher bucket (rows of <= 32 / 64 / 128 16-byte pieces per warp, <= 512 /
# 2048 per block, then the looped kernel), widths that are not multiples of 8 (scalar loads),
# and the Triton tutorial's 1823 x 781.
BUCKET_SHAPES = [(1823, 781), (4096, 1), (333, 64), (129, 256), (65, 1000), (31, 2048), (17, 4096),
                 (9, 8191), (5, 16384), (3, 40000)]
_NO_GUARD = contextlib.nullcontext


def _name(shape, dtype, extra="") -> str:
    return f"shape {tuple(shape)} {dtype}{extra}"


def _check_output(out, like: torch.Tensor, what: str) -> None:
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"{what}: returned {type(out).__name__}, expected a tensor")
    if out.shape != like.shape or out.dtype != like.dtype:
        raise AssertionError(f"{what}: returned {tuple(out.shape)} {out.dtype}, "
                             f"expected {tuple(like.shape)} {like.dtype}")


@contextlib.contextmanager
def _unmodified(*tensors, what: str):
    before = [t.clone() for t in tensors]
    yield
    for t, b in zip(tensors, before):
        if not torch.equal(t, b):
            raise AssertionError(f"{what}: an input was modified in place")


def _mask(mask_shape, pad: bool, device) -> torch.Tensor | None:
    if mask_shape is None:
        return None
    if not pad:
        return torch.randn(mask_shape, device=device)
    mask = torch.where(torch.rand(mask_shape, device=device) < 0.3, float("-inf"), 0.0)
    mask[..., 0] = 0.0  # key 0 stays visible: no row is fully hidden
    return mask


def softmax_forward(backend: Backend, shape, *, dtype: str = "fp32", seed: int = 0, scale: float = 3.0,
                    mask_shape=None, pad: bool = False, causal: bool = False, device: str = "cpu",
                    guard=_NO_GUARD) -> None:
    """softmax(x + mask) over the last dim of `shape`, optional causal mode (square last dims)."""
    torch.manual_seed(seed)
    x = (torch.randn(shape, device=device) * scale).to(DTYPES[dtype])
    mask = _mask(mask_shape, pad, device)
    z = x.double() if mask is None else x.double() + mask.to(x.dtype).double()
    if causal:
        z = z + torch.triu(torch.full(shape[-2:], float("-inf"), dtype=torch.float64, device=device), 1)
    expected = torch.softmax(z, -1).reshape(-1, shape[-1])
    x2d = x.reshape(-1, shape[-1])
    view = None if mask is None else MaskView.broadcast(mask.to(x.dtype).expand(shape))
    extra = (" masked" if mask is not None else "") + (" causal" if causal else "")
    what = f"softmax forward, {_name(shape, dtype, extra)}"
    with _unmodified(x2d, what=what), guard():
        y = backend.softmax_fwd(x2d, view, shape[-1] if causal else 0)
    _check_output(y, x2d, what)
    assert_rel_close(y, expected, tol=TOLERANCE[x.dtype], what=what)


def huge_logits(backend: Backend, *, device: str = "cpu", guard=_NO_GUARD) -> None:
    """Logits of +-1000 (exp overflows fp32 at 89): only a kernel that subtracts the max survives."""
    torch.manual_seed(7)
    x = torch.randn(13, 97, device=device) * 200
    x[0, :3] = torch.tensor([1000.0, 999.0, 0.0])
    x[1] -= 5000.0
    expected = torch.softmax(x.double(), -1)
    with guard():
        y = backend.softmax_fwd(x, None, 0)
    _check_output(y, x, "softmax forward with logits up to 1000")
    assert_rel_close(y, expected, what="softmax forward with logits up to 1000 (inf or NaN means no max subtraction)")


def masked_prefix(backend: Backend, *, rows: int = 3, cols: int = 16411, prefix: int = 8292, device: str = "cpu",
                  guard=_NO_GUARD) -> None:
    """A row longer than one tile whose first `prefix` columns are masked out (-inf): the online
    softmax sees whole chunks of -inf before any finite score, where exp(-inf - -inf) is NaN
    unless the running max and sum guard it."""
    torch.manual_seed(11)
    x = torch.randn(rows, cols, device=device) * 3
    mask = torch.zeros(1, cols, device=device)
    mask[:, :prefix] = float("-inf")
    expected = torch.softmax(x.double() + mask.double(), -1)
    what = f"softmax forward, ({rows}, {cols}) with the first {prefix} columns masked"
    with guard():
        y = backend.softmax_fwd(x, MaskView.broadcast(mask.expand(rows, cols)), 0)
    _check_output(y, x, what)
    assert_rel_close(y, expected, what=f"{what} (NaN: guard the all -inf prefix of the online softmax)")


def softmax_backward(backend: Backend, shape, *, dtype: str = "fp32", seed: int = 0, device: str = "cpu",
                     guard=_NO_GUARD) -> None:
    """dx = y (dy - sum dy y) from y = softmax(x) stored in `dtype`, against float64 autograd."""
    torch.manual_seed(seed)
    cols = shape[-1]
    y = torch.softmax(torch.randn(shape, device=device).double() * 3, -1).to(DTYPES[dtype]).reshape(-1, cols)
    dy = torch.randn_like(y)
    yd, dyd = y.double(), dy.double()
    expected = yd * (dyd - (dyd * yd).sum(-1, keepdim=True))
    what = f"softmax backward, {_name(shape, dtype)}"
    with _unmodified(y, dy, what=what), guard():
        dx = backend.softmax_bwd(y, dy)
    _check_output(dx, y, what)
    assert_rel_close(dx, expected, tol=4 * TOLERANCE[y.dtype], what=what, floor=1e-6)


def _ln_inputs(shape, dtype, seed, scale, offset, affine, device):
    torch.manual_seed(seed)
    cols = shape[-1]
    x = (torch.randn(shape, device=device) * scale + offset).to(DTYPES[dtype]).reshape(-1, cols)
    w = (torch.randn(cols, device=device) * 0.5 + 1).to(x.dtype) if affine[0] else None
    b = torch.randn(cols, device=device).to(x.dtype) if affine[1] else None
    return x, w, b


def layer_norm_forward(backend: Backend, shape, *, dtype: str = "fp32", seed: int = 0, scale: float = 2.0,
                       offset: float = 0.0, affine=(True, True), eps: float = 1e-5, tol: float | None = None,
                       device: str = "cpu", guard=_NO_GUARD) -> None:
    """y, mean and rstd of LayerNorm over the last dim, weight / bias optional."""
    x, w, b = _ln_inputs(shape, dtype, seed, scale, offset, affine, device)
    xd = x.double()
    expected = F.layer_norm(xd, xd.shape[-1:], None if w is None else w.double(),
                            None if b is None else b.double(), eps)
    mean = xd.mean(-1)
    rstd = torch.rsqrt(xd.var(-1, unbiased=False) + eps)
    what = f"layer_norm forward, {_name(shape, dtype, f' affine={affine}')}"
    with _unmodified(*[t for t in (x, w, b) if t is not None], what=what), guard():
        out = backend.layer_norm_fwd(x, w, b, eps)
    if not (isinstance(out, tuple) and len(out) == 3):
        raise AssertionError(f"{what}: must return (y, mean, rstd)")
    y, got_mean, got_rstd = out
    _check_output(y, x, what)
    tol = tol or TOLERANCE[x.dtype]
    assert_rel_close(y, expected, tol=tol, what=what)
    for name, got, want in (("mean", got_mean, mean), ("rstd", got_rstd, rstd)):
        _check_output(got, torch.empty(x.shape[0], dtype=torch.float32, device=device), f"{what}, {name}")
        assert_rel_close(got, want, tol=max(tol, TOLERANCE[torch.float32]), what=f"{what}, saved {name}")


def layer_norm_backward(backend: Backend, shape, *, dtype: str = "fp32", seed: int = 0, scale: float = 2.0,
                        offset: float = 0.0, affine=(True, True), grads=("dx", "dweight", "dbias"),
                        device: str = "cpu", guard=_NO_GUARD) -> None:
    """dx (and dweight, dbias) from the exact float64 mean / rstd, against float64 autograd."""
    x, w, b = _ln_inputs(shape, dtype, seed, scale, offset, affine, device)
    dy = torch.randn_like(x)
    ref = [t.double().requires_grad_() if t is not None else None for t in (x, w, b)]
    F.layer_norm(ref[0], x.shape[-1:], ref[1], ref[2], 1e-5).backward(dy.double())
    xd = x.double()
    mean = xd.mean(-1).float()
    rstd = torch.rsqrt(xd.var(-1, unbiased=False) + 1e-5).float()
    what = f"layer_norm backward, {_name(shape, dtype, f' affine={affine}')}"
    need_w, need_b = w is not None and "dweight" in grads, b is not None and "dbias" in grads
    with _unmodified(*[t for t in (dy, x, w, mean, rstd) if t is not None], what=what), guard():
        out = backend.layer_norm_bwd(dy, x, w, mean, rstd, need_w, need_b)
    if not (isinstance(out, tuple) and len(out) == 3):
        raise AssertionError(f"{what}: must return (dx, dweight, dbias)")
    tol = 8 * TOLERANCE[x.dtype]
    for name, got, r, like in (("dx", out[0], ref[0], x), ("dweight", out[1], ref[1], w), ("dbias", out[2], ref[2], b)):
        if name not in grads or r is None:
            continue
        _check_output(got, like, f"{what}, {name}")
        # dweight / dbias sum over all rows: their error grows like sqrt(rows) in fp16 / bf16
        scaled = tol * (1 if name == "dx" else max(1.0, math.sqrt(x.shape[0]) / 8))
        assert_rel_close(got, r.grad, tol=scaled, what=f"{what}, {name}", floor=1e-6)


def unaligned_views(backend, *, rows: int, device: str = "cpu") -> None:
    """The autograd path on a view 4 bytes past a 16-byte boundary with an odd width (771): the
    kernels must fall back to scalar loads. Softmax forward and backward, LayerNorm forward,
    against float64 torch."""
    from scaletrain.ops import layer_norm, softmax
    from scaletrain.testing import assert_close

    torch.manual_seed(3)
    base = torch.randn(rows * 771 + 1, device=device)
    x = base[1:].view(rows, 771).requires_grad_()
    y = softmax(x, backend=backend)
    xr = x.detach().double().requires_grad_()
    yr = torch.softmax(xr, -1)
    dy = torch.randn_like(x)
    y.backward(dy)
    yr.backward(dy.double())
    assert_close(y, yr, what="unaligned softmax")
    assert_close(x.grad, xr.grad, rtol=1e-4, what="unaligned softmax grad", floor=1e-6)
    h = layer_norm(x.detach(), 771, backend=backend)
    assert_close(h, F.layer_norm(x.detach().double(), (771,)), what="unaligned layer_norm")
