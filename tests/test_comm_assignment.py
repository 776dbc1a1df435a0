"""Assignment a2 grades itself: the solution gets full marks on CPU (the NCCL check is not_run),
the untouched stub zero without a harness error, and each planted broken submission exactly its
expected outcome: an off-by-one chunk index fails, two kinds of deadlock end as `timeout` within
the process group's few seconds, dist.all_reduce is flagged (statically, and at run time when
reached through getattr), and an exception on one rank is an `error` naming that rank."""

import pytest

from autograder.manifest import get_manifest
from autograder.selftest import run_selftest


@pytest.mark.slow
def test_a2_selftest():
    cases = run_selftest("a2")
    failures = [f"{c.case}: {c.detail}" for c in cases if not c.ok]
    assert not failures, "\n".join(failures)
    assert len(cases) == 2 + len(get_manifest("a2").planted) == 8


def test_a2_manifest_forbids_every_collective_and_counts_its_points():
    m = get_manifest("a2")
    forbidden = m.forbidden["ring.py"]
    for name in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast", "batch_isend_irecv"):
        assert f"torch.distributed.{name}" in forbidden
    assert not any(f.endswith((".isend", ".irecv")) for f in forbidden)
    assert m.max_score == 18 and sum(c.points for g in m.groups if g.needs_gpu for c in g.checks) == 2
