"""torchrun is a first-class way to start ranks (issue 18, item 1): `spawn` under torchrun returns
every rank's result on every rank, every distributed benchmark runs its `--quick` form under
`torchrun --standalone --nproc-per-node 2` with one table printed (rank 0) and its plots written,
and a world size that does not fit the benchmark is a clear error."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.bench_cli import distributed

pytestmark = pytest.mark.slow
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

GATHER = """
import sys

import torch
from scaletrain.launch import is_primary, spawn

def rank_result(rank, world_size):
    return {"rank": rank, "t": torch.full((3,), float(rank))}

results = spawn(rank_result, 2)
assert [r["rank"] for r in results] == [0, 1], results
assert all(torch.equal(r["t"], torch.full((3,), float(i))) for i, r in enumerate(results))
sys.stdout.write(f"{'primary' if is_primary() else 'secondary'} saw {len(results)} results\\n")
sys.stdout.flush()  # one write per rank: the two ranks share the pipe
"""


def _torchrun(args, tmp_path, timeout_s=600):
    env = dict(os.environ, SCALETRAIN_BENCH_OUT=str(tmp_path / "out"), OMP_NUM_THREADS="1")
    return subprocess.run(TORCHRUN + args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout_s)


def test_spawn_under_torchrun_gathers_every_rank_result(tmp_path):
    script = tmp_path / "gather.py"
    script.write_text(GATHER)
    run = _torchrun([str(script)], tmp_path, timeout_s=180)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stdout.count("saw 2 results") == 2 and "primary saw" in run.stdout and "secondary saw" in run.stdout


def test_every_distributed_benchmark_runs_quick_under_torchrun(tmp_path):
    run = _torchrun(["-m", "scaletrain.bench", "all", "--quick"], tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    names = distributed()
    for name in names:
        assert run.stdout.count(f"=== {name} ===") == 1, f"{name}: printed by exactly one rank"
    assert "=== kernels ===" not in run.stdout, "single-process benchmarks are left out under torchrun"
    plots = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    assert {"allreduce_busbw.png", "zero.png", "pipeline_timelines_p2.png"} <= set(plots), plots


def test_a_world_size_that_does_not_fit_is_a_clear_error(tmp_path):
    run = _torchrun(["-m", "scaletrain.bench", "allreduce", "--quick", "--world-sizes", "4"], tmp_path, timeout_s=180)
    assert run.returncode != 0
    assert "torchrun started 2 processes but --world-sizes is 4" in run.stderr
