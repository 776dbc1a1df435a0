"""Weight quantization (scaletrain.infer.quant, quant_linear) against its formulas: the scale by
calibration, the round trip within S/2 of every element in range, the real zero exact when
asymmetric, group-wise beating per-tensor on outlier-heavy weights, and the int8 matmul equal to
the float matmul on the dequantized weight (fp64)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from scaletrain.infer import QuantLinear, QuantSpec, dequantize, fake_quant, packed_bytes, quantize
from scaletrain.testing import assert_close

SPECS = [QuantSpec(bits=b, symmetric=s, granularity=gr, group_size=g)
         for b, s, (gr, g) in itertools.product((8, 4, 3), (True, False),
                                               [("tensor", 0), ("channel", 0), ("group", 12), ("group", 72)])]


def _weights(seed: int, shape=(10, 36)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64) * torch.rand(shape[0], 1, generator=g, dtype=torch.float64)


def _outliers(seed: int) -> torch.Tensor:
    w = _weights(seed, (64, 64)) * 0.05
    w.view(-1)[torch.randperm(w.numel(), generator=torch.Generator().manual_seed(seed))[:6]] = 4.0  # a few huge
    return w


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_round_trip_errs_at_most_half_a_step(spec):
    w = _weights(spec.bits)
    qt = quantize(w, spec)
    qmin, qmax = spec.qrange
    assert qt.q.dtype == torch.int8 and qmin <= int(qt.q.min()) and int(qt.q.max()) <= qmax
    err = (dequantize(qt) - w).reshape(-1, qt.group_size).abs()
    assert (err <= qt.scale[:, None] / 2 * (1 + 1e-9)).all()


def test_scale_and_zero_point_by_formula():
    w = _weights(0)
    for bits in (8, 4):
        sym = quantize(w, QuantSpec(bits=bits, granularity="channel"))
        assert_close(sym.scale, w.abs().amax(1) / (2 ** (bits - 1) - 1), rtol=1e-15)
        assert (sym.zero == 0).all()
        lo, hi = w.amin(1).clamp(max=0), w.amax(1).clamp(min=0)
        asym = quantize(w, QuantSpec(bits=bits, symmetric=False, granularity="channel"))
        assert_close(asym.scale, (hi - lo) / (2 ** bits - 1), rtol=1e-15)
        assert torch.equal(asym.zero, -2 ** (bits - 1) - torch.round(lo / asym.scale))


@pytest.mark.parametrize("bits", [8, 4])
def test_asymmetric_zero_point_represents_zero_exactly(bits):
    w = _weights(1).abs() + 0.3  # all positive: [α, β] is widened to hold 0
    w[:, ::5] = 0.0
    w[3] -= 2.0  # one row mostly negative
    w[3, ::5] = 0.0
    for gran in ("tensor", "channel", "group"):
        back = fake_quant(w, QuantSpec(bits=bits, symmetric=False, granularity=gran, group_size=12))
        assert torch.equal(back[:, ::5], torch.zeros_like(back[:, ::5])), gran


def test_percentile_calibration_clips_outliers_and_wins_at_four_bits():
    w = _outliers(2)
    minmax = fake_quant(w, QuantSpec(bits=4, granularity="tensor"))
    spec = QuantSpec(bits=4, granularity="tensor", calibration="percentile", percentile=99.0)
    qt = quantize(w, spec)
    beta = float(w.abs().flatten().quantile(0.99))
    assert_close(qt.scale, torch.tensor([beta / 7], dtype=torch.float64), rtol=1e-12)
    back, inside = dequantize(qt), w.abs() <= beta
    assert ((back - w).abs()[inside] <= qt.scale / 2 * (1 + 1e-9)).all()
    assert ((back - w)[inside] ** 2).mean() < ((minmax - w)[inside] ** 2).mean() / 10
    assert torch.equal(back[~inside].abs(), torch.full_like(back[~inside], 7 * float(qt.scale)))  # clipped to ±β


@pytest.mark.parametrize("bits,symmetric", [(8, True), (4, True), (4, False)])
def test_group_wise_error_at_most_per_tensor_on_outlier_heavy_weights(bits, symmetric):
    w = _outliers(bits)
    mse = {}
    for name, spec in {"tensor": QuantSpec(granularity="tensor"), "channel": QuantSpec(granularity="channel"),
                       "rows 4": QuantSpec(granularity="group", group_size=4 * 64),
                       "g 16": QuantSpec(granularity="group", group_size=16)}.items():
        spec = QuantSpec(**{**spec.__dict__, "bits": bits, "symmetric": symmetric})
        mse[name] = float(((fake_quant(w, spec) - w) ** 2).mean())
    assert mse["g 16"] <= mse["channel"] <= mse["rows 4"] <= mse["tensor"], mse
    assert mse["g 16"] < mse["tensor"] / 20, mse


def test_error_shrinks_with_bits():
    w = _weights(3)
    errs = [float((fake_quant(w, QuantSpec(bits=b)) - w).abs().max()) for b in (3, 4, 6, 8)]
    assert errs == sorted(errs, reverse=True) and errs[-1] < errs[1] / 10, errs


@pytest.mark.parametrize("spec", [QuantSpec(), QuantSpec(bits=4, symmetric=False, granularity="group", group_size=8),
                                  QuantSpec(granularity="group", group_size=96), QuantSpec(granularity="tensor")],
                         ids=str)
def test_int8_matmul_equals_the_dequantized_float_matmul(spec):
    torch.manual_seed(0)
    linear = nn.Linear(48, 24).double()
    layer = QuantLinear(linear, spec)
    x = torch.randn(3, 5, 48, dtype=torch.float64)
    assert layer.q.dtype == torch.int8 and not any(p.shape == linear.weight.shape for p in layer.parameters())
    assert_close(layer(x), F.linear(x, dequantize(layer.quantized), linear.bias), rtol=1e-12)


def test_weight_bytes():
    assert packed_bytes(4096, 32, bits=4, symmetric=True) == 2048 + 64
    assert packed_bytes(4096, 32, bits=4, symmetric=False) == 2048 + 64 + 16
    assert packed_bytes(4096, 1, bits=8, symmetric=True) == 4096 + 2
    layer = QuantLinear(nn.Linear(64, 32), QuantSpec(granularity="group", group_size=16))
    assert layer.nbytes == 64 * 32 + 128 * (4 + 4) + 32 * 4  # int8 codes, fp32 S and Z per group, bias


def test_rejects_groups_that_straddle_rows():
    with pytest.raises(ValueError, match="divide or be a multiple of a row"):
        quantize(torch.zeros(4, 12), QuantSpec(granularity="group", group_size=8))


@pytest.mark.parametrize("w", [torch.ones(4, 8, dtype=torch.int32), torch.tensor([[1.0, float("nan")] * 4] * 2),
                               torch.tensor([[1.0, float("inf")] * 4] * 2)], ids=["int", "nan", "inf"])
def test_rejects_what_has_no_uniform_grid(w):
    """Integer weights, NaN or inf: a clear error, not codes from a scale of NaN."""
    with pytest.raises(ValueError, match="finite floating-point weights"):
        quantize(w, QuantSpec())
