"""a5 grades itself: the solution gets full marks, the stub zero without an error, and each planted
broken submission (a sum instead of a mean, stage 3 never freeing, an FSDP import, a deadlocked
all-gather) exactly the outcomes its manifest expects."""

import pytest

from autograder.manifest import get_manifest
from autograder.suites.a5_zero import MANIFEST, unimplemented

A5 = get_manifest("a5")


def test_stub_detection_reads_the_generated_files():
    every = {f for t in MANIFEST.tasks for f in t.functions}
    assert unimplemented(MANIFEST.stub_dir() / "zero_engine.py") == every
    assert unimplemented(MANIFEST.solution_dir() / "zero_engine.py") == set()


@pytest.mark.slow
def test_selftest_solution_stub_and_planted_submissions():
    from autograder.selftest import run_selftest

    cases = run_selftest("a5")
    assert len(cases) == 2 + len(A5.planted)
    failures = [f"{c.case}: {c.detail}" for c in cases if not c.ok]
    assert not failures, "\n".join(failures)
