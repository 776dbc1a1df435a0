"""Public tests of a3 on the default tiny GPT, 2 ranks on gloo (one spawn for all of 3.2 and 3.3).

Task 3.1 is a design decision: any bucket assignment with the five properties of
`scaletrain.dp.bucket_rules` is right, and each property is one test here and one check in the
grader, which calls the same functions on hidden parameter lists and caps.

The grader runs more: a hidden GPT shape, unused and frozen parameters with and without hooks, a
count of allreduces per step, and overlap timed by its own hooks. Run one task alone with
`.venv/bin/pytest assignments/a3_data_parallel -m task3_2`.

Tasks 3.2 and 3.3 are tested whatever the state of 3.1, as the grader grades them: your
DataParallel gets the reference's bucket assignment as data (`REFERENCE_BUCKETS`) in place of
your `assign_buckets`.
"""

import pytest
import torch

from autograder.checks import student_module
from scaletrain.dp import bucket_rules as rules
from scaletrain.launch import spawn
from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.testing import assert_close, expect_equal

bucket_mod = student_module("dp_bucket", default=__file__)

CFG = GPTConfig()
P, B = 2, 2  # ranks, sequences per rank per micro-step
CAP_MB = 0.1
# the reference `assign_buckets` on GPT(CFG)'s 28 parameters at CAP_MB (104857 bytes)
REFERENCE_BUCKETS = [[27, 26, 25, 24, 23], [22, 21, 20, 19, 18, 17], [16, 15, 14, 13], [12, 11],
                     [10, 9, 8, 7, 6, 5], [4, 3, 2, 1], [0]]


def _nbytes(p):
    return p.numel() * p.element_size()


def _cases():
    """(what, params, cap): the docstring's example, the tiny GPT at four caps, a dtype change, a
    parameter larger than the cap, and a cap that two parameters fill exactly."""
    f32, f64 = torch.float32, torch.float64
    gpt = list(GPT(CFG).parameters())
    yield "float32 numels [10, 20, 30, 40] (the docstring's example)", [torch.zeros(n) for n in (10, 20, 30, 40)], 200
    for cap in (1, 4 * 5000, 4 * 40000, 10**9):
        yield f"the tiny GPT's {len(gpt)} parameters", gpt, cap
    yield "[float32, float64, float32] of 2 elements", [torch.zeros(2, dtype=d) for d in (f32, f64, f32)], 10**6
    yield "float32 numels [10, 1000, 10]", [torch.zeros(n) for n in (10, 1000, 10)], 100
    yield "float32 numels [300, 60, 40]", [torch.zeros(n) for n in (300, 60, 40)], 400


def _each_case(check):
    """Run one property of scaletrain.dp.bucket_rules (the grader's own) on your buckets for every case."""
    for what, params, cap in _cases():
        buckets = bucket_mod.assign_buckets(params, cap)
        call = f"assign_buckets({what}, cap_bytes={cap}) = {str(buckets)[:60]}"
        rules.check_partition(buckets, len(params), what=call)  # the other properties read indices
        check(buckets, [_nbytes(p) for p in params], [p.dtype for p in params], cap, call)


@pytest.mark.task3_1
def test_task3_1_every_parameter_in_exactly_one_bucket():
    _each_case(lambda buckets, nbytes, dtypes, cap, what: None)


@pytest.mark.task3_1
def test_task3_1_every_bucket_within_the_cap():
    _each_case(lambda buckets, nbytes, dtypes, cap, what: rules.check_cap(buckets, nbytes, cap, what=what))


@pytest.mark.task3_1
def test_task3_1_one_dtype_per_bucket():
    _each_case(lambda buckets, nbytes, dtypes, cap, what: rules.check_one_dtype(buckets, dtypes, what=what))


@pytest.mark.task3_1
def test_task3_1_no_two_neighbouring_buckets_fit_in_one():
    _each_case(lambda buckets, nbytes, dtypes, cap, what: rules.check_full(buckets, nbytes, dtypes, cap, what=what))


@pytest.mark.task3_1
def test_task3_1_buckets_follow_the_gradients_arrival():
    _each_case(lambda buckets, nbytes, dtypes, cap, what: rules.check_arrival_order(buckets, len(nbytes), what=what))


# ---------------------------------------------------------------- 3.2 and 3.3 on 2 ranks

def _grads_single_process(rows, seed):
    model = GPT(CFG, seed=0)
    model(*make_batch(CFG, rows, seed=seed))[1].backward()
    return [p.grad for p in model.parameters()]


def _step(dpm, rank, micro=1, launches=None, **kw):
    """One synchronized step of the student's DataParallel on this rank's rows; its grads."""
    import torch.distributed as dist

    def allreduce(t):  # gloo's async allreduce, counting launches
        launches.append("launch")
        return dist.all_reduce(t, async_op=True)

    launches = [] if launches is None else launches
    dpm.assign_buckets = _reference_buckets  # the name your DataParallel.__init__ calls
    dp = dpm.DataParallel(GPT(CFG, seed=rank), bucket_cap_mb=CAP_MB, allreduce=allreduce, timeout_s=10, **kw)
    x, y = (t[rank * micro * B:(rank + 1) * micro * B] for t in make_batch(CFG, P * micro * B, seed=7))
    for j in range(micro):
        if j < micro - 1:
            with dp.no_sync():
                (dp(x[j * B:(j + 1) * B], y[j * B:(j + 1) * B])[1] / micro).backward()
            assert not launches, "an allreduce ran inside no_sync()"
        else:
            (dp(x[j * B:(j + 1) * B], y[j * B:(j + 1) * B])[1] / micro).backward()
    during_backward = len(launches)
    dp.finish_gradient_synchronization()
    return [p.grad for p in dp.module.parameters()], during_backward, len(launches), len(dp.buckets)


def _reference_buckets(params, cap_bytes):
    """Stands in for `assign_buckets` in tasks 3.2 and 3.3: the reference's answer, as data."""
    assert len(params) == 28 and cap_bytes == int(CAP_MB * 2**20), "the public tests' GPT and cap only"
    return [list(b) for b in REFERENCE_BUCKETS]


def _close(grads, ref, what):
    names = [name for name, _ in GPT(CFG).named_parameters()]
    for name, g, r in zip(names, grads, ref):
        assert g is not None, f"{what}: {name}.grad is None after finish_gradient_synchronization()"
        assert_close(g, r, rtol=2e-5, what=f"{what}: gradient of {name} against one process on the whole batch")


def _sync_after_backward(dpm, rank):
    grads, during, _, _ = _step(dpm, rank, overlap=False)
    expect_equal(during, 0, what="DataParallel(overlap=False): allreduces launched during backward")
    _close(grads, _grads_single_process(P * B, 7), f"DataParallel(overlap=False), {P} ranks x {B} sequences")


def _once(dpm, rank):
    for overlap in (False, True):
        _, _, total, n_buckets = _step(dpm, rank, overlap=overlap)
        expect_equal(total, n_buckets, what=f"DataParallel(overlap={overlap}): allreduces in one step, one per bucket")


def _overlap(dpm, rank):
    _, during, _, n_buckets = _step(dpm, rank)
    assert n_buckets > 1, f"DataParallel(bucket_cap_mb={CAP_MB}) built {n_buckets} bucket(s); the reference 7"
    assert during >= n_buckets - 1, (f"DataParallel(overlap=True): only {during} of {n_buckets} buckets launched "
                                     f"during backward, expected at least {n_buckets - 1}")


def _hooked(dpm, rank):
    grads, _, _, _ = _step(dpm, rank)
    _close(grads, _grads_single_process(P * B, 7), f"DataParallel (overlap), {P} ranks x {B} sequences")


def _no_sync(dpm, rank):
    grads, _, _, _ = _step(dpm, rank, micro=4)
    _close(grads, _grads_single_process(P * 4 * B, 7), f"DataParallel, 3 micro-steps in no_sync() and a 4th, {P} ranks")


# one per property, as the grader's checks: a mistake fails the tests of the properties it breaks
CHECKS = {"sync": _sync_after_backward, "once": _once, "overlap": _overlap, "hooked": _hooked, "no_sync": _no_sync}


def _rank(rank, world_size):
    dpm = student_module("dp_data_parallel")  # the folder comes from $AUTOGRADER_SUBMISSION
    out = {}
    for name, fn in CHECKS.items():
        try:
            fn(dpm, rank)
            out[name] = None
        except Exception as exc:  # noqa: BLE001 - each test reports its own failure
            out[name] = f"rank {rank}: {type(exc).__name__}: {exc}"
    return out


@pytest.fixture(scope="module")
def ranks():
    student_module("dp_data_parallel", default=__file__)
    return spawn(_rank, P, timeout_s=60)


def _assert_ok(ranks, name):
    problems = [r[name] for r in ranks if r[name]]
    assert not problems, problems[0]


@pytest.mark.task3_2
def test_task3_2_sync_after_backward_equals_one_process(ranks):
    _assert_ok(ranks, "sync")


@pytest.mark.task3_2
def test_task3_2_one_allreduce_per_bucket(ranks):
    _assert_ok(ranks, "once")


@pytest.mark.task3_3
def test_task3_3_hooks_launch_buckets_during_backward(ranks):
    _assert_ok(ranks, "overlap")


@pytest.mark.task3_3
def test_task3_3_overlapped_steps_equal_one_process(ranks):
    _assert_ok(ranks, "hooked")


@pytest.mark.task3_3
def test_task3_3_no_sync_accumulation_equals_one_large_batch(ranks):
    _assert_ok(ranks, "no_sync")
