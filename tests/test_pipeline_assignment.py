"""Assignment a4 grades itself: the solution gets full marks, the stub zero without a harness
error, and each planted broken submission (swapped 1F1B pair, missing cool-down, infinite loop,
channel order ignored, loss not divided by m) exactly its expected outcomes."""

import pytest

from autograder.manifest import get_manifest
from autograder.selftest import run_selftest


@pytest.mark.slow
def test_a4_selftest():
    cases = run_selftest("a4")
    failures = [f"{c.case}: {c.detail}" for c in cases if not c.ok]
    assert not failures, "\n".join(failures)
    assert len(cases) == 2 + len(get_manifest("a4").planted) == 7
