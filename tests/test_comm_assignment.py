"""a2's manifest: every collective forbidden, points as documented. (Its selftest — solution full
marks with the NCCL check not_run, stub zero, planted deadlocks ending as `timeout`, dist.all_reduce
flagged statically and through getattr, a raise on one rank an `error` naming it — runs in
tests/test_assignments.py.)"""

from autograder.manifest import get_manifest


def test_a2_manifest_forbids_every_collective_and_counts_its_points():
    m = get_manifest("a2")
    forbidden = m.forbidden["ring.py"]
    for name in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast", "batch_isend_irecv"):
        assert f"torch.distributed.{name}" in forbidden
    assert not any(f.endswith((".isend", ".irecv")) for f in forbidden)
    assert m.max_score == 21 and sum(c.points for g in m.groups if g.needs_gpu for c in g.checks) == 2
