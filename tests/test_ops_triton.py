"""The Triton kernels (kernels/*_triton.py) on CPU through the Triton interpreter, against
torch's native softmax / layer_norm, forward and backward, through scaletrain.ops' autograd
Functions.  Sizes are kept small except the Triton tutorial's irregular 1823 x 781 (the
interpreter costs ~1 ms of Python per program; see TILE_ELEMENTS in scaletrain/ops/tiles.py).

Triton fixes interpreter-or-compiler when it is imported, so every case runs in one worker
process started with TRITON_INTERPRET=1 (scaletrain.ops.toolchain.isolated.IsolatedWorker); the test
functions here only name the case.  Case functions build their inputs from a seed.
"""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from scaletrain.ops import layer_norm, softmax
from scaletrain.ops.toolchain.isolated import IsolatedWorker
from scaletrain.testing import TOLERANCE, assert_close
from launches import RecordedLaunches  # tests/ is on sys.path

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="the triton package is not installed (Linux x86-64 only)")


@pytest.fixture(scope="module")
def interp():
    with IsolatedWorker({"TRITON_INTERPRET": "1"}, timeout_s=240) as worker:
        yield worker.run


def _up(t):
    """The reference's copy: float64, so that its own rounding is far below every tolerance."""
    return None if t is None else t.detach().double()


# ---- cases: run inside the interpreter worker -------------------------------------------------
def trial(name, *args, **kwargs):
    """scaletrain.ops.conformance.<name> on the reference Triton backend (kernel-level calls)."""
    from scaletrain.ops import conformance
    from scaletrain.ops.backends import get_backend
    getattr(conformance, name)(get_backend("triton"), *args, **kwargs)


def autograd_softmax_case(shape, *, dtype=torch.float32, mask_shape=None, causal=False, dim=-1, seed=0):
    """Through scaletrain.ops.softmax: flattening, dim, the mask view and the mask's gradient."""
    torch.manual_seed(seed)
    x = (torch.randn(shape) * 3).to(dtype).requires_grad_()
    mask = None if mask_shape is None else torch.randn(mask_shape).requires_grad_()
    dy = torch.randn_like(x)
    y = softmax(x, dim=dim, mask=mask, causal=causal, backend="triton")
    y.backward(dy)
    xr = _up(x).requires_grad_()
    mr = None if mask is None else _up(mask).requires_grad_()
    z = xr if mr is None else xr + mr
    if causal:
        z = z + torch.triu(torch.full(shape[-2:], float("-inf"), dtype=z.dtype), 1)
    yr = torch.softmax(z, dim)
    yr.backward(_up(dy))
    tol = TOLERANCE[dtype]
    assert_close(y, yr, rtol=tol, what=f"softmax {tuple(shape)}")
    assert_close(x.grad, xr.grad, rtol=4 * tol, what="softmax dx", floor=1e-6)
    if mask is not None:
        assert_close(mask.grad, mr.grad, rtol=4 * tol, what="softmax dmask", floor=1e-6)


def autograd_layer_norm_case(shape, norm, *, dtype=torch.float32, seed=0):
    """Through scaletrain.ops.layer_norm: normalized_shape of several dims, weight and bias grads."""
    torch.manual_seed(seed)
    x = (torch.randn(shape) * 2 + 1).to(dtype).requires_grad_()
    w = (torch.randn(norm) * 0.5 + 1).to(dtype).requires_grad_()
    b = torch.randn(norm).to(dtype).requires_grad_()
    dy = torch.randn_like(x)
    layer_norm(x, norm, w, b, backend="triton").backward(dy)
    ref = [_up(t).requires_grad_() for t in (x, w, b)]
    yr = F.layer_norm(ref[0], norm, ref[1], ref[2])
    yr.backward(_up(dy))
    y = layer_norm(x.detach(), norm, w.detach(), b.detach(), backend="triton")
    tol = TOLERANCE[dtype]
    assert_close(y, yr, rtol=tol, what=f"layer_norm {tuple(shape)}")
    for name, got, r in (("dx", x.grad, ref[0]), ("dweight", w.grad, ref[1]), ("dbias", b.grad, ref[2])):
        assert_close(got, r.grad, rtol=8 * tol, what=f"layer_norm {name}", floor=1e-6)


def long_causal_rows_case():
    """Rows 0 and 1 of an 8200 x 8200 causal score matrix through the looped kernel: every chunk
    after the first is fully hidden, so the online (max, sum) must skip empty chunks."""
    from scaletrain.ops.backends import KERNELS_DIR, get_backend, load_kernel_module
    torch.manual_seed(1)
    rows = torch.randn(2, 8200)
    y = get_backend("triton").softmax_fwd(rows, None, 8200)
    expected = torch.zeros_like(rows)
    expected[0, 0] = 1.0
    expected[1, :2] = torch.softmax(rows[1, :2], -1)
    assert_close(y, expected, what="causal softmax through the looped kernel")
    return type(load_kernel_module(KERNELS_DIR / "softmax_triton.py").softmax_fwd_kernel).__name__


def strided_case():
    """Non-contiguous x, weight and bias: the kernels assume unit strides, the API must copy."""
    torch.manual_seed(6)
    x = torch.randn(8, 40)[:, ::2]
    w, b = torch.randn(40)[::2], torch.randn(40)[1::2]
    assert_close(layer_norm(x, 20, w, b, backend="triton"),
                 F.layer_norm(x.double(), (20,), w.double(), b.double()), what="strided layer_norm")
    assert_close(softmax(x.t(), dim=0, backend="triton"), torch.softmax(x.t().double(), 0),
                 what="strided softmax")


def one_pass_dwdb_case(programs):
    """dw and db from the dx kernel's partial rows alone (the second kernel made to raise), with at
    most `programs` persistent programs, against the two-pass result and float64 torch; rows longer
    than a tile still take the second kernel."""
    from scaletrain.ops import conformance
    from scaletrain.ops.backends import KERNELS_DIR, get_backend, load_kernel_module
    ln = load_kernel_module(KERNELS_DIR / "layer_norm_triton.py")
    second, chooser = ln.layer_norm_bwd_dwdb_kernel, ln.dx_programs

    class Raises:
        def __getitem__(self, grid):
            raise AssertionError("the second dw/db kernel ran where the row fits one tile")
    try:
        ln.layer_norm_bwd_dwdb_kernel = Raises()
        if programs is not None:
            ln.dx_programs = lambda x, blocks: min(blocks, programs)
        for shape in ((613, 781), (4099, 64), (5, 3)):
            conformance.layer_norm_backward(get_backend("triton"), shape, grads=("dweight", "dbias"))
        ln.layer_norm_bwd_dwdb_kernel = second
        ln.FUSE_DWDB = False
        conformance.layer_norm_backward(get_backend("triton"), (613, 781), grads=("dweight", "dbias"))
    finally:
        ln.layer_norm_bwd_dwdb_kernel, ln.dx_programs, ln.FUSE_DWDB = second, chooser, True


def two_pass_benchmark_row_case():
    """bench kernels times Triton's LayerNorm backward both ways: its "triton 2-pass" backend runs
    the second kernel (counted), agrees with the one-pass result, and leaves FUSE_DWDB on."""
    from scaletrain.ops import benchmark
    from scaletrain.ops.backends import KERNELS_DIR, get_backend, load_kernel_module
    ln = load_kernel_module(KERNELS_DIR / "layer_norm_triton.py")
    backends = benchmark._backends_for("layer_norm", "bwd", {"triton": get_backend("triton")})
    assert set(backends) == {"triton", "triton 2-pass"}
    assert set(benchmark._backends_for("softmax", "bwd", {"triton": get_backend("triton")})) == {"triton"}
    second = ln.layer_norm_bwd_dwdb_kernel
    torch.manual_seed(3)
    x, dy, w = torch.randn(300, 200), torch.randn(300, 200), torch.randn(200)
    _, mean, rstd = ln.layer_norm_fwd(x, w, None, 1e-5)
    try:
        ln.layer_norm_bwd_dwdb_kernel = recorded = RecordedLaunches(second)
        one = backends["triton"].layer_norm_bwd(dy, x, w, mean, rstd, True, True)
        assert not recorded.seen, "one pass: no second kernel"
        two = backends["triton 2-pass"].layer_norm_bwd(dy, x, w, mean, rstd, True, True)
        assert len(recorded.seen) == 1 and ln.FUSE_DWDB
    finally:
        ln.layer_norm_bwd_dwdb_kernel = second
    for a, b in zip(one, two):
        assert_close(a, b, rtol=1e-5, what="one pass against two")


def launch_variants_case():
    """bench kernels --variants: each variant launches the same kernels with its own warps or rows a
    program (seen at the launch), computes what the default launch does, and leaves the rule in place."""
    from scaletrain.ops import tiles
    from scaletrain.ops.backends import KERNELS_DIR, get_backend, load_kernel_module
    from scaletrain.ops.launch_variants import variant_backends
    sm, ln = (load_kernel_module(KERNELS_DIR / f) for f in ("softmax_triton.py", "layer_norm_triton.py"))
    real = sm.softmax_fwd_kernel
    torch.manual_seed(4)
    x, dy, w, b = torch.randn(300, 200), torch.randn(300, 200), torch.randn(200), torch.randn(200)
    default, backends = get_backend("triton"), variant_backends()
    y, mean, rstd = default.layer_norm_fwd(x, w, b, 1e-5)
    expected = [default.softmax_fwd(x, None, 0), default.softmax_bwd(y, dy), y,
                *default.layer_norm_bwd(dy, x, w, mean, rstd, True, True)]
    try:
        sm.softmax_fwd_kernel = recorded = RecordedLaunches(real)
        for name, be in backends.items():
            got = [be.softmax_fwd(x, None, 0), be.softmax_bwd(y, dy), be.layer_norm_fwd(x, w, b, 1e-5)[0],
                   *be.layer_norm_bwd(dy, x, w, mean, rstd, True, True)]
            for what, a, e in zip(("softmax", "softmax dx", "layer_norm", "dx", "dw", "db"), got, expected):
                assert_close(a, e, rtol=1e-5, what=f"{name}: {what}")
    finally:
        sm.softmax_fwd_kernel = real
    # 200 columns -> 256 a row; the interpreter's own rule: 256 rows (65536 elements), 16 warps
    seen = [(kwargs["num_warps"], kwargs["BLOCK_M"]) for _, kwargs in recorded.seen]
    assert dict(zip(backends, seen)) == {"triton 4 warps": (4, 256), "triton 16 warps": (16, 256),
                                         "triton 2k/program": (4, 8), "triton 16k/program": (16, 64)}
    assert all(m._num_warps is tiles.num_warps and m.tile_shape is tiles.tile_shape for m in (sm, ln))


# ---- tests ------------------------------------------------------------------------------------
def test_the_benchmark_times_the_two_pass_layer_norm_backward_beside_the_one_pass(interp):
    interp(two_pass_benchmark_row_case)


def test_launch_variants_change_only_the_launch(interp):
    interp(launch_variants_case)


@pytest.mark.parametrize("programs", [None, 1, 3])
def test_layer_norm_dweight_dbias_in_one_pass(interp, programs):
    interp(one_pass_dwdb_case, programs)


def test_softmax_irregular_rows_through_autograd(interp):
    interp(autograd_softmax_case, (1823, 781))


def test_softmax_masks_causal_dim_through_autograd(interp):
    interp(autograd_softmax_case, (2, 3, 37, 37), mask_shape=(2, 1, 1, 37), causal=True)
    interp(autograd_softmax_case, (2, 3, 2, 4, 5), mask_shape=(2, 1, 2, 1, 5))  # > 3 leading dims
    interp(autograd_softmax_case, (4, 1000, 5), dim=1)
    interp(autograd_softmax_case, (9, 300), dtype=torch.bfloat16)


@pytest.mark.parametrize("shape", [(7, 1), (3, 9001), (2, 3, 45), (1, 1)])
def test_softmax_one_element_long_and_3d_rows(interp, shape):
    """(3, 9001) is longer than one tile (MAX_TILE_COLS = 8192): the two-pass online loop."""
    interp(trial, "softmax_forward", shape, seed=1)
    interp(trial, "softmax_backward", shape, seed=1)


def test_softmax_masks_half_and_huge_logits(interp):
    interp(trial, "softmax_forward", (2, 3, 37, 37), mask_shape=(37, 37))           # (s, s) bias
    interp(trial, "softmax_forward", (2, 9001), mask_shape=(1, 9001), pad=True)      # mask, looped
    interp(trial, "softmax_forward", (3, 41, 41), causal=True)
    for dtype in ("fp16", "bf16"):
        interp(trial, "softmax_forward", (67, 300), dtype=dtype)
        interp(trial, "softmax_backward", (67, 300), dtype=dtype)
    interp(trial, "huge_logits")
    assert interp(long_causal_rows_case) == "InterpretedFunction"


def test_strided_inputs_and_parameters(interp):
    interp(strided_case)


def test_layer_norm_irregular_rows_through_autograd(interp):
    interp(autograd_layer_norm_case, (1823, 781), (781,))
    interp(autograd_layer_norm_case, (2, 3, 5, 7), (5, 7))
    interp(autograd_layer_norm_case, (33, 64), (64,), dtype=torch.float16)


@pytest.mark.parametrize("shape", [(3, 9001), (300, 3), (7, 1)])
def test_layer_norm_long_short_and_one_element_rows(interp, shape):
    interp(trial, "layer_norm_forward", shape, offset=1.0)
    interp(trial, "layer_norm_backward", shape, offset=1.0)


def test_layer_norm_large_mean_no_affine_and_half(interp):
    """|mean| = 1000 sigma: fp32 input rounding alone is ~1e-4 relative to sigma; unshifted,
    mean(x^2) - mean(x)^2 in fp32 misses the variance by ~20% on these rows."""
    interp(trial, "layer_norm_forward", (50, 200), scale=1.0, offset=1000.0, tol=2e-4)
    for affine in ((False, False), (True, False), (False, True)):
        interp(trial, "layer_norm_forward", (50, 200), affine=affine)
        interp(trial, "layer_norm_backward", (50, 200), affine=affine)
    for dtype in ("fp16", "bf16"):
        interp(trial, "layer_norm_forward", (67, 300), dtype=dtype)
        interp(trial, "layer_norm_backward", (67, 300), dtype=dtype)
