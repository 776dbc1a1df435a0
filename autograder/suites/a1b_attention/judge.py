"""a1b's verdicts on CPU or GPU: the student's kernels run in the worker under the grader's own
wrappers (autograder/probes/a1b_attention.py) into NaN-filled outputs; the references, float64
torch (scaled_dot_product_attention, cross_entropy) computed here before the student's call, and the
verdicts stay here. Each check grades one property: ragged or tile-multiple lengths, causal mode,
one storage dtype, tiles with BLOCK_M != BLOCK_N (the tile shape is the launcher's: the kernels'
design must hold for any), forward or backward, dQ from the dq kernel or from the dK/dV kernel's
atomic adds (the grader's wrapper with DQ_BY_ATOMICS on)."""

from __future__ import annotations

from autograder import checks
from autograder.suites import paired, sized

from .inputs import attention_inputs, cross_entropy_inputs, dtype_of
from .names import (BACKWARD_DQ, C_BF16, C_BWD, C_BWD_ATOMIC, C_BWD_BF16, C_BWD_CAUSAL, C_BWD_EVEN, C_BWD_FP16,
                    C_BWD_TILES, C_CAUSAL, C_CE_BWD, C_CE_FWD, C_CE_HUGE, C_DENSE, C_FP16, C_FWD_TILES, C_HUGE,
                    C_SMOKE, CE_BACKWARD, OTHER_TILES, PROBE, TILE, TRITON_KERNELS, compile_check)


# ---- trials: reference here (float64), the student's kernels in the worker ------------------------
def _reference(q, k, v, causal, do=None):
    """(O, L, dQ, dK, dV) in float64 by torch's SDPA and autograd."""
    import torch
    import torch.nn.functional as F

    ref = [t.double().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*ref, is_causal=causal)
    hidden = torch.full((q.shape[1], k.shape[1]), -torch.inf, dtype=torch.float64).triu(1) if causal else 0.0
    lse = torch.logsumexp(ref[0].detach() @ ref[1].detach().transpose(1, 2) / q.shape[-1] ** 0.5 + hidden, -1)
    grads = (None,) * 3
    if do is not None:
        out.backward(do.double())
        grads = tuple(r.grad for r in ref)
    return out.detach(), lse, *grads


def attention_forward(ctx, bh, seq_q, seq_k, d, *, causal=False, dtype="fp32", seed=0, scale=1.0,
                      max_elements=None, tile=(TILE, TILE)):
    from scaletrain.testing import TOLERANCE, assert_close

    q, k, v = attention_inputs(bh, seq_q, seq_k, d, dtype, seed, scale)
    out, lse, *_ = _reference(q, k, v, causal)
    what = f"attention forward {bh}x{seq_q}x{seq_k}x{d} causal={causal} {dtype}"
    o, lse_got = sized(ctx.untrusted().call(PROBE + "run", "attention_fwd", [q, k, v, causal, None, *tile],
                                            interpret=ctx.device != "cuda", device=ctx.device,
                                            max_elements=max_elements), 2, f"{what}: (O, L)")
    assert_close(o, out, rtol=TOLERANCE[dtype_of(dtype)], what=f"{what}: O")
    assert_close(lse_got, lse, rtol=TOLERANCE["float32"], what=f"{what}: log-sum-exp L")


def attention_backward(ctx, bh, seq, d, *, causal=False, dtype="fp32", seed=0, tile=(TILE, TILE), dq_atomics=False):
    import torch
    from scaletrain.ops.testing import attention_grad_atol
    from scaletrain.testing import TOLERANCE, assert_close

    q, k, v = attention_inputs(bh, seq, seq, d, dtype, seed)
    do = torch.randn(bh, seq, d, generator=torch.Generator().manual_seed(seed + 1)).to(q.dtype)
    out, lse, dq, dk, dv = _reference(q, k, v, causal, do)
    got = ctx.untrusted().call(PROBE + "run", "attention_bwd",
                               [do, q, k, v, out.to(q.dtype), lse.float(), causal, None, *tile],
                               interpret=ctx.device != "cuda", device=ctx.device, dq_atomics=dq_atomics)
    tol, what = 4 * TOLERANCE[dtype_of(dtype)], f"attention backward {bh}x{seq}x{d} causal={causal} {dtype}"
    what += f" tile={tuple(tile)}" + (" dQ by atomic adds" if dq_atomics else "")
    atol = attention_grad_atol(q, k, v, do, storage=q.dtype)  # derived: where dS = P (dP - D) cancels
    for name, (g, ref) in zip(("dQ", "dK", "dV"), paired(got, (dq, dk, dv), f"{what}: (dQ, dK, dV)"), strict=True):
        assert_close(g, ref, rtol=tol, atol=atol[name], what=f"{what}: {name}")


def cross_entropy_trial(ctx, rows, vocab, *, smoothing, part: str, dtype="fp32", seed=0, scale=3.0, block_v=64,
                        grad_tol=None):
    """part "fwd": the loss per row and L; "bwd": dlogits, from the reference's L (each graded alone)."""
    import torch
    import torch.nn.functional as F
    from scaletrain.testing import TOLERANCE, assert_close

    x, target, dloss = cross_entropy_inputs(rows, vocab, dtype, seed, scale)
    ref = x.double().requires_grad_()
    loss = F.cross_entropy(ref, target, label_smoothing=smoothing, reduction="none")
    loss.backward(dloss.double())
    lse = torch.logsumexp(ref.detach(), 1)
    worker, kw = ctx.untrusted(), dict(interpret=ctx.device != "cuda", device=ctx.device)
    what = f"cross-entropy {rows}x{vocab} eps={smoothing} {dtype}"
    if part == "fwd":
        got_loss, got_lse = sized(worker.call(PROBE + "run", "cross_entropy_fwd", [x, target, smoothing, -100, block_v],
                                              **kw), 2, f"cross-entropy {rows}x{vocab}: (loss, L)")
        assert_close(got_loss, loss.detach(), rtol=TOLERANCE["float32"], what=f"{what}: loss per row")
        valid = target != -100
        assert_close(got_lse[valid], lse[valid], rtol=TOLERANCE["float32"], what=f"{what}: L")
        return
    dx = worker.call(PROBE + "run", "cross_entropy_bwd", [x, target, lse.float(), dloss, smoothing, -100, block_v],
                     **kw)
    assert_close(dx, ref.grad, rtol=grad_tol or 4 * TOLERANCE[dtype_of(dtype)], what=f"{what}: dlogits")


def _start(ctx):
    """The worker, forked before this process has threads of its own (torch makes some)."""
    ctx.untrusted().start()


def group_smoke(ctx):
    _start(ctx)
    seeds = checks.trial_seeds(6)
    with ctx.check(C_SMOKE):
        attention_forward(ctx, 3, 17, 17, 16, seed=seeds[0])
        attention_forward(ctx, 1, 20, 33, 24, seed=seeds[1])  # seq_q != seq_k, head dim not a power of 2
    with ctx.check(C_HUGE):
        for causal in (False, True):  # scores ~ 1e4: exp overflows unshifted (the public test's: causal)
            attention_forward(ctx, 1, 40, 40, 16, causal=causal, seed=seeds[2], scale=400.0)
    with ctx.check(C_CAUSAL):  # the last two: the public tests' (issue 27)
        for bh, seq, d, seed in ((3, 1, 16, seeds[3]), (1, 33, 16, seeds[4]), (1, 129, 16, seeds[5]),
                                 (1, 1, 16, seeds[0]), (1, 33, 24, seeds[1])):
            attention_forward(ctx, bh, seq, seq, d, causal=True, seed=seed)
    with ctx.check(C_DENSE):  # n^2 = 9216 elements per head vs n d = 1536 for Q
        attention_forward(ctx, 1, 96, 96, 16, causal=True, seed=seeds[0], max_elements=96 * 96 // 2)


def group_attention(ctx):
    _start(ctx)
    seeds = checks.trial_seeds(6, salt=1)
    with ctx.check(C_FP16):
        attention_forward(ctx, 3, 17, 17, 32, dtype="fp16", seed=seeds[0])
    with ctx.check(C_BF16):
        attention_forward(ctx, 1, 33, 33, 64, causal=True, dtype="bf16", seed=seeds[1])
    with ctx.check(C_FWD_TILES):
        for tile in OTHER_TILES:
            attention_forward(ctx, 1, 45, 45, 16, causal=True, seed=seeds[2], tile=tile)
            attention_forward(ctx, 2, 20, 37, 24, seed=seeds[3], tile=tile)
    with ctx.check(C_BWD):
        attention_backward(ctx, 3, 17, 16, seed=seeds[2])
        attention_backward(ctx, 1, 1, 16, seed=seeds[3])
        attention_backward(ctx, 1, 40, 24, seed=seeds[4])
    with ctx.check(C_BWD_EVEN):
        attention_backward(ctx, 2, 32, 16, seed=seeds[5])
        attention_backward(ctx, 1, 48, 16, causal=True, seed=seeds[0])
    with ctx.check(C_BWD_CAUSAL):
        attention_backward(ctx, 1, 33, 16, causal=True, seed=seeds[5])
    with ctx.check(C_BWD_FP16):
        attention_backward(ctx, 3, 17, 32, causal=True, dtype="fp16", seed=seeds[0])
        attention_backward(ctx, 1, 33, 16, causal=True, dtype="fp16", seed=seeds[2])  # the public test's
    with ctx.check(C_BWD_BF16):
        attention_backward(ctx, 1, 20, 16, causal=True, dtype="bf16", seed=seeds[1])
    with ctx.check(C_BWD_TILES):
        for tile in OTHER_TILES:
            attention_backward(ctx, 1, 45, 16, causal=True, seed=seeds[4], tile=tile)
            attention_backward(ctx, 2, 21, 24, seed=seeds[5], tile=tile)
    with ctx.check(C_BWD_ATOMIC):  # the last: the public test's
        attention_backward(ctx, 2, 21, 24, seed=seeds[3], tile=(32, 16), dq_atomics=True)
        attention_backward(ctx, 3, 17, 32, causal=True, dtype="fp16", seed=seeds[1], dq_atomics=True)
        attention_backward(ctx, 1, 45, 16, causal=True, seed=seeds[2], tile=(16, 32), dq_atomics=True)
        attention_backward(ctx, 1, 33, 16, causal=True, seed=seeds[4], tile=(16, 32), dq_atomics=True)


def group_cross_entropy(ctx):
    _start(ctx)
    seeds = checks.trial_seeds(4, salt=2)
    cases = (dict(rows=5, vocab=1000, smoothing=0.1, seed=seeds[0]),
             dict(rows=7, vocab=17, smoothing=0.0, dtype="fp16", seed=seeds[1]),
             dict(rows=3, vocab=129, smoothing=0.2, dtype="bf16", seed=seeds[2]),
             dict(rows=3, vocab=17, smoothing=0.0, seed=seeds[3]))  # the public test's
    for name, part in ((C_CE_FWD, "fwd"), (C_CE_BWD, "bwd")):
        with ctx.check(name):
            for case in cases:
                cross_entropy_trial(ctx, part=part, **case)
    with ctx.check(C_CE_HUGE):
        # L near 4000 is itself rounded to fp32 (ulp 2.4e-4): exp(x - L) carries ~1e-4 relative error
        for part in ("fwd", "bwd"):
            cross_entropy_trial(ctx, 4, 300, smoothing=0.1, part=part, scale=4000.0, seed=seeds[3], grad_tol=1e-3)


def group_compile_triton(ctx):
    worker = ctx.untrusted()
    extra = {"1b.2": [BACKWARD_DQ], "1b.3": [CE_BACKWARD]}
    for task, kernel in TRITON_KERNELS.items():
        with ctx.check(compile_check(task)):
            for stem, name in [kernel, *extra.get(task, [])]:
                worker.call(PROBE + "compile_triton", stem, name)
