"""A collection the worker sends back is checked against what the suite expected (issue 28): an
empty, short, long or non-list answer fails its check with both counts, instead of a zip loop that
checks nothing. The planted submissions that exploited the old loops (a8's LAMB that empties the
caller's parameter list, a7's planner that empties the probe's list of cases) are in the
manifests; `selftest` grades them."""

import pytest

from autograder.manifest import get_manifest
from autograder.suites import paired, sized


@pytest.mark.parametrize("got", [[], [1], [1, 2, 3], None, "ab", {"a": 1}])
def test_an_answer_of_the_wrong_size_or_kind_fails_naming_both(got):
    with pytest.raises(AssertionError, match="LAMB: params per step: expected (2|a list of 2)"):
        paired(got, ["x", "y"], "LAMB: params per step")


def test_an_answer_of_the_right_size_pairs_item_by_item():
    assert paired((1, 2), "ab", "w") == [(1, "a"), (2, "b")]
    assert sized([], 0, "nothing") == []


@pytest.mark.parametrize("assignment,name", [
    ("a8", "LAMB empties the caller's parameter list; its step is the stub"),
    ("a7", "the planner empties the probe's list of cases: only the first is answered"),
])
def test_the_emptied_answers_are_planted_and_expected_to_fail(assignment, name):
    planted = next(p for p in get_manifest(assignment).planted if p.name == name)
    assert planted.expect and set(planted.expect.values()) == {"failed"}
