"""scaletrain.mesh: the rank grid's arithmetic, its process groups under spawn, and the same under torchrun."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from scaletrain.launch import spawn
from scaletrain.mesh import ParallelDims

LAYOUTS = [(2, 1, 2), (1, 2, 2), (2, 2, 1), (4, 1, 1), (1, 1, 4)]  # the capstone's layouts of 4 ranks


def test_grid_is_tp_innermost_then_pp_then_dp():
    dims = ParallelDims(dp=2, pp=2, tp=2)
    assert dims.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    seed = ParallelDims(dp=2, pp=4, tp=4)  # the training-speedup lecture's 32 GPUs
    assert [len(seed.groups(a)) for a in ("dp", "pp", "tp")] == [16, 8, 8]
    for rank in range(seed.world_size):
        c = seed.coords(rank)
        assert seed.rank_of(dp=c.dp, pp=c.pp, tp=c.tp) == rank
        assert rank in seed.groups("tp")[rank // 4]  # a TP group is 4 consecutive ranks: one node


@pytest.mark.parametrize("dims", [ParallelDims(dp=d, pp=p, tp=t) for d, p, t in LAYOUTS + [(3, 1, 1), (1, 3, 2)]])
def test_every_rank_is_in_exactly_one_group_per_axis(dims):
    for axis in ("dp", "pp", "tp"):
        groups = dims.groups(axis)
        assert sorted(r for g in groups for r in g) == list(range(dims.world_size))
        assert all(len(g) == getattr(dims, axis) for g in groups)


def test_bad_degrees_and_world_sizes_name_the_problem():
    with pytest.raises(ValueError, match="tp must be a positive int"):
        ParallelDims(tp=0)
    with pytest.raises(ValueError, match="dp must be a positive int"):
        ParallelDims(dp=True)
    with pytest.raises(ValueError, match=r"2·1·2 = 4, but the world has 6 ranks"):
        ParallelDims(dp=2, tp=2).validate(6)
    with pytest.raises(ValueError, match="rank 4 is outside"):
        ParallelDims(tp=2, dp=2).coords(4)


def _rank_main(rank: int, world_size: int) -> dict:
    out = {}
    for d, p, t in LAYOUTS:
        dims = ParallelDims(dp=d, pp=p, tp=t)
        mesh = dims.build(timeout_s=60)
        got = {"coords": (mesh.dp_rank, mesh.pp_rank, mesh.tp_rank), "first": mesh.is_first_stage,
               "last": mesh.is_last_stage}
        for axis in ("dp", "pp", "tp"):
            group = getattr(mesh, f"{axis}_group")
            x = torch.tensor([float(rank)])
            dist.all_reduce(x, group=group)  # the group really connects these ranks
            got[axis] = (dist.get_process_group_ranks(group), int(x.item()))
        out[(d, p, t)] = got
        mesh.destroy()
    return out


@functools.lru_cache(maxsize=None)
def _built() -> list[dict]:
    return spawn(_rank_main, 4, timeout_s=120)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_build_makes_the_groups_of_the_grid(layout):
    dims = ParallelDims(dp=layout[0], pp=layout[1], tp=layout[2])
    for rank, per_rank in enumerate(_built()):
        got = per_rank[layout]
        c = dims.coords(rank)
        assert got["coords"] == (c.dp, c.pp, c.tp)
        assert got["first"] == (c.pp == 0) and got["last"] == (c.pp == dims.pp - 1)
        for axis in ("dp", "pp", "tp"):
            want = next(g for g in dims.groups(axis) if rank in g)
            assert got[axis] == (want, sum(want)), (rank, axis)


TORCHRUN_SCRIPT = Path(__file__).resolve()


def _torchrun_rank(rank: int, world_size: int) -> None:
    mesh = ParallelDims(dp=1, pp=1, tp=2).build(timeout_s=60)
    from scaletrain.models import GPTConfig
    from scaletrain.tp import verify
    verify.check_gpt(mesh.tp_group, cfg=GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=8),
                     seq=6, sequence_parallel=True)
    print(f"rank {rank}: mesh {mesh.tp_ranks} ok", flush=True)


def test_mesh_and_tp_work_under_torchrun(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this Python")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(torchrun), "--nproc-per-node=2", "--master-port=0", "--rdzv-backend=c10d",
                             "--rdzv-endpoint=localhost:0", str(TORCHRUN_SCRIPT)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks: nothing left behind
        proc.communicate()
        raise
    assert proc.returncode == 0, out[-3000:]
    assert "rank 0: mesh (0, 1) ok" in out and "rank 1: mesh (0, 1) ok" in out, out[-3000:]


if __name__ == "__main__":  # what torchrun runs: spawn joins its rendezvous and runs this rank only
    spawn(_torchrun_rank, int(os.environ["WORLD_SIZE"]), timeout_s=120)
