"""`python -m scaletrain.bench moe --quick` runs end to end: registered as a distributed benchmark,
its four tables printed with every row's byte count equal to the formula and the baselines' own
rows at 1.00, the load-balance table lists every α, and the plot is written."""

from __future__ import annotations

import pytest

from scaletrain import bench, bench_cli

pytestmark = pytest.mark.slow


def test_moe_benchmark_quick(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALETRAIN_BENCH_OUT", str(tmp_path))
    assert bench_cli.benchmarks()["moe"] == "scaletrain.moe.benchmark" and "moe" in bench_cli.distributed()
    assert bench.main(["moe", "--quick", "--reps", "2", "--steps", "8"]) == 0
    out = capsys.readouterr().out
    a2a = [line.split() for line in out.splitlines() if line.startswith("2 ") and ("equal" in line or "variable" in line)]
    assert [cols[1] for cols in a2a] == ["equal", "variable", "equal", "variable"]
    for cols in a2a:
        assert cols[-3] == cols[-2] and cols[-1] == "yes", cols  # KB sent (rank 0) == KB formula, every rank
    assert "every rank exact: yes" in out
    gemm = [line for line in out.splitlines() if line.lstrip().startswith("8  1024")]
    assert len(gemm) == 8 and sum(" loop " in line and " 1.00-1.00 " in line for line in gemm) == 2
    dense = next(line for line in out.splitlines() if line.strip().startswith("dense "))
    assert " 1.00-1.00 " in dense
    assert [line.split()[0] for line in out.splitlines() if line.strip()[:4] in ("0   ", "0.01", "0.1 ")] == ["0", "0.01", "0.1"]
    assert (tmp_path / "moe.png").exists()
