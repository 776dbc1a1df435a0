"""a1 on a GPU (`not_run` elsewhere, points pending): the CUDA kernels' correctness on the device, and
the speed of every kernel: this process's clock around worker calls that run a batch of the
student's calls (minus an empty batch), against naive composed PyTorch and torch's native op
timed here on the same inputs; each batch's last output sampled and checked."""

from __future__ import annotations

import random
import statistics
import time

from autograder import checks

from .judge import _start, remote_backend
from .names import GPU_CUDA, PROBE, SPEED_CHECKS, speed_check

SPEED_SHAPE = (8192, 8192)  # 256 MB per fp32 tensor: launch overheads are a few % of the time
CHECK_SHAPES = ((2048, 8192), (1823, 781))  # correctness first, where a trial fits the wire
SPEED_PAIRS = 5             # timed batches per side, alternating; the verdict is the median of their ratios
SPEED_REPS = 40             # calls per timed batch (tens of ms: the worker call's own cost is subtracted)
SAMPLES = 512               # positions of each timed batch's last output that are checked


def _student_batch(worker, op, direction, *, reps, positions, **kw):
    """Seconds per call of the student's kernel: a batch of `reps` calls timed from here, less an
    empty batch (the worker call's own cost); and the last output at `positions`."""
    start = time.perf_counter()
    worker.call(PROBE + "time_batch", op, direction, reps=0, **kw)
    middle = time.perf_counter()
    sample = worker.call(PROBE + "time_batch", op, direction, reps=reps, positions=positions, **kw)
    end = time.perf_counter()
    return max((end - middle) - (middle - start), 1e-9) / reps, sample


def _baseline_batch(fn, inputs, reps: int) -> float:
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn(inputs)
    sync()
    return (time.perf_counter() - start) / reps


def speed_ratios(ctx, op: str, direction: str, *, kernels: str, shape=SPEED_SHAPE, pairs: int = SPEED_PAIRS,
                 reps: int = SPEED_REPS, interpret: bool = False) -> dict:
    """{"x naive", "x native", "GB/s", "seconds"}: medians over `pairs` alternating batches of
    the student's calls (in the worker) and of naive and native (here, on the same inputs, which
    both sides make from one seed); every batch's last output sampled against native's."""
    import torch
    from scaletrain import bench
    from scaletrain.ops import naive
    from scaletrain.ops.backends import Backend
    from scaletrain.ops.benchmark import OP_CALLS, make_inputs
    from scaletrain.ops.testing import TOLERANCE, assert_rel_close

    device = "cuda" if torch.cuda.is_available() else "cpu"
    seed = checks.trial_seeds(1, salt=30)[0]
    torch.manual_seed(seed)
    inputs = make_inputs(op, *shape, torch.float32, device)
    call_backend, call_native = OP_CALLS[(op, direction)]
    naive_backend = Backend.from_modules("torch", naive, naive)
    expected = call_native(inputs)
    expected = (expected[0] if isinstance(expected, tuple) else expected).flatten()
    rng = random.Random(seed)
    student, vs_naive, vs_native = [], [], []
    for _ in range(pairs):
        positions = [rng.randrange(expected.numel()) for _ in range(SAMPLES)]
        seconds, sample = _student_batch(ctx.untrusted(), op, direction, reps=reps, positions=positions,
                                         m=shape[0], n=shape[1], dtype="fp32", seed=seed, kernels=kernels,
                                         interpret=interpret)
        assert_rel_close(sample.to(device), expected[torch.as_tensor(positions, device=device)],
                         tol=TOLERANCE[torch.float32], what=f"{op} {direction}: the timed calls' output")
        native = _baseline_batch(call_native, inputs, reps)
        slow = _baseline_batch(lambda t: call_backend(naive_backend, t), inputs, reps)
        student.append(seconds)
        vs_naive.append(slow / seconds)
        vs_native.append(native / seconds)
    seconds = statistics.median(student)
    nbytes = (2 if direction == "fwd" else 3) * shape[0] * shape[1] * 4
    return {"seconds": seconds, "GB/s": bench.gbps(nbytes, seconds), "x naive": statistics.median(vs_naive),
            "x native": statistics.median(vs_native)}


def _speed(ctx, label: str, kernels: str, backend) -> None:
    """Each op's speed check, after a correctness trial of that op at the checked shapes."""
    from scaletrain.ops import conformance as cf
    from scaletrain.ops.benchmark import peak_gbps

    trials = {("softmax", "fwd"): cf.softmax_forward, ("softmax", "bwd"): cf.softmax_backward,
              ("layer_norm", "fwd"): cf.layer_norm_forward, ("layer_norm", "bwd"): cf.layer_norm_backward}
    peak = peak_gbps()
    for (op, direction), what in SPEED_CHECKS.items():
        with ctx.check(speed_check(label, what)):
            try:
                for shape in CHECK_SHAPES:
                    trials[(op, direction)](backend, shape, device="cuda")
            except (AssertionError, NotImplementedError) as exc:
                ctx.skip(f"graded after correctness, which failed: {str(exc).splitlines()[0]}")
            row = speed_ratios(ctx, op, direction, kernels=kernels)
            summary = f"{row['GB/s']:.0f} GB/s, {row['x naive']:.2f}x naive, {row['x native']:.2f}x native"
            if (peak and row["GB/s"] > 1.05 * peak) or row["x native"] > 10:
                raise checks.Flagged(f"implausible timing: {summary}, peak {peak} GB/s")
            assert row["x naive"] >= 2.0 and row["x native"] >= 0.9, f"too slow: {summary}"
            ctx.note(summary)


def group_gpu_triton(ctx):
    _start(ctx)
    _speed(ctx, "Triton", "triton", remote_backend(ctx))


def group_gpu_cuda(ctx):
    cf = _start(ctx)
    worker = ctx.untrusted()
    try:
        worker.call(PROBE + "build_cuda")
        build_error = None
    except Exception as exc:  # noqa: BLE001 - one build for every check: report it on each
        lines = str(exc).splitlines() or [type(exc).__name__]
        build_error = "the CUDA extension did not build: " + next((ln for ln in lines if "error" in ln), lines[-1])
    backend, dev = remote_backend(ctx, kernels="cuda"), "cuda"
    trials = {
        GPU_CUDA["1.6"]: lambda: (
            [cf.softmax_forward(backend, s, dtype=d, device=dev) for s in cf.BUCKET_SHAPES for d in cf.DTYPES],
            cf.softmax_forward(backend, (2, 3, 129, 129), mask_shape=(2, 1, 1, 129), pad=True, causal=True, device=dev),
            cf.softmax_forward(backend, (2, 3, 1031, 1031), mask_shape=(1031, 1031), device=dev),
            cf.huge_logits(backend, device=dev), cf.masked_prefix(backend, device=dev)),
        GPU_CUDA["1.7"]: lambda: [
            cf.softmax_backward(backend, s, dtype=d, device=dev) for s in cf.BUCKET_SHAPES for d in cf.DTYPES],
        GPU_CUDA["1.8"]: lambda: (
            [cf.layer_norm_forward(backend, s, dtype=d, offset=1.0, device=dev)
             for s in cf.BUCKET_SHAPES for d in cf.DTYPES],
            cf.layer_norm_forward(backend, (50, 200), scale=1.0, offset=1000.0, tol=2e-4, device=dev)),
        GPU_CUDA["1.9"]: lambda: [
            cf.layer_norm_backward(backend, s, dtype=d, device=dev) for s in cf.BUCKET_SHAPES for d in cf.DTYPES],
    }
    for name, trial in trials.items():
        with ctx.check(name):
            assert build_error is None, build_error
            trial()
    if build_error is None:
        _speed(ctx, "CUDA", "cuda", backend)
        return
    for what in SPEED_CHECKS.values():
        with ctx.check(speed_check("CUDA", what)):
            raise AssertionError(build_error)
