"""Trusted group runners forked from a process that has torch loaded, instead of started fresh.

A group's runner (`python -m autograder.runner`) spends about 2 s of CPU importing torch before
the suite does any work, and the selftest runs some two hundred groups. Inside `with
preloaded():` the grader keeps one *zygote*: a process that imported torch and the runner once,
never runs anything, and for each trusted group forks a warden (`sandbox.guard`, exactly the
limits, time limit and clean-up of `python -m autograder.sandbox`), which forks the runner. The
fork server of multiprocessing works the same way.

Only trusted groups come from here: their runner is the grader's own code, and the student's code
runs in the worker, which is still started fresh (`autograder/untrusted.py`). A group whose runner
imports the submission runs as the sandbox account and keeps `sandbox.run`.

The zygote ends with the `with` block (or with the grader: PR_SET_PDEATHSIG), and its wardens with
it; nothing outlives the block.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from autograder import sandbox

# torch._dynamo: torch.optim's first `step` imports it (1.5 s of CPU), and the trusted references of
# a5, a7 and a8 step optimizers (a5's selftest: 142 -> 126 CPU-s, a7's: 127 -> 105). Importing it sets
# TORCHINDUCTOR_CACHE_DIR here only: a warden starts from the request's environment.
PRELOAD = ("torch", "torch._dynamo", "autograder.runner")
MAX_REQUEST = 1 << 20     # bytes: a request is the runner's argv, its environment and its sandbox
WORKER_CLIENT_ENV = "AUTOGRADER_WORKER_ZYGOTE"  # a runner's client of the workers' zygote: its descriptor
WORKER_ZYGOTE_KEEPS = ("PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS")  # read when torch loads: as a worker's

_active: Zygote | None = None


class ZygoteGone(Exception):
    """The zygote no longer answers; groups go back to `sandbox.run`."""


class Zygote:
    """The grader's handle: `run` has the signature and the results of `sandbox.run`."""

    def __init__(self):
        self._sock, self._proc = _start([sys.executable, "-m", "autograder.zygote"], env=None)
        # the workers' zygote sees none of the grader's environment and only the third-party
        # packages and the (stdlib-only) autograder.sandbox: autograder/worker_zygote.py
        paths = [str(Path(__file__).resolve().parent.parent), *sandbox.package_paths()]
        env = {k: v for k, v in os.environ.items() if k in WORKER_ZYGOTE_KEEPS}
        self._workers, self._workers_proc = _start([sys.executable, "-S", "-m", "autograder.worker_zygote"],
                                                   env=dict(env, PYTHONPATH=os.pathsep.join(paths)))
        self._lock = threading.Lock()  # one request and its answer at a time (the selftest's threads)

    def _worker_client(self) -> int | None:
        """A new client of the workers' zygote for one runner (None: that zygote is gone)."""
        try:
            self._workers.send(b"client")
            return socket.recv_fds(self._workers, 16, 1)[1][0]
        except (OSError, IndexError):
            return None

    def run(self, cmd: list[str], box: sandbox.Sandbox, *, env: dict[str, str], log: Path) -> tuple[bool, int | None]:
        """`cmd` is `python -m autograder.runner ARGS...`; (timed out, exit code) as `sandbox.run`."""
        status_r, status_w = os.pipe()
        try:
            with open(log, "wb") as out, self._lock:
                request = json.dumps({"box": asdict(box), "argv": cmd[3:], "env": env}).encode()
                client = self._worker_client()
                try:
                    socket.send_fds(self._sock, [request], [out.fileno(), status_w, *([client] if client else [])])
                    warden = int(self._sock.recv(64))
                except (OSError, ValueError):  # the zygote died (killed, out of memory)
                    raise ZygoteGone from None
                finally:
                    if client is not None:
                        os.close(client)
            os.close(status_w)
            status_w = None
            return _wait(warden, status_r, box.timeout_s + sandbox.WARDEN_GRACE_S)
        finally:
            os.close(status_r)
            if status_w is not None:
                os.close(status_w)

    def close(self) -> None:
        for sock, proc in ((self._sock, self._proc), (self._workers, self._workers_proc)):
            sock.close()  # the zygote reads the end of its requests and exits
            try:
                proc.wait(timeout=sandbox.KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _start(cmd: list[str], env: dict[str, str] | None) -> tuple[socket.socket, subprocess.Popen]:
    """A zygote `cmd FD` in a session of its own and its end of the request socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([*cmd, str(theirs.fileno())], pass_fds=(theirs.fileno(),), env=env, cwd="/",
                            stdin=subprocess.DEVNULL, start_new_session=True)
    theirs.close()
    return ours, proc


@contextlib.contextmanager
def preloaded():
    """Trusted groups graded inside the block fork from one zygote."""
    global _active
    if _active is not None:  # nested: the outer block's zygote serves
        yield
        return
    _active = Zygote()
    try:
        yield
    finally:
        zygote, _active = _active, None
        zygote.close()


def run(cmd: list[str], box: sandbox.Sandbox, *, env: dict[str, str], log: Path, trusted: bool) -> tuple[bool, int | None]:
    """A group's runner through the active zygote when it is trusted, else `sandbox.run`."""
    zygote = _active
    if zygote is not None and trusted and box.uid is None and cmd[1:3] == ["-m", "autograder.runner"]:
        try:
            return zygote.run(cmd, box, env=env, log=log)
        except ZygoteGone:
            pass
    return sandbox.run(cmd, box, env=env, log=log)


def _wait(warden: int, status_r: int, limit_s: float) -> tuple[bool, int | None]:
    """The warden's status line, read until it exits (the pipe's end). Past `limit_s` (the warden
    hangs) or on an interrupt of the grader, it is told to clean up, then its session is killed,
    as `sandbox._stop` does."""
    data, ended = b"", False
    try:
        data, ended = read_to_end(status_r, limit_s)
    finally:
        if not ended:
            _stop(warden, status_r)
    if not ended:
        return True, None
    try:
        report = json.loads(data)
        return bool(report["timed_out"]), report["code"]
    except (ValueError, TypeError, KeyError):
        return False, -signal.SIGKILL  # the warden died before reporting


def read_to_end(fd: int, limit_s: float) -> tuple[bytes, bool]:
    """What a pipe gives within `limit_s`, and whether it reached its end (the writer exited)."""
    data, ended, end = b"", False, time.monotonic() + limit_s
    while not ended and (left := end - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            data, ended = data + chunk, not chunk
    return data, ended


def _stop(warden: int, status_r: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(warden, signal.SIGTERM)
        select.select([status_r], [], [], sandbox.KILL_WAIT_S)  # its clean-up done: the pipe closes
        os.killpg(warden, signal.SIGKILL)


# ---------------------------------------------------------------- zygote side

def serve(sock: socket.socket) -> None:
    """Fork a warden per request until the grader closes its end."""
    sandbox._prctl(sandbox.PR_SET_PDEATHSIG, signal.SIGKILL)  # the grader is gone: so is the zygote
    sandbox._prctl(sandbox.PR_SET_DUMPABLE, 0)  # a worker of the same uid can't ptrace it
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)              # wardens are reaped by the kernel
    for name in PRELOAD:
        __import__(name)
    base_path = _base_path()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 3)  # log, status[, a workers' client]
        except ConnectionResetError:  # the grader closed with a request unread (Ctrl-C while it sent one)
            return
        if not message:
            return
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            sock.close()
            _warden(request, *fds, base_path)
        for fd in fds:
            os.close(fd)
        sock.send(str(pid).encode())


def _base_path() -> list[str]:
    """sys.path without what `python -m` and $PYTHONPATH put in front: each runner gets its own."""
    own = set(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    return [p for p in sys.path[1:] if p not in own]


def _warden(request: dict, log_fd: int, status_w: int, *client_and_base_path) -> None:
    """In the forked warden: what `python -m autograder.sandbox` does, the runner forked, not exec'd."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        box = sandbox.Sandbox(**request["box"])
        *client, base_path = client_and_base_path
        status = sandbox.guard(box, lambda: _fork_runner(box, request["argv"], log_fd, status_w, client, base_path))
        os.write(status_w, json.dumps(status).encode())
        code = 0
    finally:
        os._exit(code)


def _fork_runner(box: sandbox.Sandbox, argv: list[str], log_fd: int, status_w: int, client: list[int],
                 base_path: list[str]):
    """The runner; `client`: [a client of the workers' zygote] or [], kept as its descriptor 3."""
    # SIGTERM waits across the fork: the child runs Python's at-fork hooks before it can reset the
    # warden's handler, and a SystemExit raised in a hook is printed to the grader's stderr, ignored
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the warden's handler is the warden's
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        code = 1
        try:
            os.close(status_w)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            for fd in client:
                os.dup2(fd, 3)
                os.environ[WORKER_CLIENT_ENV] = "3"
            os.closerange(3 + len(client), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            os.chdir(box.workdir)
            os.environ.update(sandbox.child_env(box))
            sys.path[:] = [box.workdir, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)), *base_path]
            sys.stdout.reconfigure(line_buffering=True)
            tempfile.tempdir = None                        # TMPDIR is the group's now
            sandbox.confine(box)
            # as `python -m autograder.runner ARGV` (it exits by itself); by name, not an import:
            # the runner imports this module
            sys.argv = ["-m", *argv]
            runpy.run_module("autograder.runner", run_name="__main__", alter_sys=True)
        except BaseException:  # noqa: BLE001 - the log's last line names it, as an exec'd runner's would
            traceback.print_exc()
        sandbox.exit_now(code)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    for fd in client:
        os.close(fd)
    return _Forked(pid)


class _Forked:
    """The forked runner, waited on as a Popen: its exit code (-N for signal N), or TimeoutExpired."""

    def __init__(self, pid: int):
        self.pid, self._fd = pid, os.pidfd_open(pid)

    def wait(self, timeout: float) -> int:
        if not select.select([self._fd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(str(self.pid), timeout)
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
