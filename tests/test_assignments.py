"""Every assignment keeps the grader's promises (DESIGN.md, "Grading semantics"): its solution gets
full marks (GPU checks `not_run` on CPU), its untouched stub zero without a single `error`, and each
planted broken submission in its manifest exactly the outcomes the manifest expects (a deadlock is
a `timeout`, a forbidden call `flagged`, a crash on one rank an `error` naming it, ...).

One parametrized test, so an assignment added under autograder/suites/ is covered without edits.
"""

import pytest

from autograder.manifest import all_manifests
from autograder.selftest import run_selftest

MANIFESTS = all_manifests()


@pytest.mark.slow
@pytest.mark.parametrize("assignment", list(MANIFESTS))
def test_selftest_solution_stub_and_planted_submissions(assignment):
    cases = run_selftest(assignment)
    assert len(cases) == 3 + len(MANIFESTS[assignment].planted)  # solution, stub, hostile files, plants
    failures = [f"{c.case} ({c.seconds:.0f} s): {c.detail}" for c in cases if not c.ok]
    assert not failures, "\n".join(failures)
    assert all(c.seconds > 0 for c in cases), "each case's wall time is reported (selftest prints it)"


@pytest.mark.parametrize("assignment", list(MANIFESTS))
def test_every_group_runs_student_code_only_in_the_sandboxed_worker(assignment):
    """Issue 13: no group imports the submission into the process that writes its verdicts."""
    legacy = [g.name for g in MANIFESTS[assignment].groups if not g.trusted]
    assert not legacy, f"{assignment}: groups {legacy} are not trusted=True (CONTRIBUTING.md)"
