"""`python -m scaletrain.bench memory --quick`: the table runs end to end, the measured peaks equal
the plans' and torch's, the scaler alone reproduces GradScaler's run, offload moves 4Ψ per step."""

import re

import pytest


@pytest.mark.slow
def test_memory_benchmark_quick(tmp_path, monkeypatch, capsys):
    from scaletrain import bench

    monkeypatch.setenv("SCALETRAIN_BENCH_OUT", str(tmp_path))
    assert bench.main(["memory", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "all three equal: True" in out
    for variant in ("none", "full (every block)", "√n segments", "planned at min peak", "selective (attention core)"):
        assert variant in out
    scaler_row = next(line for line in out.splitlines() if line.lstrip().startswith("autocast fp16 + our"))
    assert re.search(r"GradScaler\s+0\s", scaler_row), f"our scaler under autocast must reproduce GradScaler's losses: {scaler_row}"
    offload_row = next(line for line in out.splitlines() if "offload" in line)
    fields = offload_row.split()
    assert fields[-1] == fields[-2], f"offload bytes per step must equal 4Ψ: {offload_row}"
    assert (tmp_path / "memory.png").stat().st_size > 10_000
