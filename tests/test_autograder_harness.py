"""The grading harness on a toy assignment: every outcome, every bad input, no hang, no orphan."""

import json
import subprocess
import sys
import textwrap
import time

import pytest

from autograder.cli import _exit_code
from autograder.grade import UnusableSubmission, grade_assignment
from autograder.manifest import Check, Group, Manifest, Task
from autograder.results import to_gradescope

SUITE = '''
import os, time
import torch
import torch.distributed as dist
from scaletrain.launch import spawn
from autograder import checks

def _rank_add(rank, world_size):
    toy = checks.student_module("toy")
    return toy.add(rank, 1)

def group_main(ctx):
    toy = ctx.student("toy")
    with ctx.check("adds"):
        assert toy.add(2, 3) == 5, f"add(2, 3) returned {toy.add(2, 3)}"
    with ctx.check("multiplies"):
        assert toy.mul(2, 3) == 6
    with ctx.check("ranks add"):
        assert spawn(_rank_add, 2, timeout_s=float(os.environ.get("TOY_SPAWN_TIMEOUT", "30"))) == [1, 2]

def group_guarded(ctx):
    toy = ctx.student("toy")
    with ctx.check("no forbidden sum at run time"):
        with checks.forbid_calls("torch.sum", modules=(toy,)):
            toy.total(torch.ones(3))

def group_gpu(ctx):
    with ctx.check("fast on gpu"):
        raise AssertionError("must never run on CPU")
'''

SOLUTION = '''
import torch

def add(a, b):
    return a + b

def mul(a, b):
    return a * b

def total(x):
    return x.cumsum(0)[-1]
'''

MANIFEST = Manifest(
    assignment="a99", folder="a99_toy", title="Toy",
    files={"toy.py": "toy.py"},
    tasks=(Task("1", "add", file="toy.py", functions=("add",)), Task("2", "mul", file="toy.py")),
    forbidden={"toy.py": ("torch.distributed.all_reduce",)},
    groups=(
        Group("main", "toy_suite:group_main", timeout_s=90, checks=(
            Check("1", "adds", 1), Check("2", "multiplies", 1), Check("1", "ranks add", 1))),
        Group("guarded", "toy_suite:group_guarded", timeout_s=60, checks=(
            Check("2", "no forbidden sum at run time", 1),)),
        Group("gpu", "toy_suite:group_gpu", needs_gpu=True, checks=(Check("2", "fast on gpu", 2),)),
    ),
)


@pytest.fixture
def make_submission(tmp_path, monkeypatch):
    (tmp_path / "toy_suite.py").write_text(SUITE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delenv("AUTOGRADER_SUBMISSION", raising=False)

    def make(text=SOLUTION, name="sub"):
        make.folder = tmp_path / name
        folder = tmp_path / name
        folder.mkdir()
        (folder / "toy.py").write_text(textwrap.dedent(text))
        return folder
    return make


def outcomes(results):
    return {r.check.name: r.outcome for r in results}


def test_solution_passes_and_gpu_group_is_not_run(make_submission):
    results = grade_assignment(MANIFEST, make_submission(), "cpu")
    assert outcomes(results) == {"adds": "passed", "multiplies": "passed", "ranks add": "passed",
                                 "no forbidden sum at run time": "passed", "fast on gpu": "not_run"}
    assert _exit_code(results) == 3
    payload = to_gradescope(results, device="cpu", elapsed=1.0)
    assert payload["score"] == 4 and payload["max_score"] == 6 and payload["extra_data"]["incomplete"]
    assert {t["extra_data"]["outcome"] for t in payload["tests"]} == {"passed", "not_run"}
    assert all(t["status"] in ("passed", "failed") for t in payload["tests"])


def test_stub_fails_without_error(make_submission):
    stub = SOLUTION.replace("return a + b", "raise NotImplementedError('a99 task 1: implement add')")
    results = grade_assignment(MANIFEST, make_submission(stub), "cpu", groups=("main",))
    o = outcomes(results)
    assert o["adds"] == "failed" and o["ranks add"] == "failed" and o["multiplies"] == "passed"
    reason = {r.check.name: r.reason for r in results}
    assert "not implemented yet" in reason["adds"] and "toy.py" in reason["adds"]
    assert "rank 0" in reason["ranks add"] and "NotImplementedError" in reason["ranks add"]


def test_infinite_loop_times_out_and_kills_everything(make_submission):
    looping = SOLUTION.replace("return a * b", "while True:\n        pass")
    short = Manifest(**{**MANIFEST.__dict__, "groups": (
        Group("main", "toy_suite:group_main", timeout_s=12, checks=MANIFEST.groups[0].checks),)})
    start = time.monotonic()
    results = grade_assignment(short, make_submission(looping), "cpu")
    assert time.monotonic() - start < 30
    assert outcomes(results) == {"adds": "passed", "multiplies": "timeout", "ranks add": "timeout"}
    leftover = subprocess.run(["pgrep", "-f", str(make_submission.folder)], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""


def test_os_exit_and_rank_crash_are_errors(make_submission):
    exiting = SOLUTION.replace("return a * b", "import os; os._exit(7)")
    o = outcomes(grade_assignment(MANIFEST, make_submission(exiting, "exit"), "cpu", groups=("main",)))
    assert o["adds"] == "passed" and o["multiplies"] == "error" and o["ranks add"] == "error"
    crashing = SOLUTION.replace("return a + b", "if b == 1 and a == 1:\n        raise ValueError('boom')\n    return a + b")
    results = grade_assignment(MANIFEST, make_submission(crashing, "crash"), "cpu", groups=("main",))
    r = next(r for r in results if r.check.name == "ranks add")
    assert r.outcome == "error" and "rank 1" in r.reason and "ValueError: boom" in r.reason


def test_deadlock_in_ranks_is_a_timeout(make_submission, monkeypatch):
    monkeypatch.setenv("TOY_SPAWN_TIMEOUT", "4")
    hanging = SOLUTION.replace("return a + b", textwrap.dedent('''\
        import torch, torch.distributed as dist
        if dist.is_initialized():
            t = torch.zeros(1); dist.recv(t, src=1 - dist.get_rank())
        return a + b''').replace("\n", "\n    "))
    results = grade_assignment(MANIFEST, make_submission(hanging), "cpu", groups=("main",))
    r = next(r for r in results if r.check.name == "ranks add")
    assert r.outcome == "timeout", r.reason


def test_static_checks_syntax_forbidden_and_missing(make_submission, tmp_path):
    o = outcomes(grade_assignment(MANIFEST, make_submission("def add(:\n", "syntax"), "cpu"))
    assert set(o.values()) == {"error"}  # decided statically, even for the GPU check
    forbidden = "import torch.distributed as dist\n" + SOLUTION.replace("return a + b", "dist.all_reduce(a); return a + b")
    results = grade_assignment(MANIFEST, make_submission(forbidden, "forbidden"), "cpu")
    assert outcomes(results)["adds"] == "flagged" and "all_reduce" in results[0].reason
    empty = tmp_path / "empty"
    empty.mkdir()
    results = grade_assignment(MANIFEST, empty, "cpu")
    assert outcomes(results)["adds"] == "error" and _exit_code(results) == 2
    with pytest.raises(UnusableSubmission):
        grade_assignment(MANIFEST, tmp_path / "nope", "cpu")


def test_runtime_guard_flags_a_forbidden_call(make_submission):
    cheating = SOLUTION.replace("return x.cumsum(0)[-1]", "return torch.sum(x)")
    o = outcomes(grade_assignment(MANIFEST, make_submission(cheating), "cpu", groups=("guarded",)))
    assert o == {"no forbidden sum at run time": "flagged"}


def test_cli_unknown_assignment_and_missing_folder_exit_2(tmp_path):
    out = tmp_path / "r.json"
    for args in (["grade", "a42"], ["grade", "all", "--submission", str(tmp_path / "missing")]):
        proc = subprocess.run([sys.executable, "-m", "autograder", *args, "--json", str(out)],
                              capture_output=True, text=True, timeout=120)
        payload = json.loads(out.read_text())
        assert proc.returncode == 2, proc.stderr
        assert payload["extra_data"]["harness_error"] and "error:" in proc.stderr


def test_report_ranks_names_the_rank_and_prefers_a_timeout(tmp_path):
    from autograder.context import GroupContext
    report = tmp_path / "report.jsonl"
    ctx = GroupContext("g", ["ok", "bad", "hang", "spawn"], tmp_path, "cpu", report)
    per_rank = [{"ok": None, "bad": None, "hang": ("AssertionError", "ring broken")},
                {"ok": None, "bad": ("AssertionError", "sum off by 3"), "hang": ("TimeoutError", "recv timed out")}]
    ctx.report_ranks(["ok", "bad", "hang"], per_rank)
    ctx.report_ranks(["spawn"], [], failure=RuntimeError("rank 2 exited"))
    rows = {r["name"]: r for r in map(json.loads, report.read_text().splitlines())}
    assert rows["ok"]["outcome"] == "passed"
    assert (rows["bad"]["outcome"], rows["bad"]["reason"]) == ("failed", "rank 1: sum off by 3")
    assert (rows["hang"]["outcome"], rows["hang"]["reason"]) == ("timeout", "rank 1: recv timed out")
    assert rows["spawn"]["outcome"] == "error" and "rank 2 exited" in rows["spawn"]["reason"]


def test_submission_folder_finds_the_assignment_folder_inside_a_solutions_like_dir(tmp_path):
    from autograder.cli import submission_folder
    from autograder.manifest import get_manifest
    m = get_manifest("a0")
    assert submission_folder(m, None, every=False) == m.stub_dir()
    (tmp_path / m.folder).mkdir()
    assert submission_folder(m, str(tmp_path), every=False) == tmp_path / m.folder  # like --submission solutions
    assert submission_folder(m, str(tmp_path), every=True) == tmp_path / m.folder
    for name in m.files:  # the student's own folder, passed directly, wins
        (tmp_path / name).write_text("")
    assert submission_folder(m, str(tmp_path), every=False) == tmp_path
    assert submission_folder(m, str(tmp_path / "elsewhere"), every=False) == tmp_path / "elsewhere"
