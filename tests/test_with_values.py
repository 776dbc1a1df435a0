"""Evidence counts only with the values (issue 28, part 6 and 7): `Check.needs` and the one rule
that enforces it, `grade.with_values`, on the grader's side after every group."""

from dataclasses import replace

import pytest

from autograder.grade import with_values
from autograder.manifest import Check, all_manifests
from autograder.runner import Result
from toy_manifest import TOY

VALUES = Check("9.1", "adds", 3)
BYTES = Check("9.1", "sends the formula's bytes", 1, needs=("adds",))


@pytest.mark.parametrize("value, granted", [("passed", "passed"), ("failed", "failed"), ("flagged", "failed"),
                                            ("timeout", "failed"), ("error", "failed")])
def test_evidence_is_granted_only_beside_passed_values(value, granted):
    results = with_values([Result("a9", BYTES, "passed", "12 B"), Result("a9", VALUES, value, "why")])
    assert [r.outcome for r in results] == [granted, value]
    if granted == "failed":
        assert "granted only with 'adds'" in results[0].reason and "12 B" in results[0].reason


def test_evidence_without_its_values_in_the_run_is_not_granted():
    """A plant that grades other groups only: the values were never seen, so neither is the evidence."""
    assert with_values([Result("a9", BYTES, "passed", "")])[0].outcome == "failed"


def test_evidence_keeps_its_own_failure():
    out = with_values([Result("a9", BYTES, "flagged", "forbidden"), Result("a9", VALUES, "failed", "")])
    assert (out[0].outcome, out[0].reason) == ("flagged", "forbidden")


@pytest.mark.parametrize("needs", [("adds ",), ("adds", "fast on gpu"), ("sends the formula's bytes",)])
def test_manifest_refuses_needs_that_are_not_value_checks_of_the_same_run(needs):
    """Unknown, on other hardware (graded in another run), itself, or a chain."""
    evidence = Check("9.1", "sends the formula's bytes", 1, needs=needs)
    main = replace(TOY.groups[0], checks=TOY.groups[0].checks + (evidence,))
    with pytest.raises(ValueError, match="needs"):
        replace(TOY, groups=(main, TOY.groups[1]))


def test_every_suites_needs_are_consistent():
    """The manifests load (their `needs` validated) and the rule is used: evidence checks exist."""
    assert sum(bool(c.needs) for m in all_manifests().values() for c in m.checks) >= 20
