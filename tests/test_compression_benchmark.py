"""`python -m scaletrain.bench compression --quick` runs end to end, and its byte counts equal
the formulas (module 8)."""

from __future__ import annotations

import pytest

from scaletrain import bench, bench_cli

pytestmark = pytest.mark.slow


def test_compression_benchmark_quick(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALETRAIN_BENCH_OUT", str(tmp_path))
    assert bench_cli.benchmarks()["compression"] == "scaletrain.compression.benchmark"
    assert "compression" in bench_cli.distributed()
    assert bench.main(["compression", "--quick"]) == 0
    out = capsys.readouterr().out
    table = [line.split() for line in out.splitlines() if line.startswith("2 ")]
    assert [" ".join(cols[1:-13]) for cols in table] == ["adam (DP)", "powersgd r=1", "powersgd r=4", "1-bit EF", "1-bit Adam"]
    for cols in table:
        sent, formula = cols[-11], cols[-10]  # bytes/step (comm_counter) == the formula on every row
        assert sent == formula, cols
        assert float(cols[-8]) >= 1.0  # fewer_bytes_x
    assert (tmp_path / "compression_loss.png").exists()


def test_onebit_adam_row_is_the_baselines_adam_until_its_warmup_ends():
    """With torch Adam's bias correction the 1-bit Adam row's warm-up (the first 20 % of the steps) is
    the baseline's Adam on the same mean gradients: the loss gap it reports is the compression's."""
    from scaletrain.compression.benchmark import run

    steps = 20
    warmup = steps // 5
    res = run(2, steps=steps, reps=0, methods=("adam (DP)", "1-bit Adam"))["methods"]
    adam, onebit = res["adam (DP)"]["losses"], res["1-bit Adam"]["losses"]
    # loss i is measured before update i + 1: the first warmup + 1 losses follow warm-up updates only
    assert onebit[:warmup + 1] == pytest.approx(adam[:warmup + 1], rel=1e-5, abs=1e-6)
    assert onebit[-1] != pytest.approx(adam[-1], rel=1e-6)  # compressed momentum from then on
