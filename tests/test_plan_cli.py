"""`python -m scaletrain.plan`: the table, the plot, and clear errors."""

import subprocess
import sys

import pytest

from scaletrain.plan.cli import main, parse_model


def test_cli_prints_the_best_layouts_and_writes_the_plot(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALETRAIN_BENCH_OUT", str(tmp_path))
    assert main(["--model", "175B", "--gpus", "1024", "--cluster", "a100-80gb", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "1024 × a100-80gb, batch 1536" in out and "TFLOP/s/GPU" in out
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit() and "t=" in line]
    assert len(rows) == 3 and all(int(r.split("t=")[1].split()[0]) <= 8 for r in rows)
    assert (tmp_path / "plan_175B_1024.png").stat().st_size > 10_000


def test_cli_errors(capsys):
    assert main(["--model", "175B", "--gpus", "7"]) == 2  # no layout of 7 GPUs divides batch 1536
    assert "no layout of 7 GPUs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", "l=2,h=64", "--gpus", "8", "--batch", "8"])  # no head count
    assert parse_model("l=4,h=256,a=8,s=128").seq == 128


@pytest.mark.slow
def test_python_dash_m_entry_point(tmp_path):
    run = subprocess.run([sys.executable, "-m", "scaletrain.plan", "--model", "1.7B", "--gpus", "32", "--top", "1"],
                         capture_output=True, text=True, timeout=120, env={"SCALETRAIN_BENCH_OUT": str(tmp_path),
                                                                            "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert "t=1 p=1 d=32" in run.stdout
