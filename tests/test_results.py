"""results.json and the score table: a check that was not run is pending, never failed; the
console speaks the README's outcome names; times are passed through; `--device cuda` without a
GPU is a clear input error that still writes results.json."""

import json
import os
import stat
import subprocess
import sys

import pytest
import torch

from autograder.manifest import Check
from autograder.results import UnsafeDestination, from_gradescope, summarize, table, to_gradescope, write_json
from autograder.runner import Result

from toy_manifest import ADDS, FAST, MULTIPLIES, TOY  # tests/ is on sys.path


def results(gpu_outcome="not_run"):
    return [Result("a9", ADDS, "passed", "", 1.23456),
            Result("a9", MULTIPLIES, "failed", "mul(2, 3) returned 5", 0.5),
            Result("a9", FAST, gpu_outcome, "needs a CUDA GPU; none on this machine", 0.0)]


def test_not_run_is_pending_not_lost():
    payload = to_gradescope(results(), device="cpu", elapsed=12.3456)
    fast = payload["tests"][2]
    assert fast["score"] == 0 and fast["max_score"] == 0 and fast["status"] == "passed"
    assert fast["output"].startswith("pending: 2 points, graded on a GPU machine")
    assert "pending" in fast["name"]
    assert fast["extra_data"]["outcome"] == "not_run" and fast["extra_data"]["pending_points"] == 2
    # Gradescope adds the tests up: the pending check adds nothing to the score or its maximum
    assert payload["max_score"] == 5 == sum(t["max_score"] for t in payload["tests"])
    assert payload["score"] == 3 == sum(t["score"] for t in payload["tests"])
    assert payload["extra_data"]["pending_points"] == 2 and payload["extra_data"]["incomplete"]
    assert [t["status"] for t in payload["tests"]] == ["passed", "failed", "passed"]


def test_gpu_run_counts_every_check():
    payload = to_gradescope(results("failed"), device="cuda", elapsed=1.0)
    assert payload["max_score"] == 7 and payload["tests"][2]["status"] == "failed"
    assert payload["extra_data"]["pending_points"] == 0 and not payload["extra_data"]["incomplete"]
    assert "pending" not in payload["output"]


def test_times_are_passed_through_and_rounded():
    payload = to_gradescope(results(), device="cpu", elapsed=12.3456)
    assert payload["execution_time"] == 12.35
    assert [t["extra_data"]["duration_s"] for t in payload["tests"]] == [1.235, 0.5, 0.0]


def test_table_and_summary_use_the_readme_outcomes():
    text = table(results())
    rows = {line.split("  ")[1].strip(): line for line in text.splitlines()[2:]}
    assert " passed " in rows["adds"] and "3/3" in rows["adds"]
    assert " failed " in rows["multiplies"] and "0/2" in rows["multiplies"] and "returned 5" in rows["multiplies"]
    assert " not_run " in rows["fast on gpu"] and "-/2 pending" in rows["fast on gpu"]
    assert not any(word in text.split() for word in ("ok", "FAIL", "ERROR"))
    assert summarize(results()) == ("score 3 / 5 graded here (1 passed, 1 failed, 1 not_run); "
                                    "2 points pending: need a GPU")
    assert summarize(results("passed")) == "score 5 / 7 (2 passed, 1 failed)"


def test_results_json_reads_back(tmp_path):
    other = Result("a8", Check("8.1", "adds", 1), "passed", "", 0.1)
    path = tmp_path / "out" / "results.json"
    write_json(path, to_gradescope([*results(), other], device="cpu", elapsed=2.0))
    back = from_gradescope(json.loads(path.read_text()), TOY)
    assert back == [Result("a9", ADDS, "passed", "", 1.235), *results()[1:]]
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]  # no temporary file left


def test_from_gradescope_skips_checks_the_manifest_lacks():
    payload = to_gradescope(results(), device="cpu", elapsed=1.0)
    payload["tests"][0]["extra_data"]["check"] = "a check that was renamed"
    assert [r.check for r in from_gradescope(payload, TOY)] == [MULTIPLIES, FAST]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the machine without a CUDA device")
@pytest.mark.parametrize("command", (["grade", "a0", "--device", "cuda"],
                                     ["regrade", "a0", "--submissions", "solutions", "--device", "cuda"]))
def test_device_cuda_without_gpu_is_an_input_error(tmp_path, command):
    out = tmp_path / "results.json"
    extra = ["--json", str(out)] if command[0] == "grade" else ["--out", str(tmp_path / "class")]
    proc = subprocess.run([sys.executable, "-m", "autograder", *command, *extra],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA device visible: run on a GPU machine or use --device auto/cpu" in proc.stderr
    if command[0] == "grade":
        payload = json.loads(out.read_text())
        assert "no CUDA device visible" in payload["extra_data"]["harness_error"] and payload["tests"] == []
    else:
        assert not (tmp_path / "class").exists()


def test_results_are_never_written_through_a_planted_fifo_or_link(tmp_path):
    """A FIFO (the grader would block or feed a reader) or a link (the grader would write where it
    points) at the destination is refused; a regular file is replaced whole; no temporary is left."""
    target = tmp_path / "elsewhere.json"
    target.write_text("untouched")
    fifo, link, plain = tmp_path / "fifo.json", tmp_path / "link.json", tmp_path / "plain.json"
    os.mkfifo(fifo)
    link.symlink_to(target)
    plain.write_text("old")
    for planted in (fifo, link):
        with pytest.raises(UnsafeDestination, match="not a regular file"):
            write_json(planted, {"score": 100})
    assert target.read_text() == "untouched" and stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink()
    write_json(plain, {"score": 1})
    assert json.loads(plain.read_text()) == {"score": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.json", "fifo.json", "link.json", "plain.json"]
