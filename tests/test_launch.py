"""scaletrain.launch.spawn: results per rank, failures named by rank, deadlocks end, no orphans."""

import os
import pickle
import queue
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from scaletrain import launch
from scaletrain.launch import RankError, SpawnTimeout, spawn


def _sum_of_ranks(rank, world_size, offset):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return rank + offset, t.item(), torch.get_num_threads()


def _fails_on_rank_1(rank, world_size):
    if rank == 1:
        raise NotImplementedError("task 2.1: implement ring_reduce_scatter")
    dist.barrier()


def _deadlock(rank, world_size):
    t = torch.zeros(1)
    dist.recv(t, src=1 - rank)  # both ranks receive first: nobody sends


def _exits(rank, world_size):
    if rank == 0:
        os._exit(3)
    time.sleep(60)
    return os.getpid()


def _many_tensors(rank, world_size, count, numel):
    return {f"t{i}": torch.full((numel,), float(rank * 1000 + i)) for i in range(count)}


def test_many_large_tensors_come_back_by_value_every_time():
    """Returned tensors cross by value: before, a dict of tensors failed 2 runs in 3 (the rank
    exited before the parent read the storages it shared by file descriptor)."""
    for _ in range(3):
        out = spawn(_many_tensors, 4, 64, 1 << 16)
        for rank, tensors in enumerate(out):
            assert len(tensors) == 64
            assert all(torch.equal(t, torch.full((1 << 16,), float(rank * 1000 + i)))
                       for i, t in enumerate(tensors.values()))


def test_results_in_rank_order_for_three_ranks():
    assert spawn(_sum_of_ranks, 3, 10) == [(10, 3.0, 1), (11, 3.0, 1), (12, 3.0, 1)]


def test_world_size_one_has_a_process_group():
    assert spawn(_sum_of_ranks, 1, 0) == [(0, 0.0, 1)]


def test_failure_names_rank_and_exception_type():
    with pytest.raises(RankError) as info:
        spawn(_fails_on_rank_1, 2, timeout_s=10)
    assert info.value.rank == 1 and info.value.exc_type == "NotImplementedError"
    assert "ring_reduce_scatter" in str(info.value) and "_fails_on_rank_1" in info.value.remote_traceback


def test_deadlock_ends_as_timeout_within_the_limit():
    start = time.monotonic()
    with pytest.raises(SpawnTimeout, match="deadlock"):
        spawn(_deadlock, 2, timeout_s=3)
    assert time.monotonic() - start < 25


def test_os_exit_is_reported_and_the_other_rank_is_killed():
    start = time.monotonic()
    with pytest.raises(RankError, match="exited with code 3"):
        spawn(_exits, 2, timeout_s=30)
    assert time.monotonic() - start < 25  # rank 1 sleeps 60 s: it was killed, not waited for


class _ExitedRank:
    exitcode = 0


class _LateQueue:
    """A results queue whose messages arrive only after the ranks have exited: the caller's first
    poll ends empty just before each rank's last write."""

    def __init__(self, messages):
        self.messages = [None] + list(messages)

    def get(self, timeout):
        message = self.messages.pop(0)
        if message is None:
            raise queue.Empty
        return message


def test_a_result_written_just_before_the_rank_exits_is_still_read():
    messages = [("ready", 0, None), ("ready", 1, None), ("ok", 0, pickle.dumps("a")), ("ok", 1, pickle.dumps("b"))]
    assert launch._collect([_ExitedRank(), _ExitedRank()], _LateQueue(messages), 2, timeout_s=5) == ["a", "b"]
    with pytest.raises(RankError, match="rank 1.*exited with code 0"):
        launch._collect([_ExitedRank(), _ExitedRank()], _LateQueue(messages[:3] + [None]), 2, timeout_s=5)


def test_bad_arguments_are_refused_before_spawning():
    with pytest.raises(ValueError, match="world_size"):
        spawn(_sum_of_ranks, 0, 0)
    with pytest.raises(TypeError, match="picklable"):
        spawn(lambda rank, world_size: rank, 2)


def _sleep_forever(rank, world_size, pid_file):
    import time
    with open(f"{pid_file}.{rank}", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(300)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_ranks_die_with_the_process_that_started_them(tmp_path):
    """A launcher killed outright (SIGKILL: no clean-up runs) takes its ranks with it."""
    pid_file = tmp_path / "rank"
    launcher = subprocess.Popen([sys.executable, "-c",
                                 "import sys; from scaletrain.launch import spawn; "
                                 "from test_launch import _sleep_forever; "
                                 f"spawn(_sleep_forever, 2, {str(pid_file)!r}, timeout_s=120)"],
                                cwd=Path(__file__).parent, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"rank.{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and launcher.poll() is None, "ranks never started"
            time.sleep(0.1)
        pids = [int((tmp_path / f"rank.{r}").read_text()) for r in range(2)]
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in pids):
            assert time.monotonic() < deadline, f"ranks {pids} outlived their launcher"
            time.sleep(0.1)
    finally:
        launcher.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
