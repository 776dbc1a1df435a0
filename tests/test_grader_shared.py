"""The pieces every rank suite shares (autograder/checks.py, autograder/probes/common.py): which
failure a job's ranks report, the tensor comparison, and a job's error as data."""

from __future__ import annotations

import pytest
import torch

from autograder import checks
from autograder.probes.common import job_error


def _jobs_by_name(names, errors):
    jobs = [{"name": n, "t": len(errors)} for n in names]
    return jobs, [{n: ({"error": e} if e else {"ok": {}}) for n, e in zip(names, per)} for per in errors]


def test_a_ranks_own_error_wins_over_its_peers_timeout():
    jobs, per_rank = _jobs_by_name(["a", "b"], [[None, ["TimeoutError", "rank 0: timed out"]],
                                                [None, ["KeyError", "rank 1: 'x'"]]])
    got = checks.rank_failure(jobs, per_rank)
    assert isinstance(got, checks.StudentCrash) and "KeyError" in str(got)
    jobs, per_rank = _jobs_by_name(["a"], [[["TimeoutError", "rank 0: timed out"]], [["TimeoutError", "rank 1"]]])
    assert isinstance(checks.rank_failure(jobs, per_rank), TimeoutError)
    jobs, per_rank = _jobs_by_name(["a"], [[None], [None]])
    assert checks.rank_failure(jobs, per_rank) is None


def test_a_transport_error_loses_to_the_rank_that_caused_it_and_idle_ranks_are_not_read():
    jobs, per_rank = _jobs_by_name(["a"], [[["RuntimeError", "rank 0: gloo/transport: Connection closed"]],
                                           [["AssertionError", "rank 1: wrong shard"]]])
    got = checks.rank_failure(jobs, per_rank)
    assert isinstance(got, AssertionError) and "wrong shard" in str(got)
    jobs = [{"name": "a", "t": 1}]
    assert checks.rank_failure(jobs, per_rank, size_key="t") is not None  # rank 0's own transport error
    assert checks.rank_failure(jobs, [{"a": {"ok": {}}}, per_rank[1]], size_key="t") is None


def test_tensor_close_names_a_freed_tensor_a_dtype_and_an_error():
    want = torch.arange(6, dtype=torch.float32)
    with pytest.raises(AssertionError, match="w: freed"):
        checks.assert_tensor_close(None, want, rtol=1e-5, what="w")
    with pytest.raises(AssertionError, match="dtype"):
        checks.assert_tensor_close(want.double(), want, rtol=1e-5, what="w")
    checks.assert_tensor_close(want.double(), want, rtol=1e-5, what="w", compare_in="float64")
    checks.assert_tensor_close(want.half(), want, rtol=1e-3, what="w", compare_in="actual")
    with pytest.raises(AssertionError, match="relative error"):
        checks.assert_tensor_close(want + 1, want, rtol=1e-5, what="w")


def test_a_jobs_error_is_data_and_a_wait_past_the_timeout_is_a_deadlock(monkeypatch, tmp_path):
    monkeypatch.setenv(checks.SUBMISSION_ENV, str(tmp_path))
    try:
        raise ValueError("bad shard\nsecond line")
    except ValueError as exc:
        assert job_error(exc, 2) == {"error": ["ValueError", "rank 2: bad shard"]}
    assert job_error(RuntimeError("Timed out waiting 5000ms"), 0)["error"][0] == "TimeoutError"
