"""`python -m scaletrain.profile` on a CPU (issue 35 item 2): the three tables printed, the category
rows in the seeds' order with the step's total, both figures and a Chrome trace written."""

from __future__ import annotations

import json

from scaletrain.profile import CATEGORIES
from scaletrain.profile.__main__ import main
from scaletrain.profile.shapes import SHAPES


def test_the_cli_prints_the_tables_and_writes_figures_and_trace(tmp_path, capsys):
    assert main(["--device", "cpu", "--quick", "--steps", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "time by category, ms in the median step" in out and "costliest priced ops" in out and "MFU" in out
    firsts = [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0] in CATEGORIES]
    assert firsts[:3] == ["matmul", "attention", "normalization"] and "optimizer" in firsts
    assert any(line.strip().startswith("step (profiled)") for line in out.splitlines())
    assert "memory by tensor kind at the marks of a step" in out
    for name in ("profile_bars.png", "profile_roofline.png", "profile_memory.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "traceEvents" in json.loads((tmp_path / "profile_trace.json").read_text())


def test_the_gpu_shape_is_gpt2_small_as_the_seeds_profile_it():
    cfg, batch = SHAPES["gpt2"]  # training-speedup-lecture.md: s = 512, b = 8, h = 768 (GPT-2 small: 12 layers)
    assert (cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.block_size, batch, cfg.vocab_size) == (768, 12, 12, 512, 8, 50257)


def test_the_variants_benchmark_runs_quick_without_compile(tmp_path, monkeypatch, capsys):
    from scaletrain import bench

    monkeypatch.setenv("SCALETRAIN_BENCH_OUT", str(tmp_path))
    argv = ["profile", "--part", "variants", "--quick", "--no-compile", "--reps", "2", "--device", "cpu"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    eager = next(line for line in out.splitlines() if line.strip().startswith("eager "))
    assert " 1.00-1.00 " in eager and "checkpointed MLP" in out
    assert "compiled (inductor) left out: not asked for (compile=False)" in out
    assert "fused kernels (triton) left out: not measured on CPU" in out
    assert (tmp_path / "profile_variants.png").exists()


def test_the_variants_plot_takes_a_median_just_outside_its_rounded_band(tmp_path, monkeypatch):
    """The H200's compiled row: 0.977 in "0.98-0.98" (the table rounds the band); matplotlib refuses a
    negative error bar, and the whole benchmark died after its table."""
    from scaletrain.profile.benchmark import plot

    monkeypatch.setenv("SCALETRAIN_BENCH_OUT", str(tmp_path))
    rows = [{"variant": "eager", "time / eager": 1.0, "p20-p80": "1.00-1.00", "saved MB": 3270.0},
            {"variant": "compiled (inductor)", "time / eager": 0.977, "p20-p80": "0.98-0.98", "saved MB": 3270.0}]
    assert plot(rows).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
