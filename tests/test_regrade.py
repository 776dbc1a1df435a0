"""Class-wide regrade: both folder layouts, resuming, a broken submission that doesn't stop the
class, and the merge of a CPU run with a GPU run. The end-to-end test grades three real a0
submissions (solution, untouched stub, one planted breakage) on this machine."""

import csv
import json
import shutil
import subprocess
import sys
import time

import pytest

from autograder.manifest import get_manifest
from autograder.regrade import find_submissions, gradescope_names, merge, regrade
from autograder.runner import Result

from toy_manifest import ADDS, FAST, MULTIPLIES, TOY  # tests/ is on sys.path

METADATA = """\
submission_101:
  :submitters:
  - :name: Solo Student
    :sid: '100'
    :email: solo@example.edu
  :created_at: 2026-11-20 10:00:00.000000000 -08:00
  :score: 0.0
submission_202:
  :submitters:
  - :name: 'Pair O''Neil'
    :email: one@example.edu
  - :name: "Pair Two"
    :email: two@example.edu
  :results:
    tests:
    - name: not a submitter
"""


def read_csv(path):
    with open(path, newline="") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def test_merge_takes_gpu_groups_from_the_gpu_run():
    cpu = [Result("a9", ADDS, "passed", ""), Result("a9", MULTIPLIES, "failed", "wrong"),
           Result("a9", FAST, "not_run", "needs a CUDA GPU")]
    gpu = [Result("a9", FAST, "passed", ""), Result("a9", ADDS, "failed", "must not be taken from the GPU run")]
    assert merge(TOY, cpu, gpu) == [cpu[0], cpu[1], gpu[0]]
    with pytest.raises(KeyError, match="fast on gpu"):
        merge(TOY, cpu, [])


def test_gradescope_names_reads_submitters_only():
    assert gradescope_names(METADATA) == {"submission_101": "Solo Student",
                                          "submission_202": "Pair O'Neil + Pair Two"}


def test_find_submissions_in_both_layouts(tmp_path):
    for name in ("bob", "alice", ".git", "__MACOSX"):
        (tmp_path / "plain" / name).mkdir(parents=True)
    (tmp_path / "plain" / "notes.txt").write_text("not a submission")
    assert [(s.key, s.student) for s in find_submissions(tmp_path / "plain")] == [("alice", "alice"), ("bob", "bob")]
    export = tmp_path / "export"
    for name in ("submission_101", "submission_202", "submission_303"):
        (export / name).mkdir(parents=True)
    (export / "submission_metadata.yml").write_text(METADATA)
    assert [(s.key, s.student) for s in find_submissions(export)] == [
        ("submission_101", "Solo Student"), ("submission_202", "Pair O'Neil + Pair Two"),
        ("submission_303", "submission_303")]


@pytest.fixture
def fake_grader(monkeypatch):
    """grade_assignment without subprocesses: every requested check passes where it can run;
    the folder named 'broken' makes the grader itself crash."""
    calls = []

    def fake(manifest, folder, device, *, groups=(), **_):
        calls.append((folder.name, device, groups))
        if folder.name == "broken":
            raise RuntimeError("the grader fell over")
        return [Result(manifest.assignment, c, "not_run" if g.needs_gpu and device != "cuda" else "passed",
                       "", 0.25) for g in manifest.groups if not groups or g.name in groups for c in g.checks]

    monkeypatch.setattr("autograder.regrade.grade_assignment", fake)
    return calls


def test_cpu_run_then_gpu_run_merges_and_records_sources(tmp_path, fake_grader):
    subs = tmp_path / "subs"
    for name in ("alice", "broken"):
        (subs / name).mkdir(parents=True)
    lines = []
    payloads = regrade(TOY, subs, tmp_path / "cpu", "cpu", progress=lines.append)
    assert lines[0].startswith("[1/2] alice: 5/5, 2 pending (") and "GRADER ERROR" in lines[1]
    assert payloads[1]["extra_data"]["harness_error"] == "RuntimeError: the grader fell over"
    assert {t["extra_data"]["outcome"] for t in payloads[1]["tests"]} == {"error"}
    rows = read_csv(tmp_path / "cpu" / "scores.csv")
    assert (rows["alice"]["total"], rows["alice"]["max_total"], rows["alice"]["pending"]) == ("5", "5", "2")
    assert (rows["broken"]["total"], rows["broken"]["error"]) == ("0", "3")

    (subs / "carol").mkdir()  # submitted late: no CPU results to merge with
    fake_grader.clear()
    payloads = regrade(TOY, subs, tmp_path / "gpu", "cuda", cpu_results=tmp_path / "cpu")
    assert fake_grader == [("alice", "cuda", ("gpu",)), ("broken", "cuda", ("main", "gpu")),
                           ("carol", "cuda", ("main", "gpu"))]
    alice = payloads[0]
    assert [t["extra_data"]["run"] for t in alice["tests"]] == ["cpu", "cpu", "cuda"]
    assert alice["extra_data"]["cpu_results"] == str(tmp_path / "cpu" / "alice" / "results.json")
    assert alice["score"] == alice["max_score"] == 7 and alice["extra_data"]["pending_points"] == 0
    assert [t["extra_data"]["run"] for t in payloads[2]["tests"]] == ["cuda"] * 3
    rows = read_csv(tmp_path / "gpu" / "scores.csv")
    assert (rows["alice"]["task 9.1"], rows["alice"]["task 9.2"], rows["alice"]["total"]) == ("5", "2", "7")

    fake_grader.clear()
    regrade(TOY, subs, tmp_path / "gpu", "cuda", cpu_results=tmp_path / "cpu")
    assert [call[0] for call in fake_grader] == ["broken"]  # resumed: only the unfinished one again


def test_gpu_run_merges_into_the_cpu_runs_own_folder(tmp_path, fake_grader):
    (tmp_path / "subs" / "alice").mkdir(parents=True)
    regrade(TOY, tmp_path / "subs", tmp_path / "out", "cpu")
    payload, = regrade(TOY, tmp_path / "subs", tmp_path / "out", "cuda", cpu_results=tmp_path / "out")
    assert fake_grader[-1] == ("alice", "cuda", ("gpu",))
    assert payload["extra_data"]["device"] == "cuda" and payload["score"] == payload["max_score"] == 7
    assert json.loads((tmp_path / "out" / "alice" / "results.json").read_text()) == payload


def _class_folder(root):
    """The solution, the untouched stub and the 'forgets the fp32 master copy' plant, as submitted."""
    m = get_manifest("a0")
    plant = next(p for p in m.planted if "fp32 master copy" in p.name)
    for name in ("solution", "stub", "planted"):
        (root / name).mkdir(parents=True)
    shutil.copy(m.solution_dir() / "memory.py", root / "solution")
    shutil.copy(m.stub_dir() / "memory.py", root / "stub")
    (root / "planted" / plant.file).write_text(plant.apply((m.solution_dir() / plant.file).read_text()))
    return m, plant


@pytest.mark.slow
def test_regrade_a0_class_resumes(tmp_path):
    m, plant = _class_folder(tmp_path / "subs")
    cmd = [sys.executable, "-m", "autograder", "regrade", "a0", "--submissions", str(tmp_path / "subs"),
           "--out", str(tmp_path / "out"), "--device", "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = read_csv(tmp_path / "out" / "scores.csv")
    points = {c.name: c.points for c in m.checks}
    lost = sum(points[name] for name, outcome in plant.expect.items() if outcome != "passed")
    assert rows["solution"]["total"] == rows["solution"]["max_total"] == f"{m.max_score:g}"
    assert rows["stub"]["total"] == "0" and rows["stub"]["failed"] == str(len(m.checks))
    assert rows["planted"]["total"] == f"{m.max_score - lost:g}" and rows["planted"]["failed"] == "1"
    assert rows["planted"]["task 0.2"] == f"{sum(c.points for c in m.checks if c.task == '0.2') - lost:g}"
    assert all(float(row["seconds"]) > 0.1 for row in rows.values()), rows  # measured grading times, not 0.0
    payload = json.loads((tmp_path / "out" / "planted" / "results.json").read_text())
    assert payload["extra_data"]["student"] == "planted" and payload["score"] == m.max_score - lost
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    assert [line.split(" (")[0] for line in progress] == [
        f"[1/3] planted: {m.max_score - lost:g}/100", "[2/3] solution: 100/100", "[3/3] stub: 0/100"]

    start = time.monotonic()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stderr.count("kept from an earlier run") == 3, again.stderr
    assert time.monotonic() - start < 20
    assert read_csv(tmp_path / "out" / "scores.csv") == rows


@pytest.mark.slow
def test_regrade_gradescope_export_layout(tmp_path):
    m = get_manifest("a0")
    export = tmp_path / "export"
    (export / "submission_101" / m.folder).mkdir(parents=True)  # files one folder down, as in solutions/
    (export / "submission_101" / m.folder / "memory.py").write_text("def mfu(*,,\n")
    (export / "submission_202").mkdir()                           # uploaded nothing
    (export / "submission_metadata.yml").write_text(METADATA)
    payloads = regrade(m, export, tmp_path / "out", "cpu")
    rows = read_csv(tmp_path / "out" / "scores.csv")
    assert set(rows) == {"Solo Student", "Pair O'Neil + Pair Two"}
    assert rows["Solo Student"]["submission"] == "submission_101"
    assert rows["Solo Student"]["error"] == rows["Pair O'Neil + Pair Two"]["error"] == str(len(m.checks))
    assert "syntax error" in payloads[0]["tests"][0]["output"]
    assert "is missing from" in payloads[1]["tests"][0]["output"]
    assert (tmp_path / "out" / "submission_202" / "results.json").is_file()
