"""scaletrain.dp.bucket_rules, the five properties task 3.1 is graded by: they accept the reference
and another correct design, and each rejects the one mistake it names (a3's plants do the same
through the grader: autograder/suites/a3_data_parallel/planted.py)."""

import pytest
import torch

from scaletrain.dp import bucket_rules as rules
from scaletrain.dp.bucket import assign_buckets

NBYTES = [40, 80, 120, 160]            # float32 numels [10, 20, 30, 40]: the docstring's example
F32 = [torch.float32] * 4


def _all(buckets, nbytes=NBYTES, dtypes=F32, cap=200):
    rules.check_partition(buckets, len(nbytes), what="x")
    rules.check_cap(buckets, nbytes, cap, what="x")
    rules.check_one_dtype(buckets, dtypes, what="x")
    rules.check_full(buckets, nbytes, dtypes, cap, what="x")
    rules.check_arrival_order(buckets, len(nbytes), what="x")


def test_the_reference_and_another_design_have_every_property():
    _all(assign_buckets([torch.zeros(n // 4) for n in NBYTES], 200))   # [[3], [2, 1], [0]]
    _all([[3], [2], [1, 0]])                                            # cut from the other end
    _all([[3], [1, 2], [0]])                                            # a bucket's slots in another order


@pytest.mark.parametrize("buckets,message", [
    ([[3], [2, 1]], "missing \\[0\\]"),
    ([[3], [2, 1], [0], []], "is empty"),
    ([[3, 2], [1, 0]], "above the cap"),
    ([[3], [2], [1], [0]], "would fit in one"),
    ([[0], [1, 2], [3]], "completes after bucket"),
    ([[3], [2, 0], [1]], "not a run of consecutive arrivals"),
])
def test_each_property_rejects_its_mistake(buckets, message):
    with pytest.raises(AssertionError, match=message):
        _all(buckets)


def test_one_dtype_per_bucket():
    with pytest.raises(AssertionError, match="mixes"):
        rules.check_one_dtype([[1, 0]], [torch.float32, torch.float64], what="x")
    rules.check_full([[1], [0]], [8, 8], [torch.float32, torch.float64], 100, what="x")  # a dtype change may cut
