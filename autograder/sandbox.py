"""Confine the process that runs a test group (student code) and leave nothing of it behind.

The grader does not start the group's process itself but a trusted *warden*
(`python -m autograder.sandbox CONFIG CMD...`, in a new session), which

- makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER): a descendant that double-forks
  or calls setsid is re-parented to the warden instead of init, so it stays findable;
- starts CMD as the sandbox user (`nobody` when the grader is root), in its own work folder
  (cwd, HOME, TMPDIR), with resource limits (address space, CPU seconds, open files, file size,
  processes, no core files);
- enforces the group's time limit, and when CMD ends (exit, crash or timeout) SIGKILLs every
  process below itself (found through /proc, so only its own group's tree) and reaps them;
- prints one JSON line, {"timed_out": bool, "code": int | null}, on its stdout for the grader.

What each layer stops, and what none of them stops: "Threat model" in autograder/README.md.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import json
import os
import platform
import pwd
import resource
import signal
import site
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

USER_ENV = "AUTOGRADER_SANDBOX_USER"    # account groups run as when the grader is root (default nobody)
UNSAFE_ENV = "AUTOGRADER_UNSAFE_NO_SANDBOX"  # "1": --unsafe-no-sandbox, student code may run as root
AS_ENV = "AUTOGRADER_SANDBOX_AS_GIB"    # address space per process in GiB; 0: unlimited
# A rank (torch + gloo, 4 ranks of a5) peaks at 1.4 GiB of virtual memory on a 2-core machine; glibc's
# malloc arenas (8 per core) and thread stacks grow it with the core count, hence a wide margin.
DEFAULT_AS_GIB = 16
THIRD_PARTY = ("torch", "numpy", "triton")   # what the graded code imports beside the grading build
NOFILE = 1024
FSIZE = 256 << 20         # also bounds the group's log: print() past it ends the process (SIGXFSZ)
NPROC = 4096              # tasks (threads count) of the sandbox user, concurrent groups together
WARDEN_GRACE_S = 30.0     # the warden's own start and clean-up, on top of the group's limit
KILL_WAIT_S = 10.0        # a process in uninterruptible sleep dies only when it wakes

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 36, 38
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
CLONE_NEWNS, MS_RDONLY, MS_BIND, MS_REC, MS_PRIVATE = 0x00020000, 1, 4096, 16384, 1 << 18


class SandboxError(Exception):
    """The account named in $AUTOGRADER_SANDBOX_USER can't run groups (a configuration error)."""


@dataclass(frozen=True)
class Sandbox:
    """How one group's process is confined; sent to the warden as JSON."""
    timeout_s: float
    workdir: str                  # cwd, HOME and TMPDIR of the group, writable by it, removed by the caller
    cpu_s: int                    # RLIMIT_CPU per process
    address_space: int | None     # RLIMIT_AS in bytes; None: unlimited
    uid: int | None = None        # the account to run as; None: the grader's own
    gid: int | None = None
    nproc: int | None = None      # RLIMIT_NPROC; only with an account of its own (it counts per user)


# ---------------------------------------------------------------- grader side

def prepare(folder: Path, *, timeout_s: float, device: str, writable: tuple[Path, ...] = (),
            switch: bool = True) -> Sandbox:
    """The sandbox of one group inside the grader's private `folder`: a work folder and the
    `writable` files (its report) are handed to the sandbox account; `folder` itself stays the
    grader's and becomes traversable only, so the group can't replace the files in it.
    `switch=False`: the group stays the grader's account (a trusted group, whose student code
    runs in a worker that switches by itself, autograder/untrusted.py)."""
    account = worker_account() if switch else None
    work = folder / "work"
    work.mkdir()
    if account is not None:
        folder.chmod(0o711)
        for path in (work, *writable):
            os.chown(path, account.pw_uid, account.pw_gid)
    return Sandbox(timeout_s=timeout_s, workdir=str(work),
                   cpu_s=int(timeout_s * (os.cpu_count() or 1) * 1.1) + 10,
                   address_space=address_space(device),
                   uid=None if account is None else account.pw_uid,
                   gid=None if account is None else account.pw_gid,
                   nproc=None if account is None else NPROC)


def run(cmd: list[str], box: Sandbox, *, env: dict[str, str], log: Path) -> tuple[bool, int | None]:
    """Run `cmd` under a warden; (timed out, exit code). The code is the warden's own when it died
    before reporting (killed), and None on a timeout. stdout and stderr of `cmd` go to `log`."""
    warden_cmd = [sys.executable, "-m", "autograder.sandbox", json.dumps(asdict(box)), *cmd]
    with open(log, "wb") as out:
        warden = subprocess.Popen(warden_cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=out, start_new_session=True)
        try:
            status = warden.communicate(timeout=box.timeout_s + WARDEN_GRACE_S)[0]
        except subprocess.TimeoutExpired:
            return True, None
        finally:
            _stop(warden)
    try:
        report = json.loads(status)
        return bool(report["timed_out"]), report["code"]
    except (ValueError, TypeError, KeyError):
        return False, warden.returncode


def _stop(warden: subprocess.Popen) -> None:
    """Let a warden that is still running (the grader was interrupted, or it hangs) clean up; then
    kill its process group, the last resort for a warden that died before cleaning up."""
    if warden.poll() is None:
        warden.terminate()
        try:
            warden.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(warden.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    warden.wait()


def worker_account() -> pwd.struct_passwd | None:
    """The account every process that runs student code uses (a group's process here, a worker of
    autograder/untrusted.py); None: the grader's own."""
    return _account()[0]


def describe() -> str:
    """One line on which account groups run as, for the run's record."""
    try:
        return _account()[1]
    except SandboxError as exc:
        return str(exc)


@functools.cache
def _account() -> tuple[pwd.struct_passwd | None, str]:
    """The account groups run as (None: the grader's own) and a description; decided once.

    Only root can switch, and as root student code never runs as root: $AUTOGRADER_SANDBOX_USER
    names the account (default `nobody`), which must be able to start this interpreter, inside the
    mount namespace a worker gets (`jail`: a Python under a private /root/.pyenv is made reachable
    there). An account that can't, or `none`, is a configuration error (SandboxError, exit 2)
    unless the instructor asked for --unsafe-no-sandbox: student code then runs as root without
    capabilities, and results.json says so."""
    if os.geteuid() != 0:
        return None, f"groups run as the grader's own user (uid {os.geteuid()}): only root can switch"
    name = os.environ.get(USER_ENV, "") or "nobody"
    if name == "none":
        problem = f"{USER_ENV}=none runs student code as root"
    else:
        try:
            account = pwd.getpwnam(name)
        except KeyError:
            account, problem = None, f"there is no user {name!r}"
        else:
            problem = _probe(account)
        if problem is None:
            return account, f"groups run as {account.pw_name} (uid {account.pw_uid})"
    if unsafe():
        return None, f"UNSAFE (--unsafe-no-sandbox): student code runs as root without capabilities; {problem}"
    raise SandboxError(f"no unprivileged account to run student code: {problem}. Fix: make the interpreter "
                       f"and its packages readable by {name!r}, or name another account in {USER_ENV}; "
                       "for local use only, --unsafe-no-sandbox")


def unsafe() -> bool:
    """The instructor passed --unsafe-no-sandbox (the CLI sets this for every process it starts)."""
    return os.environ.get(UNSAFE_ENV) == "1"


# numpy imported, torch found (not imported: seconds, and runners that start fresh probe again)
_PROBE_IMPORTS = ("import importlib.util, numpy\n"
                  "if importlib.util.find_spec('torch') is None:\n"
                  "    raise SystemExit(\"ModuleNotFoundError: No module named 'torch'\")")


def _probe(account: pwd.struct_passwd) -> str | None:
    """None if `account` can start this interpreter as a worker does (-S, `package_paths()`) and reach
    numpy and torch inside a worker's jail (what a worker needs before it imports the grading
    build), else why not. Not the
    grader itself: in a package the grader's source is root's alone, by design."""
    what = f"user {account.pw_name} cannot run {sys.executable} with its packages"
    ids, paths = (account.pw_uid, account.pw_gid), interpreter_paths()
    env = {"PATH": os.defpath, "PYTHONPATH": os.pathsep.join(package_paths())}  # as a worker starts
    try:
        proc = subprocess.run([sys.executable, "-S", "-c", _PROBE_IMPORTS], cwd="/", env=env,
                              preexec_fn=lambda: jail(ids, expose=paths),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{what} ({exc})"
    lines = proc.stderr.strip().splitlines()
    return f"{what} ({lines[-1] if lines else f'exit code {proc.returncode}'})" if proc.returncode else None


def address_space(device: str) -> int | None:
    """RLIMIT_AS in bytes. None on CUDA: the driver reserves virtual address space on the scale of
    the GPU's and the host's memory together, and initialization fails under a limit."""
    gib = float(os.environ.get(AS_ENV, DEFAULT_AS_GIB))
    return None if device == "cuda" or gib <= 0 else int(gib * 2**30)


# ---------------------------------------------------------------- warden side

def _prctl(option: int, value: int, *, check: bool = True) -> int:
    rc = ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    if check and rc != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")
    return rc


def exit_now(code: int):
    """End this process at once, its output flushed: for a group's runner and worker, whose work is
    on disk (`record` flushes every line) or was sent, and whose folder the grader removes. Skips
    the interpreter's teardown of torch (half a second per process) and any exit hook the
    student's code registered."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def confine(box: Sandbox) -> None:
    """The limits, set in a process that will run student code, after its switch of account and
    before its exec (the warden's child here; the worker of autograder/untrusted.py)."""
    limits = {resource.RLIMIT_CORE: 0, resource.RLIMIT_NOFILE: NOFILE, resource.RLIMIT_FSIZE: FSIZE,
              resource.RLIMIT_CPU: box.cpu_s, resource.RLIMIT_AS: box.address_space,
              resource.RLIMIT_NPROC: box.nproc}
    for which, value in limits.items():
        if value is not None:
            hard = resource.getrlimit(which)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))


def confine_worker(box: Sandbox, *, account: tuple[int, int] | None, keep: str, repo: str,
                   expose: list[str]) -> None:
    """In a worker (autograder/untrusted.py), before it runs anything: its jail (as root: the
    repository hidden, `keep`, the grading build, excepted; then `account`), the sandbox's limits,
    no way to gain privileges. A root worker without an account (only under --unsafe-no-sandbox)
    drops every capability: the bounding set emptied, so exec grants none back."""
    jail(account, expose=expose, hide=(repo, keep))
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, check=False)  # after the switch, which clears it: dies with its keeper
    confine(box)
    _prctl(PR_SET_NO_NEW_PRIVS, 1, check=False)
    if os.geteuid() == 0:
        for cap in range(64):
            _prctl(PR_CAPBSET_DROP, cap, check=False)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)      # _LINUX_CAPABILITY_VERSION_3, this process
        data = (ctypes.c_uint32 * 6)()                      # effective, permitted, inheritable: none
        nr = _SYS_CAPSET.get(platform.machine())
        if nr is None or ctypes.CDLL(None, use_errno=True).syscall(nr, header, data) != 0:
            os._exit(121)  # refuse to run student code as a privileged root


def jail(account: tuple[int, int] | None, *, expose: list[str], hide: tuple[str, str] | None = None) -> None:
    """As root, in a child before it runs anything: a mount namespace of its own in which the
    grader's repository is hidden (`hide`: the repository and the one folder of it to keep) and the
    folders `expose` (the interpreter's) are reachable by `account`; then `account` (uid, gid), with
    no supplementary groups. Where mounts are not allowed the files' permissions decide, as the
    account probe that chose `account` found them enough. Not root: nothing to do."""
    if os.geteuid() != 0 or (account is None and hide is None):
        return
    if _private_namespace():
        if hide is not None:
            _hide_repository(Path(hide[0]), Path(hide[1]))
        if account is not None:
            _expose(expose)
    if account is not None:
        os.setgroups([])
        os.setgid(account[1])
        os.setuid(account[0])


def package_paths() -> list[str]:
    """The worker's import path for third-party packages (it starts with -S: no site, no .pth): this
    interpreter's site-packages, and the folder each of THIRD_PARTY is found in from here when that
    is elsewhere (the user site, a .pth's folder, PYTHONPATH). A GPU machine's torch need not be in
    its interpreter's site-packages; a worker without it would fail every student's code alike."""
    found = (importlib.util.find_spec(name) for name in THIRD_PARTY)
    return list(dict.fromkeys([*site.getsitepackages(),
                               *(os.path.dirname(os.path.dirname(s.origin)) for s in found if s and s.origin)]))


def interpreter_paths() -> list[str]:
    """What a process of this interpreter reads before it imports anything of ours: its prefixes,
    its executable's folder and its packages' folders, as named (a venv reached through a link finds
    its pyvenv.cfg there) and as real paths."""
    named = {sys.base_prefix, sys.prefix, os.path.dirname(os.path.abspath(sys.executable)), *package_paths()}
    return sorted(named | {os.path.realpath(p) for p in named})


def _private_namespace() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.unshare(CLONE_NEWNS) == 0 and libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0


def _hide_repository(repo: Path, keep: Path) -> None:
    """An empty read-only tmpfs over every folder of the grader's repository and /dev/null over every
    file (the venv, which holds the interpreter, and `keep`, the grading build, excepted), so the
    reference, solutions/ and the suites can't be read from disk."""
    libc = ctypes.CDLL(None, use_errno=True)
    for entry in repo.iterdir():
        if entry.name == ".venv" or entry.is_symlink() or keep.is_relative_to(entry):
            continue
        target = str(entry).encode()
        if entry.is_dir():
            libc.mount(b"tmpfs", target, b"tmpfs", MS_RDONLY, b"size=4k")
        else:
            libc.mount(b"/dev/null", target, None, MS_BIND, None)


def _closed_ancestor(path: str) -> str | None:
    """The outermost folder on the way to `path` that other accounts can't enter (no o+x), if any."""
    parts = Path(path).parts
    for i in range(2, len(parts) + 1):
        folder = os.path.join(*parts[:i])
        try:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return folder
        except OSError:
            return None
    return None


def _expose(paths: list[str]) -> None:
    """Each of `paths` that lies below a folder other accounts can't enter (a Python installed under
    a mode-700 /root) made reachable: an empty tmpfs over that folder, the path bound back into it
    at its own place. Whatever else the folder held stays out of sight."""
    libc = ctypes.CDLL(None, use_errno=True)
    closed: dict[str, list[str]] = {}
    for path in sorted(paths, key=len):
        folder = _closed_ancestor(path)
        if folder is not None and not any(Path(path).is_relative_to(p) for p in closed.get(folder, [])):
            closed.setdefault(folder, []).append(path)
    for folder, inside in closed.items():
        held = {path: os.open(path, os.O_PATH) for path in inside}  # before the tmpfs covers them
        libc.mount(b"tmpfs", folder.encode(), b"tmpfs", 0, b"mode=0755,size=4k")
        for path, fd in held.items():
            os.makedirs(path, mode=0o755, exist_ok=True)
            libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, MS_BIND | MS_REC, None)
            os.close(fd)


def child_env(box: Sandbox) -> dict[str, str]:
    """The warden's environment with every place tools write by default moved to the work folder
    (torch, Triton and nvcc keep caches under HOME or TMPDIR)."""
    here = box.workdir
    return dict(os.environ, HOME=here, TMPDIR=here, TEMP=here, TMP=here)


def _below(root: int) -> list[tuple[int, str]]:
    """(pid, state) of every process below `root`, read from /proc."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # the name before ")" may hold spaces
        except OSError:
            continue  # it ended meanwhile
        children.setdefault(int(fields[1]), []).append((int(entry), fields[0]))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def _kill_descendants() -> None:
    """SIGKILL and reap everything below the warden, until nothing is left (a process forking
    meanwhile is found on the next pass: its orphans come to the warden, the subreaper)."""
    end = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < end:
        alive = [pid for pid, state in _below(os.getpid()) if state != "Z"]
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reaped_all = _reap()
        if not alive and reaped_all:
            return
        time.sleep(0.01)


def _reap() -> bool:
    """Reap every ended child; True when the warden has no child left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def _sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds into main's `finally`: clean up, then exit


def guard(box: Sandbox, start) -> dict:
    """The warden's work around the child `start()` returns (a Popen, or anything with its
    `wait(timeout)`): wait up to the limit, then kill and reap everything below; the status."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGTERM, _sigterm)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # the grader was killed: clean up now, not at the limit
    timed_out, code = False, None
    try:
        child = start()
        try:
            code = child.wait(timeout=box.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
        _kill_descendants()
    return {"timed_out": timed_out, "code": code}


def main(argv: list[str]) -> int:
    box = Sandbox(**json.loads(argv[0]))
    account = None if box.uid is None else (box.uid, box.gid)
    paths = interpreter_paths()

    def enter():  # the warden has no threads
        jail(account, expose=paths)
        confine(box)

    status = guard(box, lambda: subprocess.Popen(
        argv[1:], cwd=box.workdir, env=child_env(box), stdin=subprocess.DEVNULL,
        stdout=sys.stderr.fileno(), stderr=subprocess.STDOUT, preexec_fn=enter))
    print(json.dumps(status), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
