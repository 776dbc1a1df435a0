"""Single-process tests of scaletrain.dp: bucket assignment, the Bucket buffer, the trace, bad input."""

from __future__ import annotations

import time

import pytest
import torch

from scaletrain.dp import Bucket, DataParallel, Trace, assign_buckets, make_allreduce
from scaletrain.models import GPT, GPTConfig


def _params(numels, dtypes=None):
    dtypes = dtypes or [torch.float32] * len(numels)
    return [torch.nn.Parameter(torch.zeros(n, dtype=d)) for n, d in zip(numels, dtypes)]


def _nbytes(p):
    return p.numel() * p.element_size()


def _assert_greedy(params, cap, buckets):
    """The properties that define the reverse-order greedy assignment, checked independently."""
    assert [i for b in buckets for i in b] == list(reversed(range(len(params))))
    for b in buckets:
        assert b, "empty bucket"
        assert len(b) == 1 or sum(_nbytes(params[i]) for i in b) <= cap
        assert len({params[i].dtype for i in b}) == 1
    for a, b in zip(buckets, buckets[1:]):  # maximal: the next parameter could not have joined
        same_dtype = params[a[0]].dtype == params[b[0]].dtype
        assert not same_dtype or sum(_nbytes(params[i]) for i in a) + _nbytes(params[b[0]]) > cap


def test_assign_buckets_docstring_example():
    assert assign_buckets(_params([10, 20, 30, 40]), 200) == [[3], [2, 1], [0]]


@pytest.mark.parametrize("seed", range(5))
def test_assign_buckets_is_reverse_greedy_on_random_sizes(seed):
    gen = torch.Generator().manual_seed(seed)
    numels = torch.randint(1, 3000, (int(torch.randint(1, 40, (1,), generator=gen)),), generator=gen)
    params = _params(numels.tolist())
    for cap in (1, 4 * 997, 4 * 5000, 4 * 10**6):
        _assert_greedy(params, cap, assign_buckets(params, cap))


def test_assign_buckets_edge_cases():
    params = _params([5, 7, 3])
    assert assign_buckets(params, 1) == [[2], [1], [0]]       # cap below every parameter
    assert assign_buckets(params, 10**9) == [[2, 1, 0]]        # one bucket
    assert assign_buckets([], 100) == []
    mixed = _params([4, 4, 4, 4], [torch.float32, torch.float32, torch.float64, torch.float32])
    assert assign_buckets(mixed, 10**6) == [[3], [2], [1, 0]]  # a dtype change closes a bucket
    with pytest.raises(ValueError, match="cap_bytes must be > 0"):
        assign_buckets(params, 0)


def test_bucket_layout_views_and_state():
    params = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))]
    bucket = Bucket(index=0, params=params)
    assert bucket.buffer.numel() == 17 and bucket.nbytes == 68 and bucket.offsets == [0, 12]
    bucket.view(0).copy_(params[0])
    bucket.view(1).fill_(2.0)
    assert torch.equal(bucket.buffer[:12], params[0].detach().flatten())
    assert torch.equal(bucket.buffer[12:], torch.full((5,), 2.0))
    assert bucket.pending == 2 and bucket.ready == [False, False] and not bucket.launched
    bucket.launch(lambda t: t.mul_(3))  # a synchronous "allreduce" returning a tensor
    assert bucket.launched and torch.equal(bucket.buffer[12:], torch.full((5,), 6.0))
    bucket.wait(1.0)
    with pytest.raises(RuntimeError, match="launched twice"):
        bucket.launch(lambda t: None)
    bucket.reset()
    assert not bucket.launched and bucket.pending == 2
    with pytest.raises(ValueError, match="share dtype"):
        Bucket(index=1, params=_params([2, 2], [torch.float32, torch.float64]))


def test_wait_on_a_bucket_never_launched_times_out_with_a_clear_message():
    bucket = Bucket(index=3, params=_params([4]))
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="bucket 3 timed out .* never launched"):
        bucket.wait(0.05)
    assert time.monotonic() - start < 2.0


def test_trace_counts_launches_before_the_last_gradient():
    trace = Trace()
    for kind, key in [("grad", 0), ("launch", 0), ("grad", 1), ("launch", 1), ("grad", 2), ("launch", 2)]:
        trace.record(kind, key)
    assert trace.launches_before_last_grad() == 2
    trace.on_done(None, "done", 2)  # synchronous allreduce: done at once
    fut = torch.futures.Future()
    trace.on_done(fut, "done", 7)
    assert [e.key for e in trace.of("done")] == [2]
    fut.set_result(None)
    assert [e.key for e in trace.of("done")] == [2, 7]
    with pytest.raises(KeyError, match="no 'backward_start' event"):
        trace.first("backward_start")


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="bucket_cap_mb must be > 0"):
        DataParallel(GPT(GPTConfig()), bucket_cap_mb=0)
    with pytest.raises(RuntimeError, match="needs a process group"):
        DataParallel(GPT(GPTConfig()))
    with pytest.raises(ValueError, match="allreduce must be one of"):
        make_allreduce("nccl-ish")
