"""`python -m scaletrain.bench cross_entropy` on CPU: every path it times runs, the baseline's row
reads 1.00, and the peak memory it reports shows the chunked linear + cross-entropy holding a
fraction of the logits that F.linear + F.cross_entropy materializes (three times over, with the
log-probabilities and the gradient)."""

import math

import pytest
import torch

from scaletrain.ops import ceiling, cross_entropy_benchmark as ceb

CEILINGS = ceiling.Ceilings(device="test", copy_gbps=10.0, copy_mib=1, matmul_tflops=0.01, matmul_dtype="fp32",
                            matmul_size=64, sheet=None)


def test_criterion_rows_on_cpu():
    rows = ceb.criterion_rows(64, 1000, "fp32", device="cpu", ceilings=CEILINGS, reps=2)
    assert [r["variant"] for r in rows] == ["F.cross_entropy", "composed"]  # no fused kernel timed on a CPU
    assert rows[0]["x F.cross_entropy"] == 1.0
    assert rows[0]["peak / logits"] == pytest.approx(3.0, abs=0.01)  # log-probabilities, their gradient, dlogits
    assert all(r["% copy"] == pytest.approx(10 * r["GB/s"]) for r in rows)


def test_linear_rows_show_the_chunked_version_holds_a_fraction_of_the_logits():
    rows = ceb.linear_rows(512, 32, 2048, "fp32", device="cpu", ceilings=CEILINGS, reps=2)
    full, chunked = rows
    assert (full["variant"], chunked["variant"]) == ("linear + F.cross_entropy", "chunked, torch criterion")
    assert chunked["chunk rows"] == 8 and full["chunk rows"] == 512  # Liger: 512 / ceil(2048 / 32)
    assert full["peak / logits"] >= 3 and chunked["peak / logits"] < 0.5
    assert all(r["% matmul"] == pytest.approx(1e4 * r["TFLOP/s"]) and math.isfinite(r["TFLOP/s"]) for r in rows)


def test_the_command_prints_both_tables_and_saves_the_plot(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALETRAIN_BENCH_OUT", str(tmp_path))
    assert ceb.main(["--quick", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "no datasheet" in out and "1. the criterion" in out and "chunked, torch criterion" in out
    assert (tmp_path / "cross_entropy_memory.png").stat().st_size > 10_000


def test_a_bad_dtype_names_the_choices(capsys):
    with pytest.raises(SystemExit):
        ceb.main(["--dtype", "fp8"])
    assert "fp32, bf16" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: on a GPU --variants runs the benchmark")
def test_variants_are_refused_on_a_cpu_with_the_reason(capsys):
    with pytest.raises(SystemExit) as exit_:
        ceb.main(["--variants"])
    assert exit_.value.code == 2 and "run it on a GPU" in capsys.readouterr().err
