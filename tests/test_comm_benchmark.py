"""The allreduce benchmark's reporting on synthetic timings (no ranks): ratios, busbw, the fitted
model column, the byte check and the plot. The measurement itself runs in the notebook."""

import pytest

from scaletrain import bench
from scaletrain.comm import benchmark, cost_model


def _comparison(candidate_s, baseline_s):
    return bench.Comparison(bench.Timing(tuple(candidate_s)), bench.Timing(tuple(baseline_s)))


def _rows():
    truth = cost_model.AlphaBeta(alpha_s=50e-6, beta_s_per_byte=1e-9)
    rows = []
    for nbytes in (4 << 10, 1 << 20, 16 << 20):
        t = cost_model.predict(truth, "ring", 4, nbytes)
        ring = _comparison([t, t * 1.1, t * 0.9], [t, t, t])
        other = _comparison([2 * t] * 3, [t] * 3)
        rows.append(dict(p=4, nbytes=nbytes, ring=ring, naive=other, simple=other, rs=_comparison([t] * 3, [2 * t] * 3),
                         sent={"ring": 2 * 3 * (nbytes // 4 // 4) * 4, "tree": 2 * nbytes, "naive": 3 * nbytes}))
    return rows, truth


def test_table_reports_median_ratios_busbw_model_and_exact_bytes(tmp_path, monkeypatch):
    rows, truth = _rows()
    model = benchmark.fit_model(rows)
    assert model.alpha_s == pytest.approx(truth.alpha_s, rel=1e-6)
    table = benchmark.table_rows(rows, model)
    for row, r in zip(table, rows):
        assert row["ring/backend"] == pytest.approx(1.0) and row["naive/backend"] == pytest.approx(2.0)
        assert row["rs/backend rs"] == pytest.approx(0.5) and row["sent/bound"] == 1.0
        assert row["model ms"] == pytest.approx(r["ring"].candidate.median * 1e3, rel=1e-6)
        algbw = r["nbytes"] / r["ring"].baseline.median / 1e9
        assert row["backend busbw"] == pytest.approx(algbw * 2 * 3 / 4)
    text = bench.format_table(table, benchmark.COLUMNS)
    assert "ring/backend" in text and "16 MiB" in text and "4 KiB" in text
    monkeypatch.setenv("SCALETRAIN_BENCH_OUT", str(tmp_path))
    assert benchmark.plot(rows, "busbw.png") == tmp_path / "busbw.png"
    assert (tmp_path / "busbw.png").stat().st_size > 1000


def test_target_line_counts_cells_in_range_and_names_the_misses():
    def row(p, nbytes, ratio):
        return dict(p=p, nbytes=nbytes, ring=_comparison([ratio, ratio * 0.9, ratio * 1.1], [1.0] * 3))

    rows = [row(2, 4 << 10, 3.0),              # below 256 KiB: outside the target
            row(2, 256 << 10, 1.2), row(2, 64 << 20, 0.95), row(4, 1 << 20, 1.0)]
    line = benchmark.target_summary(rows)
    assert "met in 2 of 3 cells" in line and "missed: p=2 256 KiB 1.20" in line and "4 KiB" not in line
    assert "missed" not in benchmark.target_summary(rows[2:])
    assert "no size" in benchmark.target_summary(rows[:1])


def test_world_size_one_is_rejected_with_the_reason(capsys):
    with pytest.raises(SystemExit):
        benchmark.main(["--world-sizes", "1"])
    assert "p must be >= 2" in capsys.readouterr().err


def test_sweep_names_a_missing_ring_file_before_starting_ranks(tmp_path, monkeypatch):
    """a2 task 2.4's `--sweep --impl DIR`: a folder without ring.py is an error naming the file."""
    monkeypatch.delenv("SCALETRAIN_STUDENT_FILES", raising=False)
    with pytest.raises(SystemExit, match="ring.py is missing"):
        benchmark.main(["--sweep", "--impl", str(tmp_path)])


def test_latency_summary_separates_the_stalls_from_the_median():
    times = [1e-4] * 80 + [3e-3] * 20  # a fifth of the exchanges stalled for 3 ms
    row = benchmark.latency_summary(2, 128 << 10, times)
    assert row["median ms"] == pytest.approx(0.1) and row["stalled"] == "20%"
    assert row["stalled mean ms"] == pytest.approx(3.0) and row["mean ms"] == pytest.approx(0.68)
    assert row["exchanges"] == 100 and row["size"] == "128 KiB"
    assert benchmark.latency_summary(2, 4096, [1e-4] * 10)["stalled"] == "0%"
