"""a2's speed checks: the trusted side's clock around worker calls that run a batch of calls in
ranks that are already up, against gloo (or NCCL) in ranks that never load student code, timed
while the student's ranks are stopped; correctness on the timing input first, each batch sampled."""

from __future__ import annotations

import random
import statistics
import time

from autograder import checks
from autograder.suites import sized

from .judge import all_get, answer, shutdown
from .names import (AR_SPEED_MAX, C_AR_SPEED, C_NCCL, C_RS_SPEED, CHECK_SAMPLES, NCCL_SPEED_MAX, PROBE, RS_SPEED_MAX,
                    SAMPLES, SPEED_MIB, SPEED_P, SPEED_PAIRS, SPEED_REPS, SPEED_ROUNDS)


def _speed_ranks(p: int, n: int):
    """Each rank's timing-input seed (hidden) and the inputs they stand for."""
    import torch
    seeds = [s % (1 << 62) for s in checks.trial_seeds(p, salt=3)]
    inputs = [torch.randint(-8, 9, (n,), generator=torch.Generator().manual_seed(s)).to(torch.float32) for s in seeds]
    return seeds, inputs


def _check_samples(n: int, p: int, rng: random.Random) -> list[dict]:
    """Per rank, the positions of its timing-input results that are compared: hidden random ones and
    every chunk's first and last element."""
    m = -(-n // p)
    edges = sorted({i for c in range(p) for i in (c * m, min((c + 1) * m, n) - 1)})
    return [{"rs": sorted(set(rng.sample(range(m), CHECK_SAMPLES)) | {0, m - 1}),
             "ar": sorted(set(rng.sample(range(n), CHECK_SAMPLES)) | set(edges))} for _ in range(p)]


def _timing_input_verdict(answers, inputs, p: int, op: str, samples: list[dict]) -> None:
    """The student's reduce-scatter ("rs") or allreduce ("ar") on the timing input, each rank's."""
    import torch
    total = sum(x.double() for x in inputs).float()
    n = total.numel()
    m = -(-n // p)
    for rank, got in enumerate(sized(answers, p, "the ranks' answers for the timing input")):
        if not isinstance(got, dict):
            raise AssertionError(f"rank {rank} returned nothing for the timing input")
        if got.get("trapped"):
            raise checks.Flagged(f"rank {rank}: called forbidden `{got['trapped'][0]}`")
        raised = got.get(f"{op}_raised")
        if raised:
            kind, message, where = (str(x) for x in raised)
            exc = NotImplementedError if kind == "NotImplementedError" else AssertionError
            raise exc(f"rank {rank}: {message}{where}")
        idx = torch.tensor(samples[rank][op])
        if op == "rs":
            assert got.get("rs_shape") == [m], f"rank {rank}: reduce-scatter returned shape {got.get('rs_shape')}, expected [{m}]"
            checks.assert_equal(got.get("rs"), total[rank * m + idx], what=f"rank {rank} reduce-scatter of the timing input")
        else:
            assert got.get("ar_same"), "ring_allreduce must return the tensor it was given (in place)"
            checks.assert_equal(got.get("ar"), total[idx], what=f"rank {rank} allreduce of the timing input")


class _Timer:
    """Batches timed here, around worker calls; the ranks are up before the clock starts."""

    def __init__(self, worker, p: int, inputs):
        self.worker, self.p, self.inputs = worker, p, inputs
        self.n = inputs[0].numel()
        self.rng = random.Random(checks.trial_seeds(1, salt=4)[0])

    def batch(self, kind: str, op: str) -> float:
        m = -(-self.n // self.p)
        limit = self.n if op in ("ar", "none") else m
        samples = [sorted(self.rng.sample(range(limit), SAMPLES)) for _ in range(self.p)]
        scales = [[[self.rng.randint(1, 4), self.rng.randint(-4, 4)] for _ in range(SPEED_REPS)] for _ in range(self.p)]
        if kind == "gloo":
            self.worker.call(PROBE + "speed_pause", "student", True)
        try:
            t0 = time.perf_counter()
            got = answer(self.worker.call(PROBE + "speed_run", kind, op, scales, samples))
            elapsed = time.perf_counter() - t0
        finally:
            if kind == "gloo":
                self.worker.call(PROBE + "speed_pause", "student", False)
        if kind == "student":
            self._verify(got, op, samples, scales)
        return elapsed

    def _verify(self, got, op: str, samples, scales) -> None:
        """Every timed call computed the sum of its fresh inputs: its values at hidden positions."""
        import torch
        m = -(-self.n // self.p)
        for rank, answer in enumerate(sized(got, self.p, "the ranks' answers for a timed batch")):
            results = answer.get("samples") if isinstance(answer, dict) else None
            if not isinstance(results, list) or len(results) != SPEED_REPS:
                raise AssertionError(f"rank {rank} returned no results for the timed calls")
            idx = torch.tensor(samples[rank]) + (rank * m if op == "rs" else 0)
            for rep, values in enumerate(results):
                want = sum(x[idx] * scales[r][rep][0] + scales[r][rep][1] for r, x in enumerate(self.inputs))
                checks.assert_equal(values, want, what=f"rank {rank}: timed call {rep + 1} of a batch (sampled)")


def _measure(timer: _Timer, op: str) -> tuple[float, float, float]:
    """Median, p20, p80 of student/baseline time per pair of batches, this machinery's overhead (a
    batch of no calls on the baseline's ranks) taken off both."""
    from scaletrain.bench import quantile

    timer.batch("student", op)
    timer.batch("gloo", op)  # warm-up
    student, baseline, overhead = [], [], []
    for pair in range(SPEED_PAIRS):
        order = ("student", "gloo") if pair % 2 == 0 else ("gloo", "student")
        for kind in order:
            (student if kind == "student" else baseline).append(timer.batch(kind, op))
        overhead.append(timer.batch("gloo", "none"))
    o = statistics.median(overhead)
    ratios = [max(s - o, 1e-6) / max(b - o, 0.25 * b) for s, b in zip(student, baseline, strict=True)]
    return statistics.median(ratios), quantile(ratios, 0.2), quantile(ratios, 0.8)


def _measure_rounds(timer: _Timer, op: str, limit: float) -> tuple[tuple[float, float, float], int]:
    """The best of up to SPEED_ROUNDS rounds of `_measure`, and how many ran. A round whose median
    misses the limit while its p20 is within it says more about the machine's load than about the
    ring (CI's other pytest worker shares the two cores: a ring at 0.9x quiet measured 1.69x,
    p20-p80 1.24-1.92), so it is measured again; a ring whose p20 misses too is slow, and fails at once."""
    best, rounds = None, 0
    while rounds < SPEED_ROUNDS:
        ratios = _measure(timer, op)
        rounds += 1
        best = ratios if best is None or ratios[0] < best[0] else best
        if best[0] <= limit or ratios[1] > limit:
            break
    return best, rounds


def _speed_verdict(ctx, ratios, limit: float, what: str, rounds: int) -> None:
    ratio, p20, p80 = ratios
    if ratio < 0.1:
        raise checks.Flagged(f"{what}: {1 / ratio:.0f}x faster than the backend's own collective is implausible")
    best = f", the best of {rounds} rounds" if rounds > 1 else ""
    measured = f"{what}: {ratio:.2f}x the backend's time (p20-p80 {p20:.2f}-{p80:.2f}{best}), limit {limit}x"
    assert ratio <= limit, f"{measured}: segment the chunks, post receives early, reuse buffers"
    ctx.note(measured)


def _speed(ctx, device: str, p: int, mib: int, checks_by_op: dict) -> None:
    """checks_by_op: op ("rs", "ar") -> (check name, limit, what). Correctness on the timing input
    first, then each op timed against the baseline."""
    from autograder.untrusted import StudentCrash

    worker = ctx.untrusted()
    n = mib * 2**20 // 4
    seeds, inputs = _speed_ranks(p, n)
    names = [name for name, _, _ in checks_by_op.values()]
    samples = _check_samples(n, p, random.Random(checks.trial_seeds(1, salt=5)[0]))
    try:
        answers = answer(worker.call(PROBE + "speed_start", "student", p, device, seeds, n, samples))
    except Exception as exc:  # noqa: BLE001 - the ranks' failure is every check's outcome
        all_get(ctx, names, exc)
        if not isinstance(exc, (TimeoutError, StudentCrash)):
            shutdown(ctx)
        return
    todo = {}
    for op, (name, limit, what) in checks_by_op.items():
        try:
            _timing_input_verdict(answers, inputs, p, op, samples)
            todo[op] = (name, limit, what)
        except Exception as exc:  # noqa: BLE001 - graded only once correct on the timing input
            all_get(ctx, [name], exc)
    fatal = None
    if todo:
        try:
            answer(worker.call(PROBE + "speed_start", "gloo", p, device, seeds, n, samples))
        except Exception as exc:  # noqa: BLE001
            fatal = exc
    timer = _Timer(worker, p, inputs)
    for op, (name, limit, what) in todo.items():
        with ctx.check(name):
            if fatal is not None:
                raise fatal
            try:
                ratios, rounds = _measure_rounds(timer, op, limit)
            except (AssertionError, checks.Flagged):
                raise
            except Exception as exc:  # the worker or the ranks are gone: no later check can be timed
                fatal = exc
                raise
            _speed_verdict(ctx, ratios, limit, what, rounds)
    if not isinstance(fatal, (TimeoutError, StudentCrash)):
        shutdown(ctx)


def group_speed_cpu(ctx):
    _speed(ctx, "cpu", SPEED_P, SPEED_MIB, {
        "rs": (C_RS_SPEED, RS_SPEED_MAX, "reduce-scatter vs gloo's reduce_scatter"),
        "ar": (C_AR_SPEED, AR_SPEED_MAX, "allreduce vs gloo's all_reduce"),
    })


def group_speed_gpu(ctx):
    """Two ranks on two GPUs (the manifest's gpus=2: with fewer the runner records not_run)."""
    _speed(ctx, "cuda", 2, 64, {"ar": (C_NCCL, NCCL_SPEED_MAX, "allreduce vs NCCL's all_reduce")})
