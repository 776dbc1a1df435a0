"""`make gpu-bench` (scaletrain/bench_gpu.py): every GPU benchmark in one command, within a budget.
Its GPU path runs only where a GPU is; here: the budget rule, the steps name real benchmarks with
options their parsers take, and on a CPU it runs nothing and says so."""

import os
import subprocess
import sys

import pytest
import torch

from scaletrain import bench_cli, bench_gpu
from autograder.manifest import REPO


def test_the_budget_caps_each_step_and_stops_starting_them_near_the_end():
    assert bench_gpu.plan(None, 1e6, 300) == 300, "no budget: the step's own cap"
    assert bench_gpu.plan(600, 100, 300) == 300
    assert bench_gpu.plan(600, 450, 300) == 150, "the budget left caps the step"
    assert bench_gpu.plan(600, 600 - bench_gpu.MIN_START_S, 300) == bench_gpu.MIN_START_S
    assert bench_gpu.plan(600, 600 - bench_gpu.MIN_START_S + 1, 300) is None, "too little left: not started"


def test_every_step_is_a_benchmark_whose_options_exist():
    """Each step's options appear in its benchmark's --help (a renamed option would fail on the GPU only)."""
    found, usages = bench_cli.benchmarks(), {}
    assert len({name for name, _, _ in bench_gpu.STEPS}) == len(bench_gpu.STEPS)
    for name, args, cap in bench_gpu.STEPS:
        command = args[:3] if args[:2] == bench_gpu.BENCH else args[:2]
        assert args[:2] != bench_gpu.BENCH or args[2] in found, name
        assert cap > bench_gpu.MIN_START_S, name
        if command not in usages:  # several steps run one benchmark with other options: one --help each
            usages[command] = subprocess.run([sys.executable, *command, "--help"], capture_output=True, text=True,
                                             timeout=120, cwd=REPO,
                                             env={**os.environ, "PYTHONPATH": f"{REPO / 'lib'}:{REPO}"}).stdout
        usage = usages[command]
        assert "usage" in usage, command
        for option in (a for a in args[len(command):] if a.startswith("--")):
            assert option in usage, f"{name}: {option} is not an option of {' '.join(command)}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: this machine has a GPU")
def test_on_a_cpu_it_runs_nothing_and_exits_0(tmp_path, capsys):
    assert bench_gpu.main(["--out", str(tmp_path / "out")]) == 0
    assert "sees no CUDA GPU" in capsys.readouterr().out and not (tmp_path / "out").exists()


def test_make_gpu_bench_passes_the_budget():
    dry = subprocess.run(["make", "--no-print-directory", "-n", "gpu-bench", "BUDGET_S=300"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip().endswith("-m scaletrain.bench_gpu --budget-s 300")


def test_a_step_past_its_cap_is_killed_and_the_budget_skips_the_rest(tmp_path, monkeypatch, capsys):
    """The GPU path with the device faked and two steps: the first sleeps past its 6 s cap (killed,
    exit 124), after which 35 - 6 s is under MIN_START_S and the second is listed as not run."""
    monkeypatch.setattr(bench_gpu.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench_gpu.torch.cuda, "get_device_name", lambda: "a fake GPU")
    monkeypatch.setattr(bench_gpu, "STEPS", (("slow", ("-c", "import time; time.sleep(30)"), 6),
                                             ("next", ("-c", "open('{out}/ran', 'w')"), 60)))
    assert bench_gpu.main(["--budget-s", "35", "--out", str(tmp_path)]) == 1
    summary = (tmp_path / "summary.md").read_text()
    assert "a fake GPU" in summary and "124" in summary and "not run (budget)" in summary
    assert not (tmp_path / "ran").exists() and (tmp_path / "slow.log").exists()
