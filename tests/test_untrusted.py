"""The untrusted worker of a trusted group: what student code can and cannot reach from there.

A toy submission asks, from inside the worker, for what an attacker wants: the reference on disk
and by import, the grading seed, the trusted process's memory and descriptors, capabilities. Each
attempt must fail, and data must cross the wire intact (tensors, tuples, dtypes)."""

import contextlib
import os
import signal
import sys
import time
import uuid

import pytest
import torch

from autograder import wire, zygote
from autograder.checks import Flagged
from autograder.manifest import REPO
from autograder.student import grading_build
from autograder.untrusted import BUILD_ENV, WORKER_CACHES, StudentCrash, Untrusted, _Exec, _Kept
from procs import processes_with  # tests/ is on sys.path

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

def writable(folder):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "probe"), "w") as f:
        return f.write("ok")

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

def where():
    import autograder, resource
    return {"cwd": os.getcwd(), "path": sys.path, "autograder": autograder.__file__, "argv": sys.argv,
            "limits": [resource.getrlimit(r) for r in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NOFILE)],
            "env": sorted(os.environ), "session": os.getsid(0) == os.getpid(),
            "parent": [os.getppid(), open(f"/proc/{os.getppid()}/cmdline").read()],
            "fds": len(os.listdir("/proc/self/fd"))}

def kill_parent():
    try:
        os.kill(os.getppid(), 9)
        return "killed"
    except OSError as exc:
        return type(exc).__name__

def detach(marker):
    if os.fork() == 0:  # double fork, new session: out of the worker's process group
        os.setsid()
        if os.fork() == 0:
            os.execvpe("sleep", ["sleep", "300"], dict(os.environ, TOY_MARKER=marker))
        os._exit(0)
    os.wait()
    return os.getpid()
'''


@pytest.fixture(scope="module")
def submission(tmp_path_factory):
    root = tmp_path_factory.mktemp("untrusted")
    submission = root / "submission"
    submission.mkdir()
    (submission / "toy_target.py").write_text(TOY)
    for path in (root, submission, submission / "toy_target.py"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    os.environ[BUILD_ENV] = str(grading_build("a0", root / "build"))
    yield submission
    os.environ.pop(BUILD_ENV)


@contextlib.contextmanager
def workers_zygote():
    """What a runner forked by the zygote has: a client of the workers' zygote in its environment."""
    with zygote.preloaded():
        os.environ[zygote.WORKER_CLIENT_ENV] = str(zygote._active._worker_client())
        try:
            yield
        finally:
            if _Kept._client is not None:
                _Kept._client.close()
            _Kept._client = None
            os.environ.pop(zygote.WORKER_CLIENT_ENV, None)


def toy(w: Untrusted):
    return lambda fn, *args, **kw: w.call("autograder.probes.common:call", "toy_target", fn, *args, **kw)


@pytest.fixture(scope="module", params=["exec", "forked"])
def worker(request, submission):
    """The worker both ways: exec'd (`python -S -m autograder.worker`) and forked by the workers' zygote."""
    with contextlib.ExitStack() as stack:
        if request.param == "forked":
            stack.enter_context(workers_zygote())
        w = Untrusted(submission, timeout_s=30)
        stack.callback(w.close)
        yield toy(w)


def test_data_crosses_intact(worker):
    x = torch.arange(12, dtype=torch.bfloat16).view(3, 4).t()
    args, kwargs = worker("echo", x, (1, 2.5, "s"), torch.float16, b"\x00\x01", k={"n": None})
    assert torch.equal(args[0], x) and args[0].dtype == torch.bfloat16
    assert args[1:] == ((1, 2.5, "s"), torch.float16, b"\x00\x01") and kwargs == {"k": {"n": None}}


def test_reference_not_importable_nor_readable(worker):
    # the graded module of the build runs the submission's memory.py, which this toy lacks
    with pytest.raises(StudentCrash, match="runs your assignments/a0_memory/memory.py"):
        worker("reference_file")
    if os.geteuid() != 0:
        pytest.skip("a grader that is not root can't hide the repository: its files' permissions guard it")
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


@pytest.fixture
def no_client(monkeypatch):
    """Outside `worker`'s forked workers (a module fixture that may still be set up)."""
    monkeypatch.setattr(_Kept, "_client", None)
    monkeypatch.delenv(zygote.WORKER_CLIENT_ENV, raising=False)


def test_a_forked_worker_is_confined_as_an_exec_d_one(submission, no_client):
    """Same sys.path (the build's `autograder`, not the repository's), limits, environment names,
    argv, session and descriptors; its parent is a keeper, not the runner."""
    exec_d = Untrusted(submission, timeout_s=30)
    exec_d.start()
    with workers_zygote():
        forked = Untrusted(submission, timeout_s=30)
        seen = [toy(w)("where") for w in (exec_d, forked)]
        assert isinstance(exec_d._proc, _Exec) and isinstance(forked._proc, _Kept)
        for w in (exec_d, forked):
            w.close()
    for where in seen:
        where["path"] = [p.replace(where["cwd"], "CWD") for p in where["path"]]
        assert where["autograder"].startswith(os.environ[BUILD_ENV])
    assert seen[0]["path"] == seen[1]["path"] and seen[0]["path"][:2] == [str(submission), "CWD"]
    for key in ("limits", "env", "session", "fds"):  # the numbers of the descriptors differ
        assert seen[0][key] == seen[1][key], key
    assert [len(w["argv"]) for w in seen] == [3, 3] and all(w["argv"][0].endswith("worker.py") for w in seen)
    assert seen[0]["parent"][0] == os.getpid() and "autograder.worker_zygote" in seen[1]["parent"][1]


def test_a_forked_worker_s_tree_ends_with_it_and_with_its_runner(submission, no_client):
    """The worker is not below the group's warden, so its keeper is the one that kills a
    detached grandchild: when the worker is closed, and when the runner dies without closing it
    (the control pipe's end)."""
    marker = f"toy-{uuid.uuid4().hex}"
    with workers_zygote():
        for ending in ("close", "runner dies"):
            w = Untrusted(submission, timeout_s=30)
            pid = toy(w)("detach", marker)
            _wait_until(lambda: len(processes_with(marker)) == 1)  # the sleeper execs a moment later
            if ending == "close":
                w.close()
            else:
                os.close(w._proc._control_w)  # what the runner's death does to the pipe
            _wait_until(lambda: not processes_with(marker) and not os.path.exists(f"/proc/{pid}"), ending)
            if ending != "close":
                w._proc._control_w = os.open(os.devnull, os.O_WRONLY)  # for close() to close
                w.close()


def _wait_until(condition, what: str = "", limit_s: float = 15.0) -> None:
    end = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < end, what
        time.sleep(0.1)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root grader runs the worker as another account")
def test_a_worker_can_not_kill_its_keeper_and_dies_with_it(submission, no_client):
    """The worker is another uid than its keeper: its SIGKILL is refused and it goes on answering.
    When the keeper dies anyway (killed by root here), the worker dies with it (PDEATHSIG)."""
    with workers_zygote():
        w = Untrusted(submission, timeout_s=30)
        try:
            assert toy(w)("kill_parent") == "PermissionError"
            pid = toy(w)("detach", f"toy-{uuid.uuid4().hex}")
            assert toy(w)("echo", 1) == [(1,), {}]  # still answering
            os.kill(w._proc._keeper, signal.SIGKILL)
            _wait_until(lambda: not os.path.exists(f"/proc/{pid}") or _state(pid) == "Z", "worker outlived its keeper")
        finally:
            w.close()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.parametrize("how", ["exec", "forked"])
def test_the_worker_s_caches_are_its_own_whatever_the_grader_exports(submission, no_client, monkeypatch,
                                                                     tmp_path, how):
    """Issue 29: a root grader with TORCH_EXTENSIONS_DIR exported (a folder only root may write)
    handed it to its worker, and every CUDA build failed with PermissionError.  Each cache variable
    exported here so is, in the worker, a writable folder inside its own work folder."""
    closed = tmp_path / "root-only"
    closed.mkdir(mode=0o500)
    exported = [name for name in WORKER_CACHES if name not in ("HOME", "TMPDIR", "TMP", "TEMP")]
    for name in exported:
        monkeypatch.setenv(name, str(closed / name))
    with workers_zygote() if how == "forked" else contextlib.nullcontext():
        w = Untrusted(submission, timeout_s=30)
        try:
            work = toy(w)("where")["cwd"]
            seen = {name: toy(w)("environment", name) for name in WORKER_CACHES}
            assert toy(w)("writable", seen["TORCH_EXTENSIONS_DIR"]) == 2
        finally:
            w.close()
    assert {name: value for name, value in seen.items() if not (value + "/").startswith(work + "/")} == {}
