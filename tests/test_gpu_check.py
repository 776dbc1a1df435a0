"""`make gpu-check` (autograder/gpu_check.py): on a CPU it runs nothing and says so; its report
reads pytest's junit XML and the grader's results.json faithfully and says FAIL on any failure.
The GPU path itself runs only where a GPU is (issue 18, item 7)."""

import pytest
import torch

from autograder import gpu_check

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
            "kernels": [row]}


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
