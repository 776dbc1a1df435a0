"""a1's verdicts on the Triton kernels (part A): the student's kernels run in the worker under the
grader's own wrappers (autograder/probes/a1_kernels.py), and here, in float64 by torch's native
ops, the references (scaletrain.ops.conformance) and the verdicts. Each check grades one property:
ragged or power-of-two shapes, long rows, masks, causal mode, one storage dtype, tiles other than
the launcher's (the kernel's design must hold for any tile), forward or backward."""

from __future__ import annotations

from autograder import checks

from .inputs import (CAUSAL_CASES, DWDB_SHAPES, LN_SHAPES, PARTIAL_PROGRAMS, PARTIAL_SHAPES, MASK_CASES, SM_16BIT, SM_BWD, SM_BWD_EVEN, SM_EVEN,
                     SM_LONG, SM_RAGGED, TILE_SHAPES, TILES)
from .names import (C_DWDB, C_HUGE, C_LN_PARTIALS, C_LN_AFFINE, C_LN_BF16, C_LN_DX, C_LN_DX_BF16, C_LN_DX_FP16, C_LN_DX_NO_W,
                    C_LN_DX_TILES, C_LN_FP16, C_LN_FWD, C_LN_SHIFT, C_LN_TILES, C_PREFIX, C_SM_BF16, C_SM_BWD,
                    C_SM_BWD_BF16, C_SM_BWD_EVEN, C_SM_BWD_FP16, C_SM_BWD_TILES, C_SM_CAUSAL, C_SM_EVEN, C_SM_FP16,
                    C_SM_FWD, C_SM_LONG, C_SM_MASK, C_SM_TILES, C_SMOKE, PROBE, TRITON_KERNELS, triton_compile_check)


def _storage(t):
    """The elements a (possibly expanded) tensor reaches, flat: a broadcast mask travels as its
    own few elements, not as rows x cols."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.as_strided((span,), (1,))


def _send(value):
    from scaletrain.ops.mask import MaskView

    if isinstance(value, MaskView):
        return {"mask": _storage(value.tensor), "view": list(value.kernel_args())}
    return value


def _on(value, device):
    if isinstance(value, tuple):
        return tuple(_on(v, device) for v in value)
    return value.to(device) if hasattr(value, "to") else value


def remote_backend(ctx, kernels: str = "triton", skip: tuple[str, ...] = (), tile=None, programs=None):
    """The student's kernels as a scaletrain.ops Backend whose four functions run in the worker
    (each call: inputs out, outputs back); `skip`: kernels the grader's wrapper does not launch;
    `tile`: (BLOCK_M, BLOCK_N) the grader's wrappers launch with instead of the launcher's choice;
    `programs`: the most persistent programs LayerNorm's dx kernel is launched with."""
    from scaletrain.ops.backends import Backend

    worker = ctx.untrusted()
    device = "cpu" if kernels == "cuda-cpu" else ctx.device  # the emulator runs on the CPU even beside a GPU
    kw = dict(device=device, kernels=kernels, interpret=ctx.device != "cuda", skip=list(skip))
    if tile is not None:
        kw["tile"] = list(tile)
    if programs is not None:
        kw["programs"] = int(programs)

    def op(name):
        def call(*args):
            return _on(worker.call(PROBE + "run", name, [_send(a) for a in args], **kw), args[0].device)
        return call
    return Backend(name=f"student {kernels}", softmax_fwd=op("softmax_fwd"), softmax_bwd=op("softmax_bwd"),
                   layer_norm_fwd=op("layer_norm_fwd"), layer_norm_bwd=op("layer_norm_bwd"), dtypes=())


def _start(ctx):
    """The worker, forked before this process has threads of its own (torch makes some)."""
    ctx.untrusted().start()
    from scaletrain.ops import conformance
    return conformance


def group_smoke(ctx):
    cf = _start(ctx)
    st, dev = remote_backend(ctx), ctx.device
    with ctx.check(C_SMOKE):
        for i, shape in enumerate(checks.IRREGULAR_ROWS):
            cf.softmax_forward(st, shape, seed=checks.trial_seeds(6)[i], device=dev)
    with ctx.check(C_HUGE):
        cf.huge_logits(st, device=dev)


def group_softmax(ctx):
    cf = _start(ctx)
    st, dev = remote_backend(ctx), ctx.device
    seeds = checks.trial_seeds(8, salt=1)  # the public tests' shapes (issue 27) come last in each list
    with ctx.check(C_SM_FWD):
        for shape, seed in zip(SM_RAGGED, seeds):
            cf.softmax_forward(st, shape, seed=seed, scale=5.0, device=dev)
    with ctx.check(C_SM_EVEN):
        for shape, seed in zip(SM_EVEN, seeds):
            cf.softmax_forward(st, shape, seed=seed, scale=5.0, device=dev)
    with ctx.check(C_SM_LONG):
        for shape, seed in zip(SM_LONG, seeds):
            cf.softmax_forward(st, shape, seed=seed, device=dev)
    for name, cases, first in ((C_SM_MASK, MASK_CASES, 0), (C_SM_CAUSAL, CAUSAL_CASES, 3)):
        with ctx.check(name):
            for (shape, options), seed in zip(cases, seeds[first:]):
                cf.softmax_forward(st, shape, seed=seed, **options, device=dev)
    with ctx.check(C_PREFIX):
        cf.masked_prefix(st, device=dev)
    for name, dtype in ((C_SM_FP16, "fp16"), (C_SM_BF16, "bf16")):
        with ctx.check(name):
            for shape, seed in zip(SM_16BIT, seeds):
                cf.softmax_forward(st, shape, dtype=dtype, seed=seed, device=dev)
    with ctx.check(C_SM_TILES):
        for tile in TILES:
            tiled = remote_backend(ctx, tile=tile)
            for shape, seed in zip(TILE_SHAPES, seeds):
                cf.softmax_forward(tiled, shape, seed=seed, device=dev)
            cf.softmax_forward(tiled, (2, 3, 9, 9), mask_shape=(2, 1, 1, 9), pad=True, causal=True, seed=seeds[2],
                               device=dev)
    _softmax_backward(ctx, cf, st, seeds)


def _softmax_backward(ctx, cf, st, seeds) -> None:
    dev = ctx.device
    with ctx.check(C_SM_BWD):
        for shape, seed in zip(SM_BWD, seeds):
            cf.softmax_backward(st, shape, seed=seed, device=dev)
    with ctx.check(C_SM_BWD_EVEN):
        for shape, seed in zip(SM_BWD_EVEN, seeds):
            cf.softmax_backward(st, shape, seed=seed, device=dev)
    with ctx.check(C_SM_BWD_FP16):
        cf.softmax_backward(st, (67, 300), dtype="fp16", seed=seeds[2], device=dev)
    with ctx.check(C_SM_BWD_BF16):
        cf.softmax_backward(st, (67, 300), dtype="bf16", seed=seeds[2], device=dev)
        cf.softmax_backward(st, (16, 100), dtype="bf16", seed=seeds[3], device=dev)
    with ctx.check(C_SM_BWD_TILES):
        for tile in TILES:
            for shape, seed in zip(TILE_SHAPES, seeds):
                cf.softmax_backward(remote_backend(ctx, tile=tile), shape, seed=seed, device=dev)


def group_layer_norm(ctx):
    cf = _start(ctx)
    st, dev = remote_backend(ctx), ctx.device
    seeds = checks.trial_seeds(8, salt=2)
    shapes = LN_SHAPES
    with ctx.check(C_LN_FWD):
        for shape, seed in zip(shapes, seeds):
            cf.layer_norm_forward(st, shape, seed=seed, offset=1.0, device=dev)
    with ctx.check(C_LN_AFFINE):
        for affine in ((False, False), (True, False), (False, True)):
            cf.layer_norm_forward(st, (50, 200), affine=affine, seed=seeds[5], device=dev)
    with ctx.check(C_LN_SHIFT):
        # fp32 input rounding alone is ~1e-4 here; mean(x^2) - mean(x)^2 without a shift is off by ~20%
        cf.layer_norm_forward(st, (50, 200), scale=1.0, offset=1000.0, tol=2e-4, seed=seeds[6], device=dev)
    for name, dtype in ((C_LN_FP16, "fp16"), (C_LN_BF16, "bf16")):
        with ctx.check(name):
            cf.layer_norm_forward(st, (67, 300), dtype=dtype, seed=seeds[7], device=dev)
    with ctx.check(C_LN_TILES):
        for tile in TILES:
            for shape, seed in zip(TILE_SHAPES, seeds):
                cf.layer_norm_forward(remote_backend(ctx, tile=tile), shape, seed=seed, offset=1.0, device=dev)
    _layer_norm_backward(ctx, cf, st, seeds, shapes)


def _layer_norm_backward(ctx, cf, st, seeds, shapes) -> None:
    dev = ctx.device
    with ctx.check(C_LN_DX):
        for shape, seed in zip(shapes, seeds):
            cf.layer_norm_backward(st, shape, seed=seed, grads=("dx",), device=dev)
    with ctx.check(C_LN_DX_NO_W):
        cf.layer_norm_backward(st, (50, 200), affine=(False, False), grads=("dx",), device=dev)
    for name, dtype in ((C_LN_DX_FP16, "fp16"), (C_LN_DX_BF16, "bf16")):
        with ctx.check(name):
            cf.layer_norm_backward(st, (67, 300), dtype=dtype, grads=("dx",), seed=seeds[3], device=dev)
    with ctx.check(C_LN_DX_TILES):
        for tile in TILES:
            for shape, seed in zip(TILE_SHAPES, seeds):
                cf.layer_norm_backward(remote_backend(ctx, tile=tile), shape, seed=seed, grads=("dx",), device=dev)
    with ctx.check(C_LN_PARTIALS):  # rows in one tile: dw and db are the dx kernel's partial sums
        for programs, shape, seed in zip(PARTIAL_PROGRAMS, PARTIAL_SHAPES, seeds):
            cf.layer_norm_backward(remote_backend(ctx, programs=programs), shape, seed=seed,
                                   grads=("dweight", "dbias"), device=dev)
        cf.layer_norm_backward(remote_backend(ctx, tile=(2, 128), programs=5), (67, 100), dtype="bf16",
                               grads=("dweight", "dbias"), device=dev)
    # task 1.5 on its own: the wrapper launches the dx kernel (task 1.4) first; here it does not, and
    # dw and db come from the second kernel for every row length
    alone = remote_backend(ctx, skip=("layer_norm_bwd_dx_kernel",))
    with ctx.check(C_DWDB):
        for shape, seed in zip(DWDB_SHAPES, seeds):
            cf.layer_norm_backward(alone, shape, seed=seed, grads=("dweight", "dbias"), device=dev)
        cf.layer_norm_backward(alone, (67, 300), dtype="bf16", grads=("dweight", "dbias"), device=dev)


def group_compile_triton(ctx):
    worker = ctx.untrusted()
    for task, (stem, kernel) in TRITON_KERNELS.items():
        with ctx.check(triton_compile_check(task)):
            worker.call(PROBE + "compile_triton", stem, kernel)
