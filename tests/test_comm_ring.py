"""Ring collectives against a single-process reference, on groups of 1-4 ranks inside one spawn
of 4 (each spawn costs seconds: one world with six groups instead of four worlds).

Inputs are small integers stored in each dtype, so every partial sum is exact and the ring must
equal the single-process sum bit for bit, whatever order it adds in.
"""

import pytest
import torch
import torch.distributed as dist

import scaletrain.comm.ring as ring_mod
from scaletrain.comm import comm_counter, ring_all_gather, ring_allreduce, ring_reduce_scatter, shard_numel
from scaletrain.comm.naive import naive_allreduce, simple_ring_allreduce, tree_allreduce
from scaletrain.launch import spawn

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64)


def rank_data(rank: int, n: int, dtype: torch.dtype, shape=None) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + n)
    x = torch.randint(-8, 9, (n,), generator=g).to(dtype)
    return x.view(shape) if shape else x


def reference(ranks, n: int, dtype: torch.dtype) -> torch.Tensor:
    """The sum over `ranks` (global ranks) in float64, in one process: exact for small integers."""
    return sum(rank_data(r, n, dtype).double() for r in ranks).to(dtype)


def sizes_for(p: int) -> list[int]:
    """Empty, one element, around p (n < p leaves ranks with only padding), odd, and not divisible."""
    return sorted({0, 1, max(p - 1, 0), p, p + 1, 5 * p + 2, 4099})


class Ring:
    """The group under test, as every check needs it: members (global ranks), my position, handle."""

    def __init__(self, members, group, rank):
        self.members, self.group, self.rank = members, group, rank
        self.p, self.me = len(members), members.index(rank)


def check_sizes(ring: Ring, ns) -> int:
    p, me, group, checked = ring.p, ring.me, ring.group, 0
    for dtype in DTYPES:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        for n in ns:
            ref, m = reference(ring.members, n, dtype), shard_numel(n, p)
            x = rank_data(ring.rank, n, dtype)
            with comm_counter() as c:
                assert ring_allreduce(x, group=group) is x
            assert torch.equal(x, ref), f"allreduce p={p} n={n} {dtype}"
            sent = 2 * (p - 1) * m * itemsize if n else 0
            assert (c.bytes_sent, c.messages) == (sent, 2 * (p - 1) if sent else 0), (p, n, dtype, c)

            x = rank_data(ring.rank, n, dtype)
            with comm_counter() as c:
                shard = ring_reduce_scatter(x, group=group)
            padded = torch.cat([ref, ref.new_zeros(p * m - n)])
            assert torch.equal(shard, padded[me * m:(me + 1) * m]), f"reduce-scatter p={p} n={n} {dtype}"
            assert torch.equal(x, rank_data(ring.rank, n, dtype)), "reduce-scatter modified its input"
            assert c.bytes_sent == sent // 2 and c.messages == (p - 1 if sent else 0)
            with comm_counter() as c:
                full = ring_all_gather(shard, n, group=group)
            assert torch.equal(full, ref) and c.bytes_sent == sent // 2, f"all-gather p={p} n={n} {dtype}"

            if dtype.is_floating_point and n:
                x = rank_data(ring.rank, n, dtype)
                assert torch.equal(ring_allreduce(x, op="avg", group=group), ref / p), f"avg p={p} n={n} {dtype}"
                assert torch.equal(ring_reduce_scatter(rank_data(ring.rank, n, dtype), op="avg", group=group),
                                   padded[me * m:(me + 1) * m] / p)
            checked += 1
    return checked


def check_layouts(ring: Ring) -> None:
    # non-contiguous: a transposed matrix and a strided slice; the result lands in the caller's memory
    n, group = 7 * 5, ring.group
    ref = reference(ring.members, n, torch.float32).view(7, 5)
    x = rank_data(ring.rank, n, torch.float32, (7, 5)).t()
    assert not x.is_contiguous()
    ring_allreduce(x, group=group)
    assert torch.equal(x, ref.t())
    base = torch.full((2 * n,), -1.0)
    base[::2] = rank_data(ring.rank, n, torch.float32)
    ring_allreduce(base[::2], group=group)
    assert torch.equal(base[::2], ref.view(-1)) and torch.all(base[1::2] == -1.0), "wrote outside the view"
    # many segments per chunk: the pipelined path must give the same bits and the same byte count
    old = ring_mod.SEGMENT_BYTES
    ring_mod.SEGMENT_BYTES = 64
    try:
        n = 1000 * ring.p + 3
        x = rank_data(ring.rank, n, torch.float32)
        with comm_counter() as c:
            ring_allreduce(x, group=group)
        assert torch.equal(x, reference(ring.members, n, torch.float32)), "segmented ring differs"
        assert (c.bytes_sent, c.messages) == ((2 * (ring.p - 1) * shard_numel(n, ring.p) * 4, 2 * (ring.p - 1))
                                             if ring.p > 1 else (0, 0))
        shard = ring_reduce_scatter(rank_data(ring.rank, n, torch.float32), group=group)
        assert torch.equal(ring_all_gather(shard, n, group=group), x), "segmented reduce-scatter/all-gather differ"
    finally:
        ring_mod.SEGMENT_BYTES = old


def check_baselines(ring: Ring) -> None:
    p, n, group = ring.p, 2 * ring.p + 1, ring.group
    ref = reference(ring.members, n, torch.float32)
    x = rank_data(ring.rank, n, torch.float32)
    with comm_counter() as c:
        naive_allreduce(x, group=group)
    assert torch.equal(x, ref), "naive allreduce differs"
    expected = (p - 1) * n * 4 if ring.me == 0 else n * 4  # root broadcasts to all, others send once
    assert c.bytes_sent == (expected if p > 1 else 0), (ring.me, c)
    x = rank_data(ring.rank, n, torch.float32)
    with comm_counter() as c:
        simple_ring_allreduce(x, group=group)
    assert torch.equal(x, ref), "simple ring differs"
    assert c.bytes_sent == (2 * (p - 1) * shard_numel(n, p) * 4) and c.messages == 2 * (p - 1)
    x = rank_data(ring.rank, n, torch.float32, (n, 1)).t()  # non-contiguous too
    with comm_counter() as c:
        tree_allreduce(x, group=group)
    assert torch.equal(x.reshape(-1), ref), "tree allreduce differs"
    # a binomial tree: the root sends once per broadcast round; every other rank sends once up
    # and once per child it feeds in the broadcast
    me = ring.me
    children = sum(1 for k in range(8) if me % (2 << k) == 0 and me + (1 << k) < p)
    assert c.messages == children + (me != 0), (me, p, c)


def check_errors() -> None:
    cases = [(lambda: ring_allreduce(torch.ones(3), op="max"), "op must be one of"),
             (lambda: ring_allreduce(torch.ones(3, dtype=torch.int64), op="avg"), "needs a floating dtype"),
             (lambda: ring_allreduce(torch.ones(3, dtype=torch.bool)), "not supported"),
             (lambda: ring_all_gather(torch.ones(3), 5), r"ceil\(numel/p\) = 2"),
             (lambda: ring_reduce_scatter([1.0, 2.0]), "expected a torch.Tensor")]
    for call, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            call()


# groups of every size inside one world of 4 (one spawn, not four): sizes 1-4, and two whose
# ring neighbours are not consecutive global ranks
GROUPS = ([0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [1, 3], [0, 2, 3])


def run_rank(rank: int, world_size: int) -> dict:
    groups = [dist.new_group(members) for members in GROUPS]  # every rank creates every group
    checked = {}
    for members, group in zip(GROUPS, groups):
        if rank in members:
            ring = Ring(members, group, rank)
            checked[str(members)] = check_sizes(ring, sizes_for(ring.p))
            check_layouts(ring)
            check_baselines(ring)
        dist.barrier()
    check_errors()  # world of 4: ceil(5/4) = 2
    return checked


@pytest.mark.slow
def test_ring_collectives_match_single_process_sum_on_groups_of_every_size():
    checked = spawn(run_rank, 4, timeout_s=120)
    for rank, got in enumerate(checked):
        want = {str(m): len(DTYPES) * len(sizes_for(len(m))) for m in GROUPS if rank in m}
        assert got == want, f"rank {rank} checked {got}, expected {want}"


def test_without_process_group_the_error_says_how_to_start_one():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="scaletrain.launch.spawn"):
        ring_allreduce(torch.ones(3))
