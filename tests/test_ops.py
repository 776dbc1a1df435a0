"""scaletrain.ops on CPU: the "torch" backend (naive composed ops) against torch's native
softmax / layer_norm, the argument checks, the mask view, the traffic model and the comparison
helper.  The Triton kernels are tested in test_ops_triton.py (interpreter), CUDA in
test_kernels_cuda.py (GPU only)."""

import pytest
import torch
import torch.nn.functional as F

from scaletrain.ops import MaskView, layer_norm, softmax, traffic
from scaletrain.ops.backends import Backend, resolve
from scaletrain.testing import TOLERANCE, assert_close, rel_error


def _up(t):
    """The reference's copy: float64, so that its own rounding is far below every tolerance."""
    return None if t is None else t.detach().double()


def _softmax_ref(x, dim=-1, mask=None, causal=False):
    z = x if mask is None else x + mask
    if causal:
        s = x.shape[-1]
        z = z + torch.triu(torch.full((s, s), float("-inf"), dtype=z.dtype), 1)
    return torch.softmax(z, dim)


def _check_softmax(x, *, dim=-1, mask=None, causal=False, backend="torch"):
    x = x.clone().requires_grad_()
    x_before = x.detach().clone()
    dy = torch.randn_like(x)
    y = softmax(x, dim=dim, mask=mask, causal=causal, backend=backend)
    y.backward(dy)
    xr = _up(x).requires_grad_()
    yr = _softmax_ref(xr, dim, _up(mask), causal)
    yr.backward(_up(dy))
    tol = TOLERANCE[x.dtype]
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_close(y, yr, rtol=tol, what="softmax forward")
    assert_close(x.grad, xr.grad, rtol=4 * tol, what="softmax backward", floor=1e-6)
    assert torch.equal(x.detach(), x_before), "softmax modified its input"


@pytest.mark.parametrize("shape", [(1823, 781), (7, 1), (3, 9001), (2, 5, 33)])
def test_torch_backend_softmax_matches_native(shape):
    torch.manual_seed(0)
    _check_softmax(torch.randn(shape) * 4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_torch_backend_softmax_dtypes(dtype):
    torch.manual_seed(1)
    _check_softmax((torch.randn(37, 129) * 3).to(dtype))


def test_torch_backend_softmax_mask_causal_dim():
    torch.manual_seed(2)
    b, h, s = 2, 3, 19
    pad = torch.where(torch.rand(b, 1, 1, s) < 0.3, float("-inf"), 0.0)
    pad[..., 0] = 0.0  # keep key 0 visible so that no causal row is fully hidden
    _check_softmax(torch.randn(b, h, s, s), mask=pad, causal=True)
    _check_softmax(torch.randn(b, h, s, s), mask=torch.randn(s, s))
    _check_softmax(torch.randn(4, 6, 5), dim=1)


def test_softmax_mask_gradient_and_fully_masked_rows():
    torch.manual_seed(3)
    x = torch.randn(2, 4, 6)
    mask = torch.randn(2, 1, 6, requires_grad=True)
    dy = torch.randn_like(x)
    softmax(x, mask=mask, backend="torch").backward(dy)
    mr = mask.detach().clone().requires_grad_()
    torch.softmax(x + mr, -1).backward(dy)
    assert_close(mask.grad, mr.grad, what="mask gradient")
    hidden = torch.zeros(3, 5)
    hidden[1] = float("-inf")
    y = softmax(torch.randn(3, 5), mask=hidden, backend="torch")
    assert torch.isnan(y[1]).all() and not torch.isnan(y[[0, 2]]).any()  # as torch.softmax


def test_softmax_large_inputs_do_not_overflow():
    x = torch.tensor([[1000.0, 999.0, 0.0], [-1000.0, -1001.0, -5000.0]])
    assert_close(softmax(x, backend="torch"), torch.softmax(x, -1), what="softmax of large inputs")


def _check_layer_norm(x, shape, *, affine=(True, True), backend="torch", offset=0.0):
    torch.manual_seed(4)
    x = (x + offset).clone().requires_grad_()
    x_before = x.detach().clone()
    w = torch.randn(shape, dtype=x.dtype).requires_grad_() if affine[0] else None
    b = torch.randn(shape, dtype=x.dtype).requires_grad_() if affine[1] else None
    dy = torch.randn_like(x)
    y = layer_norm(x, shape, w, b, backend=backend)
    y.backward(dy)
    ref = [_up(t).requires_grad_() if t is not None else None for t in (x, w, b)]
    yr = F.layer_norm(ref[0], shape, ref[1], ref[2])
    yr.backward(_up(dy))
    tol = TOLERANCE[x.dtype]
    assert_close(y, yr, rtol=tol, what="layer_norm forward")
    for name, got, want in zip(("dx", "dweight", "dbias"), (x.grad, getattr(w, "grad", None), getattr(b, "grad", None)),
                               (r.grad if r is not None else None for r in ref)):
        if want is not None:
            assert_close(got, want, rtol=8 * tol, what=f"layer_norm {name}", floor=1e-6)
    assert torch.equal(x.detach(), x_before), "layer_norm modified its input"


@pytest.mark.parametrize("shape,norm", [((1823, 781), (781,)), ((3, 9001), (9001,)), ((2, 5, 6, 7), (6, 7))])
def test_torch_backend_layer_norm_matches_native(shape, norm):
    _check_layer_norm(torch.randn(shape) * 2, norm)


def test_torch_backend_layer_norm_variants():
    _check_layer_norm(torch.randn(64, 96), (96,), affine=(False, False))
    _check_layer_norm(torch.randn(64, 96), (96,), affine=(True, False))
    _check_layer_norm(torch.randn(64, 96), (96,), affine=(False, True))
    _check_layer_norm(torch.randn(64, 96), (96,), offset=100.0)
    _check_layer_norm(torch.randn(64, 96).to(torch.float16), (96,))
    _check_layer_norm(torch.randn(64, 96).to(torch.bfloat16), (96,))


def test_layer_norm_one_element_rows():
    x = torch.randn(7, 1, requires_grad=True)
    w = torch.randn(1, requires_grad=True)
    b = torch.randn(1, requires_grad=True)
    y = layer_norm(x, 1, w, b, backend="torch")
    assert torch.allclose(y, b.expand(7, 1))  # x - mean = 0: every output is the bias
    y.sum().backward()
    assert torch.all(x.grad == 0) and torch.all(w.grad == 0) and torch.allclose(b.grad, torch.tensor([7.0]))


@pytest.mark.parametrize("call,error,words", [
    (lambda: softmax(torch.arange(6).reshape(2, 3)), TypeError, "floating"),
    (lambda: softmax(torch.randn(3), backend="tpu"), ValueError, "unknown backend"),
    (lambda: softmax(torch.randn(3, 3), backend="cuda"), ValueError, "CUDA tensors"),
    (lambda: softmax(torch.randn(3, 3, dtype=torch.float64), backend="triton"), TypeError, "float64"),
    (lambda: softmax(torch.randn(3, 4), dim=2), IndexError, "out of range"),
    (lambda: softmax(torch.randn(3, 4), causal=True), ValueError, "(..., s, s)"),
    (lambda: softmax(torch.randn(3, 4), mask=torch.ones(3, 4, dtype=torch.bool)), TypeError, "torch.where"),
    (lambda: softmax(torch.randn(3, 4), mask=torch.zeros(2, 4)), ValueError, "does not broadcast"),
    (lambda: softmax(torch.tensor(1.0)), ValueError, "at least one dimension"),
    (lambda: layer_norm(torch.randn(3, 4), (3,)), ValueError, "trailing dims"),
    (lambda: layer_norm(torch.randn(3, 4), 4, weight=torch.ones(5)), ValueError, "shape (4,)"),
    (lambda: layer_norm(torch.randn(3, 4), 4, weight=torch.ones(4, dtype=torch.float64)), TypeError, "weight.to"),
    (lambda: layer_norm(torch.randn(3, 4), 4, eps=-1.0), ValueError, "eps"),
])
def test_clear_errors(call, error, words):
    with pytest.raises(error, match=None) as info:
        call()
    assert words in str(info.value), str(info.value)


def test_triton_on_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        softmax(torch.randn(2, 3), backend="triton")


def test_auto_picks_torch_on_cpu():
    assert resolve("auto", torch.randn(2), "softmax").name == "torch"


def test_mask_view_merges_broadcast_dims_and_matches_expand():
    torch.manual_seed(5)
    b, h, s = 2, 3, 5
    cases = [torch.randn(b, 1, 1, s), torch.randn(s, s), torch.randn(b, 1, s, s), torch.randn(1, h, 1, 1),
             torch.randn(b, h, s, s)[..., ::2, :].repeat(1, 1, 2, 1)[..., :s, :]]
    for mask in cases:
        full = mask.expand(b, h, s, s)
        view = MaskView.broadcast(full)
        assert torch.equal(view.dense(b * h * s, s), full.reshape(-1, s))
        assert view.tensor.data_ptr() == mask.data_ptr()  # no copy
    assert MaskView.broadcast(torch.randn(b, 1, 1, s).expand(b, h, s, s)).kernel_args() == (b, h * s, 0, s, 0, 1)
    # five leading dims that cannot merge: the mask is materialized once
    odd = torch.randn(2, 1, 3, 1, 2, 4).expand(2, 3, 3, 2, 2, 4)
    view = MaskView.broadcast(odd)
    assert torch.equal(view.dense(72, 4), odd.reshape(-1, 4))


@pytest.mark.parametrize("m,n", [(7, 13), (64, 300)])
def test_naive_traffic_formulas_match_counted_aten_ops(m, n):
    from scaletrain.ops import naive
    x, dy, w, b = torch.randn(m, n), torch.randn(m, n), torch.randn(n), torch.randn(n)
    _, mean, rstd = naive.layer_norm_fwd(x, w, b, 1e-5)
    calls = {("softmax", "fwd"): (naive.softmax_fwd, (x,)), ("softmax", "bwd"): (naive.softmax_bwd, (x, dy)),
             ("layer_norm", "fwd"): (naive.layer_norm_fwd, (x, w, b, 1e-5)),
             ("layer_norm", "bwd"): (naive.layer_norm_bwd, (dy, x, w, mean, rstd, True, True))}
    for key, (fn, args) in calls.items():
        counted, ops = traffic.count_traffic(fn, *args)
        assert counted == traffic.naive(*key, m, n), (key, ops)
    # the seed's numbers: read 5MN + 2M, write 3MN + 2M; fused: MN each way
    assert traffic.naive("softmax", "fwd", m, n) == traffic.Traffic(5 * m * n + 2 * m, 3 * m * n + 2 * m)
    assert traffic.fused("softmax", "fwd", m, n) == traffic.Traffic(m * n, m * n)


def test_layer_norm_backward_traffic_one_pass_against_two():
    """x, dy read once for dx, dw and db (plus P partial rows) against a second pass over x and dy:
    at M = N = 4096 the design ceilings are 92 % and 60 % of the copy (notebook 01, section 9)."""
    m = n = 4096
    lo = traffic.minimum("layer_norm", "bwd", m, n)
    one = traffic.fused("layer_norm", "bwd", m, n, programs=264)
    two = traffic.fused("layer_norm", "bwd", m, n, dwdb_pass=True)
    assert one == traffic.Traffic(lo.read + 2 * 264 * n, lo.write + 2 * 264 * n)
    assert two == traffic.Traffic(lo.read + 2 * m * n + 2 * m, lo.write)
    assert round(lo.total / one.total, 2) == 0.92 and round(lo.total / two.total, 2) == 0.60
    assert traffic.fused("layer_norm", "bwd", m, 9001, looped=True) == traffic.fused(
        "layer_norm", "bwd", m, 9001, looped=True, dwdb_pass=True), "long rows always take the second pass"


def test_rel_error_fails_all_zeros_and_nan_mismatch():
    y = torch.softmax(0.3 * torch.randn(64, 1000), -1)  # entries near 1e-3
    assert rel_error(torch.zeros_like(y), y) == 1.0  # an absolute atol=1e-2 would have passed it
    assert torch.allclose(torch.zeros_like(y), y, atol=1e-2)
    with pytest.raises(AssertionError, match="relative error 1 >"):
        assert_close(torch.zeros_like(y), y)
    nan = y.clone()
    nan[0, 0] = float("nan")
    assert rel_error(nan, y) == float("inf")
    assert rel_error(y * (1 + 1e-7), y) < 2e-7


def test_a_wrong_kernel_fails_these_checks():
    """The trials can fail: an all-zeros softmax, a modified input, a wrong dtype."""
    from scaletrain.ops import conformance, naive
    zeros = Backend(name="zeros", softmax_fwd=lambda x, m, c: torch.zeros_like(x), softmax_bwd=naive.softmax_bwd,
                    layer_norm_fwd=naive.layer_norm_fwd, layer_norm_bwd=naive.layer_norm_bwd, dtypes=())
    with pytest.raises(AssertionError, match="relative error 1 >"):
        conformance.softmax_forward(zeros, (4, 781))
    inplace = Backend(name="in place", softmax_fwd=lambda x, m, c: x.exp_(),
                      softmax_bwd=naive.softmax_bwd, layer_norm_fwd=naive.layer_norm_fwd,
                      layer_norm_bwd=naive.layer_norm_bwd, dtypes=())
    with pytest.raises(AssertionError, match="modified in place"):
        conformance.softmax_forward(inplace, (4, 7))
    wrong_dtype = Backend(name="fp32 out", softmax_fwd=lambda x, m, c: naive.softmax_fwd(x.float(), m, c),
                          softmax_bwd=naive.softmax_bwd, layer_norm_fwd=naive.layer_norm_fwd,
                          layer_norm_bwd=naive.layer_norm_bwd, dtypes=())
    with pytest.raises(AssertionError, match="expected"):
        conformance.softmax_forward(wrong_dtype, (4, 7), dtype="fp16")


@pytest.mark.parametrize("shape", [(31, 257), (3, 9001), (7, 1), (2, 3, 45)])
def test_conformance_trials_pass_on_the_naive_backend(shape):
    """The grader's trials accept a correct backend (the naive one), whatever the row regime."""
    from scaletrain.ops import conformance as cf
    from scaletrain.ops.backends import get_backend
    torch_backend = get_backend("torch")
    cf.softmax_forward(torch_backend, shape)
    cf.softmax_backward(torch_backend, shape)
    cf.layer_norm_forward(torch_backend, shape, offset=1.0)
    cf.layer_norm_backward(torch_backend, shape)
    cf.huge_logits(torch_backend)


def test_benchmark_without_gpu_says_so_and_prints_the_traffic_table(tmp_path, monkeypatch, capsys):
    from scaletrain import bench
    monkeypatch.setenv("SCALETRAIN_BENCH_OUT", str(tmp_path))
    assert bench.main(["kernels", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "cannot be timed" in out and "naive/fused" in out and "% copy" in out and "no datasheet" in out
    assert (tmp_path / "kernels_traffic.png").stat().st_size > 10_000
    assert (tmp_path / "kernels_bandwidth_fp32.png").stat().st_size > 10_000


def test_strided_inputs_and_parameters_are_handled():
    torch.manual_seed(6)
    x = torch.randn(8, 40)[:, ::2]               # non-contiguous rows
    w, b = torch.randn(40)[::2], torch.randn(40)[1::2]
    assert_close(layer_norm(x, 20, w, b, backend="torch"),
                 F.layer_norm(x.double(), (20,), w.double(), b.double()), what="strided layer_norm")
    assert_close(softmax(x.t(), dim=0, backend="torch"), torch.softmax(x.t().double(), 0), what="strided softmax")


def test_interpreter_mode_changed_after_importing_triton_is_a_clear_error(monkeypatch):
    """Triton fixes compiler-or-interpreter at its first import; flipping TRITON_INTERPRET later
    must be reported, not fail deep inside a kernel."""
    tl = pytest.importorskip("triton.language")
    from scaletrain.ops.backends import KERNELS_DIR, load_kernel_module
    interpreted = type(tl.max).__name__ == "InterpretedFunction"
    monkeypatch.setenv("TRITON_INTERPRET", "0" if interpreted else "1")
    with pytest.raises(RuntimeError, match="before the first `import triton`"):
        load_kernel_module(KERNELS_DIR / "softmax_triton.py")


def test_with_switch_sets_a_kernel_modules_switch_for_one_call_and_restores_it_even_on_error():
    import types

    from scaletrain.ops.backends import with_switch
    module = types.SimpleNamespace(FUSE_DWDB=True)
    seen = with_switch(module, "FUSE_DWDB", False, lambda x: (x, module.FUSE_DWDB))(7)
    assert seen == (7, False) and module.FUSE_DWDB is True

    def boom():
        raise RuntimeError("kernel failed")
    with pytest.raises(RuntimeError):
        with_switch(module, "FUSE_DWDB", False, boom)()
    assert module.FUSE_DWDB is True
