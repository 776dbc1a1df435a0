"""`make gpu-check` (autograder/gpu_check.py): on a CPU it runs nothing and says so; its report
reads pytest's junit XML and the grader's results.json faithfully and says FAIL on any failure.
The GPU path itself runs only where a GPU is (issue 18, item 7).  As a GPU machine comes (issue
29: no network, its own CUDA torch, no nbval): it installs nothing, picks the interpreter whose
torch sees a GPU, overrides the addopts that name nbval, regrades a class with --cpu-results, and
names the versions that ran beside the pins; all of which is checked here without a GPU."""

import json
import os
import subprocess
import sys

import pytest
import torch

from autograder import gpu_check
from autograder.manifest import REPO, get_manifest

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.test_kernels_cuda" name="test_softmax[fp32]" time="0.1"/>
<testcase classname="tests.test_kernels_cuda" name="test_layer_norm[bf16]" time="0.1"><failure message="x">boom</failure></testcase>
<testcase classname="tests.test_kernels_cuda" name="test_build" time="0.1"><error message="y">crash</error></testcase>
<testcase classname="tests.test_pipeline_executor" name="test_nccl" time="0.0"><skipped message="2 GPUs"/></testcase>
</testsuite></testsuites>"""


def _report(grade_outcome="passed"):
    row = {"op": "softmax fwd", "N": 4096, "backend": "triton", "median ms": 0.02, "p20 ms": 0.02, "p80 ms": 0.03,
           "GB/s": 2900.0, "% peak": 87.0, "x naive": 4.1, "x native": 1.1, "x native p20-p80": "1.05-1.15"}
    return {"machine": {"gpu": "NVIDIA H100", "peak GB/s": 3350.0}, "tests_exit": 0,
            "tests": [{"test": "tests.test_kernels_cuda::test_softmax[fp32]", "outcome": "passed"}],
            "grade_exit": 0 if grade_outcome == "passed" else 1,
            "grade": [{"assignment": "a1", "task": "1.1", "check": "Triton softmax forward speed", "outcome": grade_outcome,
                       "reason": "2900 GB/s, 4.10x naive, 1.10x native"}],
            "kernels": [row], "class": _class(), "class_exit": 0}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: this machine has a GPU")
def test_on_a_cpu_it_runs_nothing_and_exits_0(tmp_path, capsys):
    assert gpu_check.main(str(tmp_path / "out")) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_junit_outcomes_per_test(tmp_path):
    (tmp_path / "j.xml").write_text(JUNIT)
    rows = gpu_check.junit_outcomes(tmp_path / "j.xml")
    assert [r["outcome"] for r in rows] == ["passed", "failed", "error", "skipped"]
    assert rows[1]["test"] == "tests.test_kernels_cuda::test_layer_norm[bf16]"


def test_grade_rows_come_from_results_json():
    payload = {"tests": [{"output": "2.1x naive", "extra_data": {"assignment": "a1", "task": "1.1", "check": "speed",
                                                                   "outcome": "passed"}}]}
    assert gpu_check.gpu_grades(payload) == [{"assignment": "a1", "task": "1.1", "check": "speed",
                                              "outcome": "passed", "reason": "2.1x naive"}]


def test_report_says_pass_only_when_everything_passed():
    good, bad = _report(), _report("failed")
    assert gpu_check.passed(good) and gpu_check.render(good).startswith("# GPU check: PASS")
    text = gpu_check.render(bad)
    assert not gpu_check.passed(bad) and text.startswith("# GPU check: FAIL")
    assert "a1 Triton softmax forward speed: failed" in text and "2900" in text and "NVIDIA H100" in text
    assert not gpu_check.passed({**good, "tests": []}), "no gpu test ran: not a pass"
    assert not gpu_check.passed({**good, "grade": []}), "nothing graded: not a pass"
    broken = {**good, "kernels": [], "kernels_error": "RuntimeError: CUDA error"}
    assert not gpu_check.passed(broken) and "failed: RuntimeError: CUDA error" in gpu_check.render(broken)


def test_a_check_not_run_for_a_second_gpu_is_listed_not_failed():
    """a2's NCCL ring needs 2 GPUs: on one GPU its check is not_run and the rest can still PASS; a
    check not run for any other reason (e.g. no CUDA seen by the worker) is a FAIL."""
    good = _report()
    nccl = {"assignment": "a2", "task": "2.5", "check": "allreduce vs NCCL", "outcome": "not_run",
            "reason": "needs 2 GPUs, found 1"}
    assert gpu_check.passed({**good, "grade": good["grade"] + [nccl]})
    assert "a2 allreduce vs NCCL: not_run" in gpu_check.render({**good, "grade": good["grade"] + [nccl]})
    no_cuda = {**nccl, "assignment": "a1", "reason": "needs a CUDA GPU; none on this machine"}
    assert not gpu_check.passed({**good, "grade": good["grade"] + [no_cuda]})


def test_only_the_assignments_with_a_gpu_group_are_graded_on_the_gpu(tmp_path):
    """Their solutions, with --device cuda, one results.json each; the rest grade the same anywhere."""
    cmds = gpu_check.commands("python3", tmp_path)
    graded = sorted(k.split()[1] for k in cmds if k.startswith("grade "))
    assert graded == sorted(gpu_check.gpu_assignments()) and {"a1", "a1b", "a2"} <= set(graded)
    for a in graded:
        cmd = cmds[f"grade {a}"]
        assert cmd[cmd.index("--submission") + 1] == str(get_manifest(a).solution_dir())
        assert cmd[cmd.index("--device") + 1] == "cuda" and cmd[-1] == str(tmp_path / f"grade-{a}.json")
    assert all(not any(g.needs_gpu for g in get_manifest(a).groups) for a in ("a0", "a3", "a7", "a12"))


def _fake_python(tmp_path, name, cuda):
    """An executable that answers gpu_check.PROBE as an interpreter with (or without) a CUDA torch."""
    answer = {"cuda": cuda, "gpu": "NVIDIA H200" if cuda else None, "torch": "2.11.0+cu130", "torch cuda": "13.0",
              "triton": "3.6.0", "python": "3.12.3", "xdist": True}
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    path.chmod(0o755)
    return str(path)


def test_it_runs_on_the_interpreter_whose_torch_sees_a_gpu_with_the_checkout_on_the_path(tmp_path, monkeypatch):
    """The first candidate with CUDA is exec'd with `-m autograder gpu-check`, PYTHONPATH = lib:., and
    nothing installed (no pip, no venv made)."""
    monkeypatch.delenv(gpu_check.CHILD_ENV, raising=False)
    monkeypatch.setattr(gpu_check, "candidates", lambda: [_fake_python(tmp_path, "cpu", False),
                                                          _fake_python(tmp_path, "gpu", True)])
    seen = {}
    monkeypatch.setattr(os, "execve", lambda path, argv, env: seen.update(path=path, argv=argv, env=env))
    gpu_check.main(str(tmp_path / "out"))
    assert seen["path"] == str(tmp_path / "gpu")
    assert seen["argv"] == [seen["path"], "-m", "autograder", "gpu-check", "--out", str(tmp_path / "out")]
    assert seen["env"]["PYTHONPATH"].split(os.pathsep)[:2] == [str(REPO / "lib"), str(REPO)]
    assert seen["env"][gpu_check.CHILD_ENV] == seen["path"]


def test_the_commands_need_no_nbval_and_regrade_the_gpu_groups_on_the_cpu_run(tmp_path):
    cmds = gpu_check.commands("/opt/torch/.venv/bin/python3", tmp_path, xdist=True)
    tests = cmds["tests"]
    assert tests[:3] == ["/opt/torch/.venv/bin/python3", "-m", "pytest"] and "-o" in tests
    assert tests[tests.index("-o") + 1] == "addopts=" and not any("nbval" in arg for arg in tests)
    assert "--strict-markers" in tests and tests[-1] == "tests" and tests[3:5] == ["-m", "gpu"]
    for a in gpu_check.CLASS:
        cpu, gpu = cmds[f"class {a} cpu"], cmds[f"class {a} cuda"]
        results = str(tmp_path / "class" / a / "results")
        assert cpu[2:5] == ["autograder", "regrade", a] and cpu[-2:] == ["--device", "cpu"]
        assert gpu[-4:] == ["--device", "cuda", "--cpu-results", results] and gpu[gpu.index("--out") + 1] == results
    assert not any("pip" in arg or "install" in arg for cmd in cmds.values() for arg in cmd)


def test_make_gpu_check_sets_nothing_up():
    """No `setup` prerequisite (it pip-installs the pinned stack): the recipe runs gpu-check itself."""
    dry = subprocess.run(["make", "--no-print-directory", "-n", "gpu-check"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)  # under `make test` a sub-make would name its folder
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip().splitlines() == [
        f"PYTHONPATH={REPO}/lib:{REPO} {'.venv/bin/python' if (REPO / '.venv/bin/python').exists() else 'python3'} "
        "-m autograder gpu-check"]


def test_versions_name_what_ran_beside_the_pins():
    pinned = gpu_check.pins()
    assert pinned["torch"] and pinned["triton"] and pinned["numpy"] and pinned["python"].startswith(">=")
    machine = {"torch": "2.11.0+cu130", "triton": "3.6.0", "numpy": "2.5.2", "python": "3.12.3"}  # the lent image's
    rows = {r["package"]: r for r in gpu_check.versions(machine)}
    assert rows["torch"] == {"package": "torch", "ran": "2.11.0+cu130", "pinned": pinned["torch"], "same": False}
    assert rows["numpy"]["ran"] == "2.5.2" and rows["numpy"]["same"] is False
    same = gpu_check.versions({"torch": f"{pinned['torch']}+cu130", "triton": pinned["triton"], "numpy": pinned["numpy"],
                               "python": "3.12.3"})
    assert [r["same"] for r in same] == [True, True, True, None]


def test_the_class_folder_is_the_solution_the_stub_and_one_plant(tmp_path):
    for a, plant_name in gpu_check.CLASS.items():
        m = get_manifest(a)
        root = gpu_check.class_folder(a, tmp_path / a)
        plant = next(p for p in m.planted if p.name == plant_name)
        for file in m.files:
            assert (root / "solution" / file).read_text() == (m.solution_dir() / file).read_text()
            assert (root / "stub" / file).read_text() == (m.stub_dir() / file).read_text()
            changed = (root / "planted" / file).read_text() != (m.solution_dir() / file).read_text()
            assert changed == (file == plant.file), file


def _class(solution="100", stub="0", planted="96", pending="0"):
    (assignment,) = gpu_check.CLASS
    return [{"assignment": assignment, "name": n, "total": t, "max": "100", "pending": pending, "failed": "0"}
            for n, t in (("solution", solution), ("stub", stub), ("planted", planted))]


def test_the_class_passes_only_as_expected_and_is_in_the_report():
    good = {**_report(), "versions": gpu_check.versions({"torch": "2.11.0"})}
    assert gpu_check.passed(good)
    text = gpu_check.render(good)
    assert "regrade --device cpu, then --device cuda --cpu-results" in text and "as expected" in text
    assert "## Versions that ran, beside the pins" in text and "2.11.0" in text
    for bad in (_class(solution="96"), _class(stub="3"), _class(planted="100"), _class(pending="4"), _class()[:2], []):
        assert not gpu_check.passed({**good, "class": bad}), bad
    assert not gpu_check.passed({**good, "class_exit": 1})


def _fake_steps(monkeypatch, tmp_path, cpu_regrade: str, tests: str = "true"):
    """collect() with every step a shell command: `tests` and `cpu_regrade` as given, the rest `true`;
    the machine facts and the kernel rows faked (no GPU here)."""
    from scaletrain.ops import benchmark

    monkeypatch.setattr(gpu_check, "gpu_facts", lambda: {"gpu": "fake", "torch": "2.11.0", "triton": "3.6.0"})
    monkeypatch.setattr(benchmark, "gpu_rows", lambda: [])

    def commands(python, out, *, xdist=False):
        cmds = {name: ["true"] for name in gpu_check.steps() if name != "kernels"}
        cmds["tests"] = ["sh", "-c", tests]
        cmds.update({f"class {a} cpu": ["sh", "-c", cpu_regrade] for a in gpu_check.CLASS})
        return cmds

    monkeypatch.setattr(gpu_check, "commands", commands)


def test_an_assignment_whose_gpu_groups_need_more_gpus_than_here_grades_beside_the_gpu_steps():
    """a2's only GPU group is a 2-GPU NCCL ring: on one GPU its grading does no GPU work."""
    assert gpu_check.beside_gpu_steps(1) == ["a2"]
    assert gpu_check.beside_gpu_steps(2) == [] and gpu_check.beside_gpu_steps(8) == []


def test_the_runner_records_not_run_where_a_group_needs_more_gpus(monkeypatch, tmp_path):
    """No worker starts: every check of the group is not_run, the reason gpu-check lists, not fails."""
    from autograder import runner
    m = get_manifest("a2")
    group = next(g for g in m.groups if g.gpus > 1)
    monkeypatch.setattr(runner, "gpu_count", lambda: 1)
    results = runner.run_group(m, group, tmp_path, "cuda")
    assert [r.outcome for r in results] == ["not_run"] * len(group.checks)
    assert all(gpu_check.wants_more_gpus({"outcome": r.outcome, "reason": r.reason}) for r in results)


def test_a_report_is_written_after_every_step_and_says_incomplete_until_the_last(tmp_path, monkeypatch):
    """A run stopped by a time limit still leaves what it finished; only the full run can PASS."""
    _fake_steps(monkeypatch, tmp_path, cpu_regrade="true")
    seen = []
    gpu_check.collect(tmp_path / "out", save=lambda r: seen.append((list(r["pending"]), gpu_check.render(r))))
    assert [p for p, _ in seen][0] == gpu_check.steps() and seen[-1][0] == []
    assert all(len(a) == len(b) + 1 for (a, _), (b, _) in zip(seen, seen[1:])), "one step finished per save"
    for pending, text in seen[:-1]:
        assert text.startswith("# GPU check: INCOMPLETE") and ", ".join(pending) in text
    assert not seen[-1][1].startswith("# GPU check: INCOMPLETE")


def test_the_class_cpu_regrade_runs_beside_the_gpu_tests(tmp_path, monkeypatch):
    """The tests step waits (up to 30 s) for a file the CPU regrade writes: it only finishes at once
    if the two run at the same time."""
    flag = tmp_path / "cpu-started"
    _fake_steps(monkeypatch, tmp_path, cpu_regrade=f"touch {flag}",
                tests=f"for i in $(seq 300); do [ -e {flag} ] && exit 0; sleep 0.1; done; exit 7")
    report = gpu_check.collect(tmp_path / "out")
    assert report["tests_exit"] == 0 and report["pending"] == []


def test_stopped_half_way_it_leaves_no_regrade_running(tmp_path, monkeypatch):
    """An interrupt after the first step (the device's time limit, ^C) kills the CPU regrade."""
    pid_file = tmp_path / "pid"
    _fake_steps(monkeypatch, tmp_path, cpu_regrade=f"echo $$ > {pid_file}; exec sleep 60",
                tests=f"while [ ! -s {pid_file} ]; do sleep 0.1; done")

    def save(report):
        if "tests" not in report["pending"]:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gpu_check.collect(tmp_path / "out", save=save)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
