"""a1's verdicts on the CUDA kernels (part B) where no GPU is needed: nvcc's own report (errors,
spills, kernels that never store) read here from a worker that runs none of the submission's
Python, and the .cu files run unmodified in the CUDA-on-CPU emulator at small shapes covering
every launcher bucket."""

from __future__ import annotations

from autograder import checks

from .inputs import emulated_shapes
from .judge import _start, remote_backend
from .names import CUDA_KERNELS, EMULATED, PROBE, cuda_compile_check


def group_compile_cuda(ctx):
    from scaletrain.ops.toolchain import nvcc

    results = ctx.untrusted().call(PROBE + "compile_cuda")
    for task, (cu, _, kernels) in CUDA_KERNELS.items():
        name = cuda_compile_check(task)
        if results is None:
            ctx.record(name, "not_run", "nvcc is not installed here: the CUDA sources were not compiled")
            continue
        with ctx.check(name):
            nvcc.verdict(cu, results[cu]["returncode"], results[cu]["log"], kernels=kernels)


def _one_pass(cf, backend, worker, seed) -> None:
    """Rows the registers hold (131 x 97 fp32: warp rows) get dw and db from the rows kernel's
    partial rows: the task's contract, so the given second pass must not run there (a launcher
    edited to take it everywhere gives the right numbers in two passes over x and dy)."""
    cf.layer_norm_backward(backend, (131, 97), seed=seed)
    launched = worker.call(PROBE + "cuda_cpu_launches")
    if any("layer_norm_dwdb_partial" in k for k in launched):
        raise AssertionError("layer_norm backward, shape (131, 97) fp32: dw and db came from the second pass "
                             f"(layer_norm_dwdb_partial), not from layer_norm_bwd_rows' partial rows "
                             f"[kernels launched: {'; '.join(launched)[:300]}]")


def group_emulated_cuda(ctx):
    cf = _start(ctx)
    worker = ctx.untrusted()
    built = worker.call(PROBE + "build_cuda_cpu")  # per .cu file: None, or (outcome, the compiler's words)
    backend, shapes = remote_backend(ctx, kernels="cuda-cpu"), emulated_shapes()
    seeds = checks.trial_seeds(len(shapes), salt=40)
    # every bucket in fp32; fp16 / bf16 on a warp-row, a block-row and a looped shape
    cases = [(s, "fp32", seed) for s, seed in zip(shapes, seeds)]
    cases += [(shapes[i], d, seeds[i]) for i in (2, 4, 8) for d in ("fp16", "bf16")]
    trials = {
        "1.6": lambda: (
            [cf.softmax_forward(backend, s, dtype=d, seed=seed) for s, d, seed in cases],
            cf.softmax_forward(backend, (2, 1, 37, 37), mask_shape=(2, 1, 1, 37), pad=True, causal=True, seed=seeds[0]),
            cf.softmax_forward(backend, (1, 2, 130, 130), mask_shape=(130, 130), seed=seeds[1]),
            cf.softmax_forward(backend, (2, 3, 9001), mask_shape=(1, 1, 9001), pad=True, seed=seeds[2]),
            cf.huge_logits(backend), cf.masked_prefix(backend, rows=2)),
        "1.7": lambda: [cf.softmax_backward(backend, s, dtype=d, seed=seed) for s, d, seed in cases],
        "1.8": lambda: (
            [cf.layer_norm_forward(backend, s, dtype=d, seed=seed, offset=1.0) for s, d, seed in cases],
            [cf.layer_norm_forward(backend, (9, 200), affine=a, seed=seeds[3])
             for a in ((False, False), (True, False))],
            cf.layer_norm_forward(backend, (50, 200), scale=1.0, offset=1000.0, tol=2e-4, seed=seeds[4])),
        "1.9": lambda: (
            [cf.layer_norm_backward(backend, s, dtype=d, seed=seed) for s, d, seed in cases],
            cf.layer_norm_backward(backend, (9, 200), affine=(False, False), seed=seeds[5]),
            _one_pass(cf, backend, worker, seeds[6])),
    }
    for task, trial in trials.items():
        name, cu = EMULATED[task], CUDA_KERNELS[task][0]
        with ctx.check(name):
            if built[cu] is not None:
                outcome, reason = built[cu]
                raise (NotImplementedError if outcome == "not_implemented" else AssertionError)(reason)
            try:
                trial()
            except AssertionError as exc:  # wrong numbers: name the kernels that computed them
                launches = worker.call(PROBE + "cuda_cpu_launches")
                raise AssertionError(f"{str(exc).splitlines()[0]} [kernels launched: {'; '.join(launches)[:300]}]") \
                    from None

