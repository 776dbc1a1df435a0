"""The untrusted worker of a trusted group: what student code can and cannot reach from there.

A toy submission asks, from inside the worker, for what an attacker wants: the reference on disk
and by import, the grading seed, the trusted process's memory and descriptors, capabilities. Each
attempt must fail, and data must cross the wire intact (tensors, tuples, dtypes)."""

import os
import sys

import pytest
import torch

from autograder import wire
from autograder.checks import Flagged
from autograder.manifest import REPO
from autograder.student import grading_build
from autograder.untrusted import BUILD_ENV, StudentCrash, Untrusted, worker_runs_as_root

TOY = '''
import os, sys, time

def echo(*args, **kwargs):
    return [args, kwargs]

def read(path):
    with open(path) as f:
        return f.read()

def reference_file():
    import scaletrain.memory
    return scaletrain.memory.__file__

def environment(name):
    return os.environ.get(name)

def effective_capabilities():
    return [l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1]

def parent_memory():
    with open(f"/proc/{os.getppid()}/mem", "rb") as f:
        return len(f.read(1))

def loop():
    while True:
        pass

def die():
    os._exit(7)

def unimplemented():
    raise NotImplementedError("toy task 1")

def flag():
    from autograder.checks import Flagged
    raise Flagged("called forbidden `x`")

def huge():
    raise ValueError("x" * 10_000_000)

def _rank_parent(rank, world_size):
    import torch, torch.distributed as dist
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return os.getppid(), t.item()

def ranks_parents():
    from scaletrain.launch import spawn
    return os.getpid(), spawn(_rank_parent, 2)
'''


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    root = tmp_path_factory.mktemp("untrusted")
    submission = root / "submission"
    submission.mkdir()
    (submission / "toy_target.py").write_text(TOY)
    for path in (root, submission, submission / "toy_target.py"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    os.environ[BUILD_ENV] = str(grading_build("a0", root / "build"))
    w = Untrusted(submission, timeout_s=30)
    yield lambda fn, *args, **kw: w.call("autograder.probes.common:call", "toy_target", fn, *args, **kw)
    w.close()
    os.environ.pop(BUILD_ENV)


def test_data_crosses_intact(worker):
    x = torch.arange(12, dtype=torch.bfloat16).view(3, 4).t()
    args, kwargs = worker("echo", x, (1, 2.5, "s"), torch.float16, b"\x00\x01", k={"n": None})
    assert torch.equal(args[0], x) and args[0].dtype == torch.bfloat16
    assert args[1:] == ((1, 2.5, "s"), torch.float16, b"\x00\x01") and kwargs == {"k": {"n": None}}


def test_reference_not_importable_nor_readable(worker):
    # the graded module of the build runs the submission's memory.py, which this toy lacks
    with pytest.raises(StudentCrash, match="runs your assignments/a0_memory/memory.py"):
        worker("reference_file")
    if not worker_runs_as_root():
        pytest.skip("the worker runs as the sandbox account: file permissions, not mounts, guard the disk")
    with pytest.raises(StudentCrash, match="FileNotFoundError|PermissionError"):
        worker("read", str(REPO / "lib/scaletrain/memory.py"))
    with pytest.raises(StudentCrash, match="FileNotFoundError|PermissionError"):
        worker("read", str(REPO / "solutions/a0_memory/memory.py"))


def test_no_seed_no_capabilities_no_parent_memory(worker, monkeypatch):
    assert worker("environment", "AUTOGRADER_SEED") is None
    assert int(worker("effective_capabilities"), 16) == 0
    with pytest.raises(StudentCrash, match="PermissionError"):
        worker("parent_memory")


def test_failures_come_back_as_outcomes(worker):
    with pytest.raises(NotImplementedError, match="toy task 1 \\(at toy_target.py:"):
        worker("unimplemented")
    with pytest.raises(Flagged):
        worker("flag")
    with pytest.raises(StudentCrash) as info:
        worker("huge")
    assert len(str(info.value)) < 3 * wire.REASON_CHARS
    with pytest.raises(TimeoutError):
        worker("loop", timeout_s=2)
    with pytest.raises(StudentCrash, match="exited with code 7"):
        worker("die")
    assert worker("echo", 1) == [(1,), {}]  # a fresh worker after each death


def test_wire_refuses_what_it_does_not_carry():
    with pytest.raises(wire.WireError):
        wire.encode(object())
    with pytest.raises(wire.WireError):
        wire.decode({"__reduce__": "os.system"})
    with pytest.raises(wire.WireError):
        wire.decode({"__tensor__": "float32", "shape": [3], "data": ""})
    with pytest.raises(wire.WireError):
        wire.decode({"__dtype__": "Tensor"})
    assert sys.getrecursionlimit()  # decode of deep nesting is bounded by Python itself


def test_ranks_fork_from_the_worker_on_cpu(worker):
    """On CPU the worker's ranks fork from it (torch already loaded) instead of from a fork server
    that imports torch again for every group: their parent is the worker, and gloo works."""
    pid, ranks = worker("ranks_parents")
    assert [list(r) for r in ranks] == [[pid, 3.0], [pid, 3.0]]


def test_the_worker_names_launch_s_start_method_variable():
    from autograder.untrusted import RANKS_FORK_ENV
    from scaletrain.launch import START_METHOD_ENV
    assert RANKS_FORK_ENV == START_METHOD_ENV
