"""Public tests of a5 on the public models of `scaletrain.zero.verify`, 2 gloo ranks.

One spawn per task (only the tasks you select run): `pytest assignments/a5_zero -m task5_3`.
The grader runs more: hidden models (another GPT shape, odd MLPs, fewer parameters than ranks,
two param groups with a frozen layer) at N = 3 and N = 2, and forbids torch's own ZeRO / FSDP /
collectives in your file.
"""

import functools

import pytest
import torch

from autograder.checks import student_module
from scaletrain.launch import spawn
from scaletrain.testing import assert_close, expect_equal
from scaletrain.zero import audit, verify

zm = student_module("zero_engine", default=__file__)
P = 2


@pytest.mark.task5_1
def test_task5_1_shard_of_is_a_view():
    full = torch.arange(12.0)
    for rank in range(3):
        shard = zm.shard_of(full, rank, 3)
        expect_equal(shard.tolist(), full[4 * rank:4 * rank + 4].tolist(), what=f"shard_of(arange(12), {rank}, 3)")
        assert shard.data_ptr() == full[4 * rank:].data_ptr(), "shard_of must return a view, not a copy"


def _unshard(rank):
    for m in (1, 5):
        expected = torch.arange(float(P * m))
        full = torch.zeros(P * m)
        full[rank * m:(rank + 1) * m] = expected[rank * m:(rank + 1) * m]
        zm.unshard(full, full[rank * m:(rank + 1) * m])  # the shard is a view of `full`
        assert_close(full, expected, rtol=0, what=f"rank {rank}: unshard of {P} shards of {m}, the shard a view of the output")
        separate = torch.zeros(P * m)
        zm.unshard(separate, expected[rank * m:(rank + 1) * m].clone())  # a separate shard
        assert_close(separate, expected, rtol=0, what=f"rank {rank}: unshard of {P} shards of {m}, a separate shard")


def _stage(stage, rank):
    """{property: the first failure} over the public models at this stage; each property is a
    test of its own, scored as the grader scores it (memory and bytes only beside equal values)."""
    failures = {}
    for model, optimizer in (("gpt", "sgd_momentum"), ("groups", "adamw"), ("tiny", "sgd_momentum")):
        case = verify.Case(model=model, optimizer=optimizer, stage=stage)
        engine = verify.run_zero(case, zero_cls=zm.ZeRO)
        ref = verify.run_reference(case, P)
        audits = {"equal": lambda: verify.compare(engine, *ref, rtol=verify.RTOL[optimizer],
                                                  label=f"stage {stage}, {model}, {optimizer}:"),
                  "memory": functools.partial(audit.check_memory, engine),
                  "bytes": functools.partial(audit.check_comm, engine)}
        if stage == 3 and model == "gpt":
            audits["gathers"] = functools.partial(audit.check_stage3_gathers, engine, case)
        for name, run in audits.items():  # collective and agreed: every rank records the same failure
            try:
                run()
            except AssertionError as exc:
                failures.setdefault(name, f"stage {stage}, {model}, {optimizer}: {exc}")
    return failures


def _rank(rank, world_size, task):
    global zm
    zm = student_module("zero_engine")  # the folder comes from $AUTOGRADER_SUBMISSION
    return {"5.1": _unshard, "5.2": functools.partial(_stage, 1), "5.3": functools.partial(_stage, 2),
            "5.4": functools.partial(_stage, 3)}[task](rank)


@functools.lru_cache(maxsize=None)
def _run(task):
    return spawn(_rank, P, task, timeout_s=60)[0]  # raises RankError naming the failing rank and line


def _expect(task, prop):
    failures = _run(task)
    if prop != "equal" and "equal" in failures:
        pytest.fail(f"task {task}: {prop} is granted only beside values equal to one process: {failures['equal']}")
    if prop in failures:
        pytest.fail(f"task {task}: {failures[prop]}")


@pytest.mark.task5_1
def test_task5_1_unshard_gathers_views_and_separate_shards():
    _run("5.1")


@pytest.mark.task5_2
@pytest.mark.parametrize("prop", ["equal", "memory", "bytes"])
def test_task5_2_stage1(prop):
    _expect("5.2", prop)


@pytest.mark.task5_3
@pytest.mark.parametrize("prop", ["equal", "memory", "bytes"])
def test_task5_3_stage2(prop):
    _expect("5.3", prop)


@pytest.mark.task5_4
@pytest.mark.parametrize("prop", ["equal", "memory", "gathers", "bytes"])
def test_task5_4_stage3(prop):
    _expect("5.4", prop)
