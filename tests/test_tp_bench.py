"""`python -m scaletrain.bench tp --quick`: runs, and its figures agree with the closed forms."""

from __future__ import annotations

from scaletrain import bench
from scaletrain.tp import benchmark


def test_quick_benchmark_bytes_and_activations_match_the_formulas(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALETRAIN_BENCH_OUT", str(tmp_path))
    seen = []
    monkeypatch.setattr(benchmark, "table", lambda rows, _table=benchmark.table: seen.extend(_table(rows)) or seen)
    assert bench.main(["tp", "--quick", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "torch parallelize_module" in out and (tmp_path / "tp.png").is_file()
    assert {(r["t"], r["SP"], r["variant"]) for r in seen} == {
        (2, sp, v) for sp in ("off", "on") for v in ("ours (ring)", "ours (torch collectives)", benchmark.BASELINE)}
    for r in seen:
        assert r["ms"] > 0 and r["ratio"] > 0 and r["KB sent/rank"] > 0
        if r["variant"].startswith("ours"):  # same layers, either wire: the formula's activations exactly
            assert r["blocks act KB"] == r["blocks formula KB"], r
        if r["variant"] == "ours (ring)":   # every byte our ring sent is in the closed form
            assert r["KB counted"] == r["KB formula"], r
