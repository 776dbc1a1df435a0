"""Workers forked from a process that has torch loaded, instead of started fresh.

A trusted group's worker (`python -S -m autograder.worker`, autograder/untrusted.py) spends about
2 s of CPU importing torch before it runs any student code, once per group. Inside `with
zygote.preloaded():` the grader also keeps this *worker zygote*: a `python -S` that imported only
torch, never runs anything, and forks workers on request. It must hold nothing a worker may not see, so it is not the runner's zygote
(that one holds the grader's suites and the reference library):

- its environment is PATH and PYTHONPATH only (no seed, nothing of the grader's);
- its `sys.path` is the repository (for `autograder.sandbox`, stdlib-only) and the third-party
  packages; each worker's is rebuilt as an exec'd worker's would be, and the `autograder` modules
  dropped, so `autograder.worker` comes from the group's grading build.

Channels: the grader asks for a *client* (`{"op": "client"}`) per trusted group and hands it to
the group's runner ($AUTOGRADER_WORKER_ZYGOTE, a descriptor number), so only runners can ask for
workers, never a worker. A runner's request carries the worker's pipes, its log, and a control
and a status pipe; for each the zygote forks a *keeper*, which does what `autograder.sandbox`'s
warden does (`sandbox.guard`: subreaper, kill and reap everything below it at the end) around one
worker, forked and confined exactly as `Untrusted.start` confines an exec'd one. The worker ends
when it exits, or when the runner closes the control pipe (closing the worker, or dying): its keeper
then kills its tree and writes `{"timed_out", "code"}` on the status pipe.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import traceback

from autograder import sandbox, zygote

PRELOAD = ("torch",)  # not torch._dynamo: it imports triton, whose interpreter mode is set per worker
MAX_REQUEST = 1 << 20   # bytes: a worker's environment, its sandbox and paths
REQUEST_FDS = 5         # to_r, from_w, log, control_r, status_w


def serve(grader: socket.socket) -> None:
    """Answer the grader (new clients) and the clients (new workers) until the grader hangs up."""
    sandbox._prctl(sandbox.PR_SET_PDEATHSIG, signal.SIGKILL)  # the grader is gone: so is the zygote
    sandbox._prctl(sandbox.PR_SET_DUMPABLE, 0)  # a worker of the same uid can't ptrace it or its keepers
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)              # keepers are reaped by the kernel
    for name in PRELOAD:
        __import__(name)
    base_path = zygote._base_path()
    clients: list[socket.socket] = []
    while True:
        for sock in select.select([grader, *clients], [], [])[0]:
            try:
                message, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, REQUEST_FDS)
            except ConnectionResetError:  # the peer closed with a message unread (Ctrl-C mid-request): it ended
                message, fds = b"", []
            if sock is grader:
                if not message:
                    return
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                clients.append(ours)
                try:
                    socket.send_fds(grader, [b"client"], [theirs.fileno()])
                except (BrokenPipeError, ConnectionResetError):  # the grader is gone: so are we
                    return
                theirs.close()
            elif not message or len(fds) != REQUEST_FDS:  # the runner ended (or sent nonsense)
                clients.remove(sock)
                sock.close()
                for fd in fds:
                    os.close(fd)
            else:
                sock.send(str(_start_keeper(json.loads(message), fds, base_path)).encode())


def _start_keeper(request: dict, fds: list[int], base_path: list[str]) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()  # a session of its own, as a warden's: the runner's last resort is killpg
            _keeper(request, *fds, base_path)
            code = 0
        except Exception:  # noqa: BLE001 - the keeper's stderr is the grader's
            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    return pid


def _keeper(request: dict, to_r: int, from_w: int, log: int, control_r: int, status_w: int, base_path) -> None:
    """In the keeper: the worker forked under `sandbox.guard`, its status written when it ends."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _close_all_but(to_r, from_w, log, control_r, status_w)  # the grader's socket and every client's
    box = sandbox.Sandbox(**request["box"])

    def start():
        pid = os.fork()
        if pid == 0:
            _worker(request, box, to_r, from_w, log, base_path)
        for fd in (to_r, from_w, log):
            os.close(fd)
        return _Worker(pid, control_r)

    status = sandbox.guard(box, start)
    with contextlib.suppress(BrokenPipeError):  # the runner is gone (it ended, or was killed): nobody to tell
        os.write(status_w, json.dumps(status).encode())


def _close_all_but(*keep: int) -> None:
    """Close every descriptor of this process but stdin, stdout, stderr and `keep`."""
    for fd in set(map(int, os.listdir("/proc/self/fd"))) - {0, 1, 2, *keep}:
        try:
            os.close(fd)
        except OSError:  # the listing's own descriptor, already closed
            pass


class _Worker:
    """The forked worker, waited on as a Popen by `sandbox.guard`: its exit code, or
    TimeoutExpired when the runner closed the control pipe (or the limit passed)."""

    def __init__(self, pid: int, control_r: int):
        self.pid, self._fd, self._control = pid, os.pidfd_open(pid), control_r

    def wait(self, timeout: float) -> int:
        ready = select.select([self._fd, self._control], [], [], timeout)[0]
        if self._fd not in ready:
            raise subprocess.TimeoutExpired(str(self.pid), timeout)
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


def _worker(request: dict, box: sandbox.Sandbox, to_r: int, from_w: int, log: int, base_path: list[str]) -> None:
    """In the worker: what `subprocess.Popen(..., start_new_session=True, user=..., preexec_fn=
    confine)` then `python -S -m autograder.worker TO_R FROM_W` would have done."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the keeper's handler is the keeper's
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        _close_all_but(to_r, from_w)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        confinement = request["confinement"]
        account = confinement["account"]
        sandbox.confine_worker(box, **dict(confinement, account=None if account is None else tuple(account)))
        sandbox._prctl(sandbox.PR_SET_DUMPABLE, 1)  # as an exec'd worker: its /proc files its own
        sys.path[:] = [os.getcwd(), *filter(None, request["env"].get("PYTHONPATH", "").split(os.pathsep)), *base_path]
        for name in [m for m in sys.modules if m == "autograder" or m.startswith("autograder.")]:
            del sys.modules[name]  # the build's autograder, not the repository's
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
        import runpy
        import tempfile

        tempfile.tempdir = None  # TMPDIR is the worker's now
        sys.argv = ["-m", str(to_r), str(from_w)]
        runpy.run_module("autograder.worker", run_name="__main__", alter_sys=True)  # exits by itself
    except BaseException:  # noqa: BLE001 - the log's last line names it, as an exec'd worker's would
        traceback.print_exc()
    os._exit(code)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
