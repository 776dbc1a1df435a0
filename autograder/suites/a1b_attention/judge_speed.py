"""a1b on a GPU (`not_run` elsewhere, points pending): correctness at the checked shapes on the
device, then attention_benchmark.graded_speed with the student's kernels in the worker (clocked
here, around the worker call, less an empty call) against SDPA's math and flash paths timed here
on the same inputs; each timed batch's last output sampled and checked."""

from __future__ import annotations

import time

from autograder import checks

from .judge import _start, attention_backward, attention_forward
from .names import PROBE, SPEED

# attention_benchmark.GRADED (batch 4 x 16 heads, n = 4096, head dim 64, fp16): bench attention's row
SPEED_PAIRS, SPEED_REPS = 5, 10
SAMPLES = 512  # positions of each timed batch's last output that are checked


def _student_timer(ctx, direction: str, seed: int, expected):
    """reps -> seconds per call of the student's `direction` in the worker on the seed's inputs
    (made there): a batch of `reps` timed from here, less an empty batch (the worker call's own
    cost); each batch's last output is sampled and checked against `expected` (flat)."""
    import random

    import torch
    from scaletrain.ops.testing import TOLERANCE, assert_rel_close

    from scaletrain.ops.attention_benchmark import GRADED

    worker, rng = ctx.untrusted(), random.Random(seed)
    kw = dict(direction=direction, seed=seed, device=ctx.device, **GRADED)  # the worker makes what we make

    def seconds(reps: int) -> float:
        positions = [rng.randrange(expected.numel()) for _ in range(SAMPLES)]
        start = time.perf_counter()
        worker.call(PROBE + "time_batch", reps=0, **kw)
        middle = time.perf_counter()
        sample = worker.call(PROBE + "time_batch", reps=reps, positions=positions, **kw)
        end = time.perf_counter()
        assert_rel_close(sample.to(expected.device), expected[torch.as_tensor(positions, device=expected.device)],
                         tol=4 * TOLERANCE[torch.float16], what=f"attention {direction}: the timed calls' output")
        return max((end - middle) - (middle - start), 1e-9) / reps
    return seconds


def _expected(direction: str, seed: int, device: str):
    """The graded inputs' O (fwd) or dQ (fwd+bwd), flat, by SDPA's flash path (or its stand-in)."""
    from scaletrain.ops.attention_benchmark import GRADED, forward_backward, sdpa_paths, speed_inputs

    q, k, v, do = speed_inputs(GRADED, device=device, seed=seed, grad=direction != "fwd")
    paths = sdpa_paths(q, k, v, causal=GRADED["causal"], backward=direction != "fwd")
    fn = paths["flash"][0] or paths["math"][0]
    if direction == "fwd":
        return fn(q, k, v).detach().flatten()
    forward_backward(fn)(q, k, v, do)
    return q.grad.flatten()


def _speed(ctx, direction: str) -> tuple[dict, str]:
    """attention_benchmark.graded_speed (bench attention's protocol) with the student's side in
    the worker; and a one-line summary naming any SDPA path that stood in for another."""
    from scaletrain.ops.attention_benchmark import graded_speed

    seed = checks.trial_seeds(1, salt=30)[0]
    timer = _student_timer(ctx, direction, seed, _expected(direction, seed, ctx.device))
    row = graded_speed(timer, direction, seed=seed, pairs=SPEED_PAIRS, reps=SPEED_REPS, device=ctx.device)
    flash = "no flash path" if row["x flash"] is None else f"{row['x flash']:.2f}x flash"
    notes = "".join(f"; {note}" for note in row["notes"])
    return row, f"{row['seconds'] * 1e3:.2f} ms, {row['x math']:.2f}x math, {flash}{notes}"


def _after_correctness(ctx, trial, *args, **kwargs) -> None:
    try:
        trial(ctx, *args, **kwargs)
    except (AssertionError, NotImplementedError) as exc:
        ctx.skip(f"graded after correctness, which failed: {str(exc).splitlines()[0]}")


def group_gpu_speed(ctx):
    """Correctness first (the checked shapes on the device), then graded_speed: the student's
    kernels in the worker (clocked here, around the worker call, less an empty call) alternating
    with SDPA's math and flash paths here, on the same inputs; medians of the ratios.  An SDPA path
    that cannot run the inputs is replaced, and the output says by what and why; without any
    flash path only the math target is graded.  > 10x the flash path is flagged."""
    _start(ctx)
    with ctx.check(SPEED["1b.1"]):
        _after_correctness(ctx, attention_forward, 3, 1000, 1000, 64, causal=True, dtype="fp16")
        row, summary = _speed(ctx, "fwd")
        if row["x flash"] is not None and row["x flash"] > 10:
            raise checks.Flagged(f"implausible timing: {summary}")
        assert row["x math"] >= 2.0 and (row["x flash"] is None or row["x flash"] >= 0.7), f"too slow: {summary}"
        ctx.note(summary)
    with ctx.check(SPEED["1b.2"]):
        _after_correctness(ctx, attention_backward, 1, 1000, 64, causal=True, dtype="fp16")
        row, summary = _speed(ctx, "fwd+bwd")
        assert row["x math"] >= 2.0, f"too slow: {summary}"
        ctx.note(f"forward + backward: {summary}")
