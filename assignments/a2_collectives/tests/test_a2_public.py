"""Public tests of a2: your ring against one process summing every rank's input, on 3 gloo ranks.

Inputs are small integers, so every partial sum is exact in every dtype and your ring must match
bit for bit, whatever order it adds in. Each test spawns 3 ranks (a few seconds). The grader runs
more, on 3 ranks too: hidden sizes and dtypes, a subgroup {0, 2} whose ring skips rank 1, a count
of the bytes really handed to isend, collectives patched to fail inside your calls; and the speed
checks on 2 ranks (2 GPUs for NCCL). One task alone:
`pytest assignments/a2_collectives -m task2_1`.
"""

import pytest
import torch

from autograder.checks import student_module
from scaletrain.comm.counter import comm_counter
from scaletrain.launch import spawn

P = 3
SIZES = (0, 1, 2, 3, 4, 10, 1001)  # empty, fewer elements than ranks, not divisible by 3
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64)


def _ring():
    return student_module("ring", default=__file__)


def _data(rank, n, dtype):
    g = torch.Generator().manual_seed(100 * rank + n)
    return torch.randint(-8, 9, (n,), generator=g).to(dtype)


def _sum(n, dtype):
    return sum(_data(r, n, dtype).double() for r in range(P)).to(dtype)


def _shard(total, rank):
    m = -(-total.numel() // P)  # ceil(n / p): padding at the end, as in the docstring
    return torch.cat([total, total.new_zeros(P * m - total.numel())])[rank * m:(rank + 1) * m]


def _rank_reduce_scatter(rank, p):
    ring = _ring()
    for dtype in DTYPES:
        for n in SIZES:
            x = _data(rank, n, dtype)
            got = ring.ring_reduce_scatter(x)
            assert torch.equal(got, _shard(_sum(n, dtype), rank)), f"rank {rank}: shard for n={n} {dtype}: {got}"
            assert torch.equal(x, _data(rank, n, dtype)), "ring_reduce_scatter modified its input"


def _rank_all_gather(rank, p):
    ring = _ring()
    for dtype in DTYPES:
        for n in SIZES:
            got = ring.ring_all_gather(_shard(_sum(n, dtype), rank).clone(), n)
            assert torch.equal(got, _sum(n, dtype)), f"rank {rank}: all-gather of n={n} {dtype}: {got}"


def _rank_allreduce(rank, p):
    ring = _ring()
    for dtype in DTYPES:
        for n in SIZES:
            x = _data(rank, n, dtype)
            with comm_counter() as sent:
                assert ring.ring_allreduce(x) is x, "return the tensor you were given"
            assert torch.equal(x, _sum(n, dtype)), f"rank {rank}: allreduce of n={n} {dtype}: {x}"
            m, itemsize = -(-n // P), x.element_size()
            want = (2 * (P - 1) * m * itemsize, 2 * (P - 1)) if n else (0, 0)
            assert (sent.bytes_sent, sent.messages) == want, (
                f"n={n} {dtype}: record_send saw {sent.bytes_sent} bytes in {sent.messages} messages, "
                f"expected {want[0]} in {want[1]} (one record_send of the chunk's bytes per ring step)")
    y = _data(rank, 12, torch.float32).view(3, 4).t()  # not contiguous: the result must land in y
    ring.ring_allreduce(y, op="avg")
    assert torch.equal(y, (_sum(12, torch.float32) / P).view(3, 4).t()), "avg of a transposed matrix"


@pytest.mark.task2_1
def test_task2_1_reduce_scatter_equals_the_sum():
    spawn(_rank_reduce_scatter, P, timeout_s=60)


@pytest.mark.task2_2
def test_task2_2_all_gather_reassembles_the_shards():
    spawn(_rank_all_gather, P, timeout_s=60)


@pytest.mark.task2_3
def test_task2_3_allreduce_in_place_with_the_ring_byte_count():
    spawn(_rank_allreduce, P, timeout_s=60)


def _rank_speed(rank, p):
    import torch.distributed as dist

    from scaletrain.bench import compare
    ring = _ring()
    n = 16 * 2**20 // 4
    c = compare(ring.ring_allreduce, dist.all_reduce, setup=lambda: (torch.ones(n),), warmup=2, reps=7,
                group=dist.group.WORLD)
    return c.ratio


@pytest.mark.task2_4
def test_task2_4_allreduce_speed_against_gloo():
    """The grader's check: within 1.5x of gloo's time at 16 MiB on 2 ranks (a busy machine adds noise:
    the median of 7 alternating pairs; rerun on a quiet machine before you optimize further)."""
    ratio = spawn(_rank_speed, 2, timeout_s=120)[0]
    print(f"your ring / gloo all_reduce at 16 MiB, p=2: {ratio:.2f}x")
    assert ratio < 1.5, f"{ratio:.2f}x gloo's time: segment the chunks, keep two segments in flight, reuse buffers"
