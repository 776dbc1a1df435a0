"""The trusted side's handle on the process that runs student code (`autograder.worker`).

A group whose `Group.trusted` is set runs the suite in a process that never imports the
submission: `ctx.untrusted().call("autograder.probes.aN:fn", *inputs)` sends the inputs, the
worker runs the student's code and sends outputs back as data (`autograder.wire`), and the suite
computes the expected values and the verdict itself. What keeps the worker out of the trusted
process:

- it is a separate process started without the trusted side's file descriptors (the report
  channel among them), in a session and a work folder of its own, with the group's resource
  limits (`sandbox.confine`);
- as root, it runs in a mount namespace of its own (the repository hidden, the interpreter's
  folders reachable) as the sandbox account (`nobody`), which can neither signal the grader nor
  write its files; only under --unsafe-no-sandbox does it stay root, with every capability
  dropped and no_new_privs set (sandbox.jail, sandbox.confine_worker);
- its Python starts with -S and a `sys.path` of the *grading build* (the library with the graded
  regions running the submission) and the third-party packages: the reference is not importable;
- its environment has no grading seed: inputs arrive as data, expected values never exist there.

Inside `zygote.preloaded()` a CPU worker is forked from the workers' zygote instead of exec'd
(autograder/worker_zygote.py): the same confinement, 2 s of CPU less per group.

A call that does not answer within its limit kills the worker (TimeoutError: the check is a
`timeout`); a worker that dies (os._exit, a crash) makes the call raise `StudentCrash` (`error`).
The next call starts a fresh worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from autograder import sandbox, wire, zygote
from autograder.checks import SEED_ENV, SUBMISSION_ENV, Flagged, StudentCrash
from autograder.manifest import REPO

EXIT_GRACE_S = 2.0                 # a closed worker's time to exit by itself
WORKER_TMP = "/tmp"                 # where workers get their folders (reachable by any account)
BUILD_ENV = "AUTOGRADER_BUILD"     # the grading build of the library, made by grade.py for the group
RANKS_FORK_ENV = "SCALETRAIN_START_METHOD"  # scaletrain.launch.START_METHOD_ENV (not imported: it loads torch)
# Where torch, Triton, the CUDA driver's JIT and the course keep caches: for the worker, always a
# folder of its own work folder, never the grader's value.  A root grader's TORCH_EXTENSIONS_DIR,
# inherited, made every CUDA build of a1 fail with PermissionError on an H200.
WORKER_CACHES = {"TORCH_EXTENSIONS_DIR": ".cache/torch_extensions", "TRITON_CACHE_DIR": ".triton/cache",
                 "TRITON_HOME": ".", "TRITON_DUMP_DIR": ".triton/dump", "TRITON_OVERRIDE_DIR": ".triton/override",
                 "TORCHINDUCTOR_CACHE_DIR": ".cache/torchinductor", "CUDA_CACHE_PATH": ".nv/ComputeCache",
                 "XDG_CACHE_HOME": ".cache", "SCALETRAIN_CUDA_CPU_CACHE": ".cache/scaletrain/cuda_cpu",
                 "MPLCONFIGDIR": ".config/matplotlib",
                 "HOME": ".", "TMPDIR": ".", "TMP": ".", "TEMP": "."}


def worker_runs_as_root() -> bool:
    """True when the worker stays uid 0 (without capabilities): no sandbox account can run Python."""
    return os.geteuid() == 0 and sandbox.worker_account() is None


_REMOTE = {"NotImplementedError": NotImplementedError, "AssertionError": AssertionError, "Flagged": Flagged,
           "TimeoutError": TimeoutError, "SpawnTimeout": TimeoutError}


def _remote_exception(raised: dict) -> Exception:
    """The worker's exception, rebuilt as one the harness classifies (never a class it names)."""
    kind, message, where = (str(raised.get(k, "")) for k in ("type", "message", "where"))
    first = (message.splitlines() or [""])[0]
    if kind in _REMOTE:
        return _REMOTE[kind](f"{first}{where}")
    return StudentCrash(f"{kind}: {first}{where}")


class Untrusted:
    def __init__(self, submission: Path, *, timeout_s: float = 60.0, device: str = "cpu"):
        self.submission, self.timeout_s, self.device = submission, timeout_s, device
        self._proc: _Exec | _Kept | None = None
        self._work: Path | None = None

    def call(self, probe: str, *args, timeout_s: float | None = None, **kwargs):
        """The outputs of `probe(*args, **kwargs)` run in the worker; raises what the student's
        code raised (rebuilt), TimeoutError, or StudentCrash."""
        if self._proc is None:
            self.start()
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            wire.send(self._to, {"probe": probe, "args": list(args), "kwargs": kwargs})
            answer = wire.recv(self._from, deadline=time.monotonic() + limit)
        except TimeoutError:
            self.close()
            raise TimeoutError(f"your code did not finish within {limit:.0f} s (an infinite loop or a deadlock?)")
        except (EOFError, BrokenPipeError, wire.WireError) as exc:
            # the channel can close a moment before the process is gone: give it that moment
            code = self._proc.finish(EXIT_GRACE_S) if self._proc else None
            last = (self.log_tail(1) or "no output").strip()
            self.close()
            what = f"exited with code {code} ({last[:300]})" if code is not None else f"sent no valid answer ({exc})"
            raise StudentCrash(f"the process running your code {what}") from None
        if not isinstance(answer, dict) or not ("ok" in answer or isinstance(answer.get("raised"), dict)):
            self.close()
            raise StudentCrash("the process running your code sent a malformed answer")
        if "raised" in answer:
            raise _remote_exception(answer["raised"])
        return answer["ok"]

    @property
    def started(self) -> bool:
        return self._proc is not None

    def start(self) -> None:
        """Start the worker now (a call starts it when needed). Start it before the trusted side
        has threads of its own: an exec'd worker is forked with a preexec_fn, which threads make
        unsafe. On CPU, inside `zygote.preloaded()`, it is forked by the worker zygote instead
        (autograder/worker_zygote.py), with the same confinement."""
        sandbox._prctl(sandbox.PR_SET_DUMPABLE, 0)  # no ptrace, no /proc/<pid>/mem or fd of this process for others
        account = sandbox.worker_account()
        # not under $TMPDIR: that is the group's work folder, inside the grader's private folder,
        # which a worker without capabilities (or as another account) can't reach once it has
        # dropped them, while its ranks chdir into their cwd by path
        self._work = Path(tempfile.mkdtemp(prefix="worker-", dir=WORKER_TMP))
        if account is not None:
            os.chown(self._work, account.pw_uid, account.pw_gid)
        to_r, self._to = os.pipe()
        self._from, from_w = os.pipe()
        box = sandbox.Sandbox(timeout_s=self.timeout_s, workdir=str(self._work),
                              cpu_s=int(self.timeout_s * (os.cpu_count() or 1) * 4) + 60,
                              address_space=sandbox.address_space(self.device))
        build = str(Path(os.environ[BUILD_ENV]).resolve())
        # what the worker reads: reachable by its account even below a folder it can't enter
        expose = [*sandbox.interpreter_paths(), build, str(self.submission.resolve())]
        confinement = dict(account=None if account is None else (account.pw_uid, account.pw_gid),
                           keep=build, repo=str(REPO), expose=expose)
        with open(self._work / "worker.log", "wb") as log:
            if self.device == "cpu":
                self._proc = _Kept.start(box, self._env(), confinement, (to_r, from_w, log.fileno()))
            if self._proc is None:  # the account is switched inside the jail, after its mounts
                cmd = [sys.executable, "-S", "-m", "autograder.worker", str(to_r), str(from_w)]
                self._proc = _Exec(subprocess.Popen(
                    cmd, pass_fds=(to_r, from_w), env=self._env(), cwd=self._work, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=lambda: sandbox.confine_worker(box, **confinement)))
        os.close(to_r)
        os.close(from_w)

    def _env(self) -> dict[str, str]:
        build = Path(os.environ[BUILD_ENV])
        paths = [build / "lib", build, *map(Path, sandbox.package_paths())]
        # caches (WORKER_CACHES) are the worker's own: the grader's, or those torch pointed into the
        # trusted side's folder (importing torch._dynamo sets TORCHINDUCTOR_CACHE_DIR), it can't write
        inherited = (SEED_ENV, "PYTHONPATH", BUILD_ENV, zygote.WORKER_CLIENT_ENV, *WORKER_CACHES)
        env = {k: v for k, v in os.environ.items() if k not in inherited}
        env.update({name: os.path.normpath(self._work / sub) for name, sub in WORKER_CACHES.items()},
                   PYTHONPATH=os.pathsep.join(map(str, paths)), **{SUBMISSION_ENV: str(self.submission)})
        if self.device == "cpu":  # ranks fork from this one-thread worker, torch already loaded
            env[RANKS_FORK_ENV] = "fork"
        return env

    def log_tail(self, lines: int = 5) -> str:
        path = self._work / "worker.log" if self._work else None
        if path is None or not path.is_file():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        """End the worker: its request channel closed, it returns and Python cleans up after
        itself (multiprocessing's folders); whatever is still running a moment later, it and
        everything it started, is killed. Its folder is removed."""
        if self._proc is not None:
            os.close(self._to)
            self._proc.finish(EXIT_GRACE_S)
            os.close(self._from)
            self._proc = None
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None


class _Exec:
    """An exec'd worker, started in a session of its own."""

    def __init__(self, proc: subprocess.Popen):
        self._proc = proc

    def finish(self, grace_s: float) -> int | None:
        """Its exit code if it ends within `grace_s` (None if not); then its session is killed."""
        try:
            code = self._proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            code = None
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._proc.wait()
        return code


class _Kept:
    """A worker forked by the worker zygote under a keeper that kills its tree when it ends or
    when the control pipe closes, then writes its status (autograder/worker_zygote.py)."""

    _client: socket.socket | None = None

    def __init__(self, keeper: int, control_w: int, status_r: int):
        self._keeper, self._control_w, self._status_r = keeper, control_w, status_r
        self._code: int | None = None

    @classmethod
    def start(cls, box, env, confinement, fds) -> _Kept | None:
        """The worker, from the zygote this runner was given a client of; None without one."""
        if cls._client is None:
            if os.environ.get(zygote.WORKER_CLIENT_ENV) is None:
                return None
            cls._client = socket.socket(fileno=int(os.environ.pop(zygote.WORKER_CLIENT_ENV)))
        control_r, control_w = os.pipe()
        status_r, status_w = os.pipe()
        request = {"box": asdict(box), "env": env, "cwd": box.workdir, "confinement": confinement}
        try:
            socket.send_fds(cls._client, [json.dumps(request).encode()], [*fds, control_r, status_w])
            keeper = int(cls._client.recv(64))
        except (OSError, ValueError):  # the zygote is gone: exec a worker
            os.close(control_w)
            os.close(status_r)
            return None
        finally:
            os.close(control_r)
            os.close(status_w)
        return cls(keeper, control_w, status_r)

    def finish(self, grace_s: float) -> int | None:
        """Its exit code if it ends within `grace_s` (None if not); then the keeper is told to
        kill its tree (the control pipe closed) and waited for."""
        if self._status_r is None:
            return self._code
        data, ended = zygote.read_to_end(self._status_r, grace_s)
        os.close(self._control_w)
        if not ended:
            more, ended = zygote.read_to_end(self._status_r, sandbox.KILL_WAIT_S + grace_s)
            data += more
        if not ended:  # a keeper that does not answer: its session, the last resort
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._keeper, signal.SIGKILL)
        os.close(self._status_r)
        self._status_r = None
        with contextlib.suppress(ValueError, TypeError, KeyError):
            status = json.loads(data)
            self._code = None if status["timed_out"] else status["code"]
        return self._code


class RemoteModule:
    """The student's module as the trusted side sees it: `mem.gpt_num_params(**kw)` runs
    `probe(stem, "gpt_num_params", **kw)` in the worker and returns its outputs as data."""

    def __init__(self, worker: Untrusted, stem: str, probe: str):
        self._worker, self._stem, self._probe = worker, stem, probe

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args, **kwargs):
            return self._worker.call(self._probe, self._stem, name, *args, **kwargs)
        call.__name__ = name
        return call
