"""The sandbox's layers one by one, on shell commands (they run under any user, unlike the venv's
Python): limits, work folder, time limit, clean-up of detached processes, the unprivileged user."""

import json
import os
import pwd
import subprocess
import sys
import re
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from autograder import sandbox
from procs import processes_with  # tests/ is on sys.path

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only root can switch users")


@pytest.fixture
def folder():
    """A grader-private folder in /tmp (the sandbox user can't enter pytest's tmp_path)."""
    path = Path(tempfile.mkdtemp(prefix="sandbox-test-"))
    yield path
    shutil.rmtree(path)


@pytest.fixture
def marker(monkeypatch):
    """An environment entry every process of the run inherits; none may be left at the end."""
    value = f"SANDBOX_TEST={uuid.uuid4().hex}"
    monkeypatch.setenv(*value.split("="))
    yield value
    for pid in processes_with(value):
        os.kill(pid, signal.SIGKILL)


def _run(folder: Path, script: str, timeout_s: float = 30, device: str = "cpu"):
    box = sandbox.prepare(folder, timeout_s=timeout_s, device=device)
    log = folder / "output.log"
    status = sandbox.run(["/bin/sh", "-c", script], box, env=dict(os.environ), log=log)
    return box, status, log.read_text()


def _limit(limits: str, name: str) -> str:
    return re.search(rf"^{name}\s+(\S+)", limits, re.M).group(1)


def test_limits_work_folder_and_environment(folder, marker):
    box, status, out = _run(folder, 'cat /proc/self/limits; echo "cwd=$(pwd) home=$HOME tmp=$TMPDIR"; exit 3')
    assert status == (False, 3)
    assert _limit(out, "Max address space") == str(16 << 30)
    assert _limit(out, "Max open files") == "1024"
    assert _limit(out, "Max file size") == str(256 << 20)
    assert _limit(out, "Max core file size") == "0"
    assert _limit(out, "Max cpu time") == str(box.cpu_s) and box.cpu_s > 30 * (os.cpu_count() or 1)
    work = folder / "work"
    assert f"cwd={work} home={work} tmp={work}" in out


def test_address_space_is_unlimited_on_cuda_and_configurable(folder, monkeypatch):
    (folder / "a").mkdir()
    (folder / "b").mkdir()
    assert sandbox.prepare(folder / "a", timeout_s=1, device="cuda").address_space is None
    monkeypatch.setenv(sandbox.AS_ENV, "0.5")
    assert sandbox.prepare(folder / "b", timeout_s=1, device="cpu").address_space == 1 << 29


def test_file_size_limit_stops_a_flood_of_output(folder, marker):
    _, (timed_out, code), _ = _run(folder, "exec head -c 300000000 /dev/zero")
    assert not timed_out and code == -signal.SIGXFSZ
    assert (folder / "output.log").stat().st_size == 256 << 20


def test_timeout_kills_the_whole_tree(folder, marker):
    start = time.monotonic()
    _, status, _ = _run(folder, "sleep 300 & (setsid sleep 300 &); sleep 300", timeout_s=2)
    assert status == (True, None) and time.monotonic() - start < 15
    assert processes_with(marker) == []


def test_detached_processes_die_when_the_group_exits(folder, marker):
    # `( ... &)`: a double fork; setsid: a new session, out of reach of a kill of the process group
    _, status, _ = _run(folder, "(setsid sleep 300 &); (sleep 300 &); exit 0")
    assert status == (False, 0)
    assert processes_with(marker) == []


@root_only
def test_runs_as_the_unprivileged_user(folder, marker, monkeypatch):
    nobody = pwd.getpwnam("nobody")
    monkeypatch.setattr(sandbox, "_account", lambda: (nobody, "test"))
    grader_file = folder / "grader.txt"
    grader_file.write_text("the grader's\n")
    script = (f'id -u; id -G; echo mine > "$HOME/mine" && echo wrote-home; '
              f'(echo forged >> {grader_file}) 2>/dev/null && echo wrote-grader || echo denied; '
              f'grep "Max processes" /proc/self/limits')
    box, status, out = _run(folder, script)
    assert status == (False, 0), out
    assert out.splitlines()[:4] == [str(nobody.pw_uid), str(nobody.pw_gid), "wrote-home", "denied"]
    assert grader_file.read_text() == "the grader's\n"
    assert _limit(out, "Max processes") == str(sandbox.NPROC) == str(box.nproc)


@root_only
def test_no_usable_account_is_an_error_unless_unsafe_is_asked_for(monkeypatch):
    """As root, student code never runs as root by default: `none` or an unknown account is a
    configuration error naming the fix; only --unsafe-no-sandbox (its variable) allows it."""
    try:
        for name, why in (("none", "runs student code as root"), ("no-such-user-here", "no user 'no-such-user-here'")):
            monkeypatch.setenv(sandbox.USER_ENV, name)
            monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
            sandbox._account.cache_clear()
            with pytest.raises(sandbox.SandboxError, match="--unsafe-no-sandbox"):
                sandbox.worker_account()
            assert why in sandbox.describe()
            monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
            sandbox._account.cache_clear()
            assert sandbox.worker_account() is None and sandbox.describe().startswith("UNSAFE")
    finally:
        monkeypatch.undo()
        sandbox._account.cache_clear()  # decided again, under the restored environment


@root_only
def test_nobody_runs_an_interpreter_it_could_not_reach(tmp_path):
    """A Python under a mode-700 folder (pyenv under /root here) is reachable inside the jail: a
    tmpfs over the closed folder with the interpreter bound back. The account is not root."""
    sandbox._account.cache_clear()
    account = sandbox.worker_account()
    assert account is not None and account.pw_uid != 0, sandbox.describe()
    closed = [p for p in sandbox.interpreter_paths() if sandbox._closed_ancestor(p)]
    closed_folders = sorted({sandbox._closed_ancestor(p) for p in closed})
    ids = (account.pw_uid, account.pw_gid)
    shown = "sorted(os.listdir(d)) if os.access(d, os.R_OK) else None"
    code = f"import json, os, numpy; print(json.dumps([os.getuid(), {{d: {shown} for d in {closed_folders!r}}}]))"
    out = subprocess.run([sys.executable, "-c", code],
                         preexec_fn=lambda: sandbox.jail(ids, expose=sandbox.interpreter_paths()), cwd="/",
                         capture_output=True, text=True, timeout=60, env={"PATH": os.defpath})
    assert out.returncode == 0, out.stderr
    uid, listed = json.loads(out.stdout)
    assert uid == account.pw_uid
    for folder in closed_folders:  # only the way to the interpreter is there; the rest is out of sight
        inside = {Path(p).relative_to(folder).parts[0] for p in closed if Path(p).is_relative_to(folder)}
        assert set(listed[folder]) == inside, (folder, listed[folder])


@pytest.mark.slow
def test_the_worker_imports_torch_from_where_the_grader_does(folder):
    """An interpreter whose packages are reached only through a .pth (a GPU machine's torch may sit
    in the user site, a .pth's folder or PYTHONPATH, not in site.getsitepackages()): the worker
    starts with -S, so it is handed the folders the grader finds torch, numpy and triton in, and a0's
    solution gets every point instead of every check crashing on `import torch`."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "venv")], check=True, timeout=120)
    os.chmod(folder, 0o755)
    site_dir = next((folder / "venv").glob("lib/python*/site-packages"))
    (site_dir / "course.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    repo = Path(sandbox.__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "AUTOGRADER_SUBMISSION")}
    env["PYTHONPATH"] = os.pathsep.join([str(repo / "lib"), str(repo)])
    out = folder / "a0.json"
    proc = subprocess.run([str(folder / "venv" / "bin" / "python"), "-m", "autograder", "grade", "a0", "--submission",
                           str(repo / "solutions" / "a0_memory"), "--json", str(out)], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    result = json.loads(out.read_text())
    assert proc.returncode == 0 and result["score"] == 100, proc.stdout[-3000:] + proc.stderr[-2000:]


@root_only
def test_the_account_probe_finds_torch_where_a_worker_will_look(folder, monkeypatch):
    """numpy reachable but torch not (a worker would crash on `import torch` in every student's code
    alike): the probe refuses the account, naming torch; with torch there too it accepts."""
    import sysconfig

    os.chmod(folder, 0o755)
    purelib = Path(sysconfig.get_paths()["purelib"])
    for name in ("numpy", "numpy.libs"):
        if (purelib / name).exists():
            (folder / name).symlink_to(purelib / name)
    monkeypatch.setattr(sandbox, "package_paths", lambda: [str(folder)])
    account = pwd.getpwnam("nobody")
    assert "No module named 'torch'" in (sandbox._probe(account) or ""), sandbox._probe(account)
    (folder / "torch").symlink_to(purelib / "torch")
    assert sandbox._probe(account) is None
