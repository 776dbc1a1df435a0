"""The grading harness on a toy assignment: every outcome, every bad input, no hang, no orphan."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autograder import sandbox
from autograder.cli import exit_code
from autograder.grade import UnusableSubmission, grade_assignment, ignored_files
from autograder.manifest import REPO, Check, Group, Manifest, Task, all_manifests
from autograder.results import to_gradescope
from procs import processes_with  # tests/ is on sys.path

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

def group_sandboxed(ctx):
    import tempfile
    with ctx.check("runs in its own folder, as the sandbox user"):
        here = os.getcwd()
        assert os.environ["HOME"] == here and tempfile.gettempdir() == here, (here, os.environ["HOME"])
        if os.environ.get("TOY_EXPECT_UID"):
            assert os.geteuid() == int(os.environ["TOY_EXPECT_UID"]), os.geteuid()
            try:
                open(__file__, "a").close()
            except PermissionError:
                pass
            else:
                raise AssertionError("could write the grader's files")
    with ctx.check("names its folder"):
        ctx.skip(os.getcwd())  # the test reads the folder from the reason

def group_loud(ctx):
    with ctx.check("huge message"):
        raise AssertionError("x" * 50_000_000)
    print("y" * 10_000_000, flush=True)
    os._exit(3)
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
        Group("main", "toy_suite:group_main", trusted=False, timeout_s=90, checks=(
            Check("1", "adds", 1), Check("2", "multiplies", 1), Check("1", "ranks add", 1))),
        Group("guarded", "toy_suite:group_guarded", trusted=False, timeout_s=60, checks=(
            Check("2", "no forbidden sum at run time", 1),)),
        Group("gpu", "toy_suite:group_gpu", trusted=False, needs_gpu=True, checks=(Check("2", "fast on gpu", 2),)),
    ),
)


@pytest.fixture
def make_submission(tmp_path, monkeypatch):
    # The suite must be readable by the sandbox user, which can't enter pytest's private tmp_path.
    suite_dir = Path(tempfile.mkdtemp(prefix="toy-suite-"))
    suite_dir.chmod(0o755)
    (suite_dir / "toy_suite.py").write_text(SUITE)
    monkeypatch.syspath_prepend(str(suite_dir))
    monkeypatch.setenv("PYTHONPATH", str(suite_dir))
    monkeypatch.delenv("AUTOGRADER_SUBMISSION", raising=False)

    def make(text=SOLUTION, name="sub"):
        make.folder = tmp_path / name
        folder = tmp_path / name
        folder.mkdir()
        (folder / "toy.py").write_text(textwrap.dedent(text))
        return folder
    make.marker = f"TOY_RUN=toy-{uuid.uuid4().hex}"
    monkeypatch.setenv(*make.marker.split("="))
    yield make
    for pid in processes_with(make.marker):  # a failed test must not leave its processes running
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(suite_dir)


def outcomes(results):
    return {r.check.name: r.outcome for r in results}


def reasons(results):
    return {r.check.name: r.reason for r in results}


def test_solution_passes_and_gpu_group_is_not_run(make_submission):
    results = grade_assignment(MANIFEST, make_submission(), "cpu")
    assert outcomes(results) == {"adds": "passed", "multiplies": "passed", "ranks add": "passed",
                                 "no forbidden sum at run time": "passed", "fast on gpu": "not_run"}, reasons(results)
    assert exit_code(results) == 3
    payload = to_gradescope(results, device="cpu", elapsed=1.0)
    assert payload["score"] == 4 and payload["max_score"] == 4 and payload["extra_data"]["incomplete"]  # GPU: pending
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
        Group("main", "toy_suite:group_main", trusted=False, timeout_s=12, checks=MANIFEST.groups[0].checks),)})
    start = time.monotonic()
    results = grade_assignment(short, make_submission(looping), "cpu")
    assert time.monotonic() - start < 30
    assert outcomes(results) == {"adds": "passed", "multiplies": "timeout", "ranks add": "timeout"}
    assert processes_with(make_submission.marker) == []


DETACHING = SOLUTION.replace("return a + b", textwrap.dedent('''\
    import os
    if os.fork() == 0:  # double fork, new session: no longer in the group's process group
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", "300"])
        os._exit(0)
    os.wait()
    return a + b''').replace("\n", "\n    "))


def test_a_detached_grandchild_dies_with_its_group_and_only_its_group(make_submission):
    """Graded beside a clean solution (the selftest grades two at once): the clean-up of one group
    must not touch the other's processes (its ranks would fail)."""
    detaching, clean = make_submission(DETACHING, "detaching"), make_submission(SOLUTION, "clean")
    with ThreadPoolExecutor(max_workers=2) as pool:
        graded = list(pool.map(lambda folder: grade_assignment(MANIFEST, folder, "cpu", groups=("main",)),
                               (detaching, clean)))
    assert [set(outcomes(r).values()) for r in graded] == [{"passed"}, {"passed"}], [reasons(r) for r in graded]
    assert processes_with(make_submission.marker) == []


def test_only_the_manifest_files_are_graded(make_submission):
    folder = make_submission()
    (folder / "helper.py").write_text("from scaletrain.comm.ring import *\n")
    (folder / "scaletrain").mkdir()
    (folder / "scaletrain" / "__init__.py").write_text("raise ImportError('the fake scaletrain was imported')\n")
    assert ignored_files(MANIFEST, folder) == ["helper.py", "scaletrain/"]
    with_extras = grade_assignment(MANIFEST, folder, "cpu")
    shutil.rmtree(folder / "scaletrain")
    (folder / "helper.py").unlink()
    alone = grade_assignment(MANIFEST, folder, "cpu")
    assert outcomes(with_extras) == outcomes(alone) and "fast on gpu" in outcomes(alone), \
        (reasons(with_extras), reasons(alone))
    assert set(outcomes(alone).values()) == {"passed", "not_run"}, reasons(alone)


def test_a_helper_module_next_to_the_submission_cannot_be_imported(make_submission):
    folder = make_submission("import helper\n" + SOLUTION)
    (folder / "helper.py").write_text("")
    results = grade_assignment(MANIFEST, folder, "cpu", groups=("main",))
    assert set(outcomes(results).values()) == {"error"}
    assert "No module named 'helper'" in results[0].reason and "toy.py:1" in results[0].reason


def toy(*groups):
    return Manifest(**{**MANIFEST.__dict__, "groups": groups})


SANDBOXED = toy(Group("sandboxed", "toy_suite:group_sandboxed", trusted=False, timeout_s=60, checks=(
    Check("1", "runs in its own folder, as the sandbox user", 1), Check("1", "names its folder", 1))))


def test_group_runs_in_its_own_folder_which_is_removed(make_submission):
    results = grade_assignment(SANDBOXED, make_submission(), "cpu")
    assert outcomes(results)["runs in its own folder, as the sandbox user"] == "passed", results[0].reason
    folder = Path(reasons(results)["names its folder"])
    assert folder.name == "work" and folder.parent.name.startswith("grade-a99-") and not folder.parent.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run a group as another user")
def test_group_runs_as_the_sandbox_user(make_submission, monkeypatch):
    account = sandbox.worker_account()
    if account is None:
        pytest.skip(f"no sandbox user here: {sandbox.describe()}")
    monkeypatch.setenv("TOY_EXPECT_UID", str(account.pw_uid))
    results = grade_assignment(SANDBOXED, make_submission(), "cpu")
    assert outcomes(results)["runs in its own folder, as the sandbox user"] == "passed", results[0].reason


def test_huge_messages_make_a_small_results_json(make_submission):
    loud = toy(Group("loud", "toy_suite:group_loud", trusted=False, timeout_s=60, checks=(
        Check("1", "huge message", 1), Check("1", "after the exit", 1))))
    results = grade_assignment(loud, make_submission(), "cpu")
    assert outcomes(results) == {"huge message": "failed", "after the exit": "error"}
    assert "exited with code 3" in reasons(results)["after the exit"]
    assert all(len(r.reason) <= 2000 for r in results)
    assert len(json.dumps(to_gradescope(results, device="cpu", elapsed=1.0))) < 20_000


def test_bad_report_lines_are_errors_of_their_check_never_a_crash(tmp_path):
    from autograder.runner import read_report
    line = lambda name, outcome="passed", reason="", **kw: json.dumps(
        {"name": name, "outcome": outcome, "reason": reason, "duration": 0.5, **kw})
    report = tmp_path / "report.jsonl"
    report.write_text("\n".join([
        line("fine"), "not json at all", '["a", "list"]', line("no such check"),
        line("odd outcome", "excellent"), line("huge", reason="x" * 5_000_000), line("twice", "failed"),
        line("twice"), line("no duration", duration="soon"), line("cut")[:30], "[" * 10_000]) + "\n")
    names = ["fine", "odd outcome", "huge", "twice", "no duration", "cut", "never reported"]
    got = read_report(report, names)
    assert got["fine"] == ("passed", "", 0.5) and "never reported" not in got
    assert {name: outcome for name, (outcome, _, _) in got.items() if name != "fine"} == dict.fromkeys(
        ["odd outcome", "huge", "twice", "no duration", "cut"], "error")
    assert "excellent" in got["odd outcome"][1] and "too long" in got["huge"][1]
    assert all(len(reason) < 3000 for _, reason, _ in got.values())


def test_grade_all_survives_one_broken_assignment(tmp_path, monkeypatch):
    from argparse import Namespace
    from autograder import cli
    from autograder.manifest import REPO
    from autograder.runner import Result

    def fake(m, folder, device, **kw):
        if m.assignment == "a2":
            raise RuntimeError("harness bug " + "x" * 50_000_000)
        return [Result(m.assignment, c, "passed", "") for c in m.checks]
    monkeypatch.setattr(cli, "grade_assignment", fake)
    out = tmp_path / "results.json"
    code = cli.cmd_grade(Namespace(assignment="all", submission=str(REPO / "solutions"), json=str(out), device="cpu"))
    payload = json.loads(out.read_text())
    by_outcome = {}
    for t in payload["tests"]:
        by_outcome.setdefault(t["extra_data"]["outcome"], set()).add(t["name"].split()[0])
    others = {m for m in all_manifests() if m != "a2"}
    assert code == 2 and by_outcome == {"passed": others, "error": {"a2"}}
    assert "a2: RuntimeError: harness bug" in payload["extra_data"]["harness_error"]
    assert out.stat().st_size < 200_000


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
    assert outcomes(results)["adds"] == "error" and exit_code(results) == 2
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


def test_checks_reported_from_ranks_get_the_time_of_their_spawn(tmp_path):
    from autograder.context import GroupContext
    report = tmp_path / "report.jsonl"
    ctx = GroupContext("g", ["first", "second", "third"], tmp_path, "cpu", report)
    time.sleep(0.3)  # the spawn
    ctx.report_ranks(["first", "second"], [{"first": None, "second": None}])
    with ctx.check("third"):
        time.sleep(0.1)
    durations = {r["name"]: r["duration"] for r in map(json.loads, report.read_text().splitlines())}
    assert durations["first"] >= 0.3 and durations["second"] >= 0.3
    assert 0.1 <= durations["third"] < 0.3  # a check block's own time, not the time since the spawn


def test_the_grader_parses_python_only_under_the_thread_lock():
    """selftest grades in threads and CPython 3.11's ast.parse is not thread-safe
    (python/cpython#106905): every parse in autograder/ goes through pyparse.parse_python."""
    direct = [f"{p.relative_to(REPO)}:{i}" for p in sorted((REPO / "autograder").rglob("*.py"))
              if p.name != "pyparse.py"
              for i, line in enumerate(p.read_text().splitlines(), 1) if "ast.parse(" in line]
    assert not direct, f"call autograder.pyparse.parse_python instead of ast.parse at {direct}"
