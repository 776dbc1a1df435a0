"""The kernel benchmark's ceilings (scaletrain.ops.ceiling) and its percentage arithmetic, on CPU:
the copy counts bytes read + written, the matmul 2 n^3 flops, each row's % copy and % datasheet divide
by the ceilings of the same run, a device without a datasheet gets NaN, never a guessed figure."""

import math

import pytest
import torch

from scaletrain import bench
from scaletrain.ops import benchmark, ceiling, naive
from scaletrain.ops.backends import Backend


def _one_second(fn, **_):
    fn()
    return bench.Timing((1.0, 1.0, 1.0))


def test_the_copy_counts_bytes_read_and_written(monkeypatch):
    monkeypatch.setattr(bench, "time_fn", _one_second)
    assert ceiling.copy_bytes(1000, 2) == 4000
    assert ceiling.measure_copy("cpu", mib=1) == pytest.approx(2 * 2**20 / 1e9)  # 1 MiB read, 1 MiB written, 1 s


def test_the_matmul_counts_two_flops_per_multiply_add(monkeypatch):
    monkeypatch.setattr(bench, "time_fn", _one_second)
    assert ceiling.matmul_flops(3, 5, 7) == 210
    assert ceiling.measure_matmul("cpu", size=64, dtype=torch.float32) == pytest.approx(2 * 64**3 / 1e12)


def test_a_roof_takes_the_fastest_repetition_a_ceiling_the_median(monkeypatch):
    """The profile's roofline (best: noise only slows a run) and the kernel benchmark's ceiling
    (the median, as its rows) time the same copy and product."""
    monkeypatch.setattr(bench, "time_fn", lambda fn, **_: (fn(), bench.Timing((1.0, 2.0, 4.0)))[1])
    assert ceiling.measure_copy("cpu", mib=1) == pytest.approx(2 * 2**20 / 1e9 / 2.0)
    assert ceiling.measure_copy("cpu", mib=1, best=True) == pytest.approx(2 * 2**20 / 1e9)
    assert ceiling.measure_matmul("cpu", size=8, dtype=torch.float32, best=True) == pytest.approx(2 * 8**3 / 1e12)


def test_measured_on_this_cpu_with_no_datasheet():
    c = ceiling.measure("cpu", quick=True)
    assert c.copy_gbps > 0 and math.isfinite(c.copy_gbps) and c.matmul_tflops > 0 and c.matmul_dtype == "fp32"
    assert c.sheet is None and c.sheet_tflops is None
    rows = ceiling.ceiling_rows(c)
    assert [r["datasheet"] for r in rows] == ["no datasheet"] * 2 and all(math.isnan(r["% datasheet"]) for r in rows)


@pytest.mark.parametrize("name,gbps,bf16", [("NVIDIA H100 80GB HBM3", 3350, 989.5), ("NVIDIA H100 PCIe", 2000, 756.5),
                                            ("NVIDIA H100 NVL", 3900, 835.5), ("NVIDIA H200", 4800, 989.5),
                                            ("NVIDIA H200 NVL", 4800, 835.5)])
def test_datasheet_by_device_name(name, gbps, bf16):
    sheet = ceiling.datasheet(name)
    assert (sheet.gbps, sheet.bf16_tflops, sheet.fp32_tflops > 0) == (gbps, bf16, True)
    assert "nvidia.com" in sheet.source


def test_an_unknown_device_has_no_datasheet():
    assert ceiling.datasheet("Some New Accelerator") is None


@pytest.mark.parametrize("ceiling_value", [None, 0.0, float("nan"), float("inf")])
def test_percent_of_an_unknown_ceiling_is_nan(ceiling_value):
    assert math.isnan(ceiling.percent(1.0, ceiling_value))


def test_percent():
    assert ceiling.percent(50.0, 200.0) == 25.0 and ceiling.percent(300.0, 200.0) == 150.0


def test_every_row_reads_against_the_ceilings_of_its_run():
    c = ceiling.Ceilings(device="test", copy_gbps=10.0, copy_mib=1, matmul_tflops=1.0, matmul_dtype="fp32",
                         matmul_size=64, sheet=None)
    fused = {"fused": Backend.from_modules("torch", naive, naive)}  # a third backend, timed with the other two
    rows = benchmark.speed_rows("softmax", "fwd", fused, m=8, n=48, dtype="fp32", ceilings=c, device="cpu",
                                reps=3, warmup=1, pool=2)
    assert [r["backend"] for r in rows] == ["fused", "naive", "native"]
    for r in rows:
        assert r["GB/s"] == pytest.approx(2 * 8 * 48 * 4 / (r["median ms"] / 1e3) / 1e9)  # read x, write y
        assert r["% copy"] == pytest.approx(10 * r["GB/s"]) and math.isnan(r["% datasheet"])
    assert rows[2]["x native"] == 1.0 and rows[1]["x naive"] == 1.0
    # a CPU has no host part to hide: the call columns are the kernel columns' measurement
    assert all(r["call ms"] == r["median ms"] and r["x native, call"] == r["x native"] for r in rows)
    with_peak = benchmark.speed_rows("layer_norm", "bwd", {}, m=4, n=32, dtype="bf16", ceilings=c, peak=100.0,
                                     device="cpu", reps=3, warmup=1, pool=2)
    assert all(r["% datasheet"] == pytest.approx(r["GB/s"]) for r in with_peak)
    assert all(r["GB/s"] == pytest.approx(3 * 4 * 32 * 2 / (r["median ms"] / 1e3) / 1e9) for r in with_peak)


def test_the_grid_is_llm_training_on_a_gpu_and_scaled_down_on_a_cpu():
    ms, ns, dtypes = benchmark.grid(cuda=True)
    assert (min(ms), max(ms), min(ns), max(ns), dtypes) == (4096, 32768, 512, 16384, ("fp32", "bf16"))
    assert benchmark.grid(cuda=False, full=True) == benchmark.grid(cuda=True)
    cpu_ms, cpu_ns, cpu_dtypes = benchmark.grid(cuda=False)
    assert max(cpu_ms) * max(cpu_ns) <= 2**20 and cpu_dtypes == ("fp32", "bf16")


@pytest.mark.parametrize("argv,message", [(["--dtype", "fp64"], "dtypes among"), (["--rows", "0"], "positive"),
                                          (["--sizes", "4k"], "comma-separated integers")])
def test_bad_options_name_the_fix(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        benchmark.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: on a GPU --variants runs the benchmark")
def test_variants_are_refused_on_a_cpu_with_the_reason(capsys):
    with pytest.raises(SystemExit) as exit_:
        benchmark.main(["--variants"])
    assert exit_.value.code == 2 and "run it on a GPU" in capsys.readouterr().err
