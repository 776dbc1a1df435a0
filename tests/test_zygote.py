"""Trusted runners forked from the zygote get the sandbox an exec'd runner gets, the same outcomes
on a hang or an exit, and leave nothing behind; the zygote ends with its block."""

import json
import os
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from autograder import zygote
from autograder.manifest import Check, Group, Manifest, Task
from autograder.runner import run_group
from procs import processes_with  # tests/ is on sys.path

SUITE = '''
import json, os, resource, sys, tempfile, time

def where(ctx):
    with ctx.check("reports"):
        warden = open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode().split("\\0")
        ctx.skip(json.dumps({"warden": warden, "cwd": os.getcwd(), "home": os.environ["HOME"],
                             "tmp": tempfile.gettempdir(), "path0": sys.path[0], "argv0": sys.argv[0],
                             "cpu": resource.getrlimit(resource.RLIMIT_CPU)[0],
                             "submission": os.environ.get("AUTOGRADER_SUBMISSION")}))

def detaches_and_hangs(ctx):
    with ctx.check("reports"):
        if os.fork() == 0:  # double fork, new session: out of the runner's process group
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "300"])
            os._exit(0)
        os.wait()
        time.sleep(300)

def exits(ctx):
    with ctx.check("reports"):
        os._exit(7)
'''


@pytest.fixture
def suite(tmp_path, monkeypatch):
    folder = Path(tempfile.mkdtemp(prefix="zygote-suite-"))
    folder.chmod(0o755)  # a legacy group's runner, which imports it, runs as the sandbox account
    (folder / "zygote_suite.py").write_text(SUITE)
    monkeypatch.setenv("PYTHONPATH", str(folder))
    marker = f"ZYGOTE_TEST=z-{uuid.uuid4().hex}"
    monkeypatch.setenv(*marker.split("="))
    yield marker
    for pid in processes_with(marker):
        os.kill(pid, 9)


def grade(fn: str, tmp_path: Path, *, timeout_s: float = 60, trusted: bool = True):
    manifest = Manifest(assignment="a99", folder="a99_toy", title="Toy", files={"toy.py": "toy.py"},
                        tasks=(Task("1", "one", file="toy.py"),),
                        groups=(Group("g", f"zygote_suite:{fn}", timeout_s=timeout_s, trusted=trusted,
                                      checks=(Check("1", "reports", 1),)),))
    [result] = run_group(manifest, manifest.groups[0], tmp_path, "cpu")
    return result


def test_a_forked_runner_gets_the_sandbox_of_an_exec_d_one(suite, tmp_path):
    exec_d = json.loads(grade("where", tmp_path).reason)
    with zygote.preloaded():
        forked = json.loads(grade("where", tmp_path).reason)
        untrusted = json.loads(grade("where", tmp_path, trusted=False).reason)
    assert "autograder.sandbox" in exec_d["warden"] and "autograder.sandbox" in untrusted["warden"]
    assert "autograder.zygote" in forked["warden"]
    for seen in (exec_d, forked):
        assert seen["cwd"] == seen["home"] == seen["tmp"] == seen["path0"] and Path(seen["cwd"]).name == "work"
        assert seen["argv0"].endswith("runner.py") and seen["submission"] == str(tmp_path)
    assert forked["cpu"] == exec_d["cpu"]


def test_a_forked_runner_that_hangs_is_a_timeout_and_leaves_only_the_zygote(suite, tmp_path):
    with zygote.preloaded():
        start = time.monotonic()
        result = grade("detaches_and_hangs", tmp_path, timeout_s=3)
        assert result.outcome == "timeout" and time.monotonic() - start < 20
        assert processes_with(suite) == [zygote._active._proc.pid]  # the detached sleeper is gone
        result = grade("exits", tmp_path)
        assert result.outcome == "error" and "exited with code 7" in result.reason
    assert processes_with(suite) == []


def test_groups_go_on_without_a_zygote_that_died(suite, tmp_path):
    with zygote.preloaded():
        zygote._active._proc.kill()
        zygote._active._proc.wait()
        assert "autograder.sandbox" in json.loads(grade("where", tmp_path).reason)["warden"]
