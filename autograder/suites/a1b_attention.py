"""Assignment a1b: FlashAttention forward and backward, and the fused cross-entropy, in Triton.

Every group is *trusted* (`Group.trusted`), as in a1: this module never imports the submission.
The sandboxed worker (autograder/probes/a1b_attention.py) launches the student's kernels through
the grader's own copy of the given wrappers into NaN-filled outputs; inputs go over as data,
outputs come back, and the reference -- float64 torch (scaled_dot_product_attention,
cross_entropy), computed here before the student's call -- and the verdicts stay here.

Graded on any machine: without a GPU the kernels run through the Triton interpreter, and each is
compiled for sm_80 by Triton's compiler.  On a GPU the speed group times the kernels against
torch's SDPA math and flash paths (`not_run` on CPU, points pending).
Correctness: seeded trials on irregular lengths (1, 17, 33, 129: rows and columns ending inside
a 16-wide tile), odd batch x heads, causal and not, fp32 / fp16 / bf16, scores near 1e4 (a
running max is needed), logits near 1e4; max-norm relative error (scaletrain.testing).
A task's compile check is granted only when its kernels' correctness checks passed in the same run
(`Check.needs`, `grade.with_values`): an empty kernel compiles too.
Anti-cheat: no attention / softmax / loss library call in the student files (static check) and
none at run time (a TorchDispatchMode flags aten's kernels), and the check "keeps no n x n
matrix" flags any tensor of n x n elements made during the kernel call.
"""

from __future__ import annotations

import time

from autograder import checks
from autograder.attacks import kernel_attacks
from autograder.manifest import REPO, Check, Group, Manifest, Planted, Task
from autograder.suites import paired, sized

AT, CE = "attention_triton.py", "cross_entropy_triton.py"
_S = "autograder.suites.a1b_attention"
PROBE = "autograder.probes.a1b_attention:"
TILE = 16  # the interpreter trials' tile: short sequences still cross several tiles

_FORBIDDEN = ("torch.softmax", "torch.log_softmax", "torch.logsumexp", "torch.nn", "torch.special", "torch.ops",
              "torch._C", "torch.Tensor.softmax", "torch.Tensor.logsumexp", "scaled_dot_product_attention",
              "scaletrain.ops", "importlib", "__import__", "exec", "eval", "runpy")

C_SMOKE = "attention forward on small irregular shapes"
C_HUGE = "attention forward: scores near 1e4 stay finite (running max)"
C_CAUSAL = "attention forward, causal: the diagonal inside a tile, sequence 1 and 129"
C_DTYPES = "attention forward with fp16 and bf16 storage"
C_DENSE = "attention forward keeps no n x n score matrix"
C_BWD = "attention backward dq, dk, dv on irregular shapes"
C_BWD_CAUSAL = "attention backward, causal, fp16 and bf16"
C_CE = "cross-entropy forward and backward: label smoothing, ignore_index, irregular vocabularies"
C_CE_HUGE = "cross-entropy on logits near 1e4 over several vocabulary chunks"
TRITON_KERNELS = {"1b.1": ("attention_triton", "attention_fwd_kernel"),
                  "1b.2": ("attention_triton", "attention_bwd_dkdv_kernel"),
                  "1b.3": ("cross_entropy_triton", "cross_entropy_fwd_kernel")}
# a task's compile check is granted only with its kernels' correctness in the same run: an empty kernel compiles
COMPUTES = {"1b.1": (C_SMOKE, C_CAUSAL), "1b.2": (C_BWD, C_BWD_CAUSAL), "1b.3": (C_CE,)}
BACKWARD_DQ = ("attention_triton", "attention_bwd_dq_kernel")
CE_BACKWARD = ("cross_entropy_triton", "cross_entropy_bwd_kernel")
SPEED = {"1b.1": "FlashAttention forward speed: >= 2x SDPA's math path, >= 0.7x its flash path (n = 4096, fp16)",
         "1b.2": "FlashAttention forward + backward speed: >= 2x SDPA's math path (n = 4096, fp16)"}


def _compile_check(task: str) -> str:
    return f"{task} kernels compile for sm_80 (Triton compiler)"


# A launcher patched at import to compute attention in torch, the scores materialized (n x n).
_DENSE = '''

_launch = type(attention_fwd_kernel).__getitem__


def _dense(self, grid):
    if getattr(getattr(self, "fn", None), "__name__", "") != "attention_fwd_kernel":
        return _launch(self, grid)

    def run(q, k, v, o, lse, seq_q, seq_k, head_dim, scale, **meta):
        s = torch.matmul(q.float(), k.float().transpose(1, 2)) * scale
        if meta["CAUSAL"]:
            s = s.masked_fill(torch.ones(seq_q, seq_k, dtype=torch.bool).triu(1), float("-inf"))
        m = s.amax(-1, keepdim=True)
        lse.copy_((m + (s - m).exp().sum(-1, keepdim=True).log()).squeeze(-1))
        o.copy_(torch.matmul((s - lse[..., None]).exp(), v.float()))
    return run


type(attention_fwd_kernel).__getitem__ = _dense
'''

MANIFEST = Manifest(
    assignment="a1b", folder="a1b_attention", title="FlashAttention and the fused cross-entropy",
    files={AT: "kernels/attention_triton.py", CE: "kernels/cross_entropy_triton.py"},
    tasks=(
        Task("1b.1", "FlashAttention forward: online softmax over key tiles, the causal skip", file=AT,
             functions=("attention_fwd_kernel",)),
        Task("1b.2", "FlashAttention backward: P recomputed from the log-sum-exp", file=AT,
             functions=("attention_bwd_dkdv_kernel", "attention_bwd_dq_kernel")),
        Task("1b.3", "Fused cross-entropy with label smoothing, forward and backward", file=CE,
             functions=("cross_entropy_fwd_kernel", "cross_entropy_bwd_kernel")),
    ),
    forbidden={AT: _FORBIDDEN, CE: _FORBIDDEN},
    groups=(
        Group("smoke", f"{_S}:group_smoke", timeout_s=120, trusted=True, checks=(
            Check("1b.1", C_SMOKE, 8),
            Check("1b.1", C_HUGE, 4),
            Check("1b.1", C_CAUSAL, 8),
            Check("1b.1", C_DENSE, 4),
        )),
        Group("attention", f"{_S}:group_attention", timeout_s=240, trusted=True, checks=(
            Check("1b.1", C_DTYPES, 4),
            Check("1b.2", C_BWD, 14),
            Check("1b.2", C_BWD_CAUSAL, 10),
        )),
        Group("cross_entropy", f"{_S}:group_cross_entropy", timeout_s=120, trusted=True, checks=(
            Check("1b.3", C_CE, 10),
            Check("1b.3", C_CE_HUGE, 4),
        )),
        Group("compile_triton", f"{_S}:group_compile_triton", timeout_s=300, trusted=True, checks=tuple(
            Check(task, _compile_check(task), 2, needs=COMPUTES[task]) for task in TRITON_KERNELS)),
        Group("gpu_speed", f"{_S}:group_gpu_speed", timeout_s=600, needs_gpu=True, trusted=True, checks=(
            Check("1b.1", SPEED["1b.1"], 10),
            Check("1b.2", SPEED["1b.2"], 8),
        )),
    ),
    planted=(
        Planted("no running max (exp overflows on large scores)", AT,
                ("m_new = tl.maximum(m_i, tl.max(s, axis=1))", "m_new = tl.zeros((BLOCK_M,), tl.float32)"),
                groups=("smoke",), expect={C_SMOKE: "passed", C_HUGE: "failed"}),
        Planted("causal mask off by one (hides the diagonal)", AT,
                ("hidden = hidden | (offs_n[None, :] > offs_m[:, None])",
                 "hidden = hidden | (offs_n[None, :] >= offs_m[:, None])"),
                # the backward shares the mask: the public causal backward test fails too (issue 27)
                groups=("smoke", "attention"),
                expect={C_SMOKE: "passed", C_CAUSAL: "failed", C_BWD: "passed", C_BWD_CAUSAL: "failed"}),
        # the launcher patched at import computes in torch beside a kernel that stores zeros: the
        # grader takes only the file's @triton.jit functions, so the patch never runs, and the kernel,
        # which compiles, earns no compile points without its values (issue 28)
        Planted("a launcher patched at import to compute in torch, the kernel storing zeros", AT,
                (("    o = acc / l_i[:, None]\n", "    o = acc * 0.0\n"),
                 ("\n\ndef attention_tiles(", _DENSE + "\n\ndef attention_tiles(")),
                groups=("smoke", "compile_triton"),
                expect={C_SMOKE: "failed", C_CAUSAL: "failed", _compile_check("1b.1"): "failed"}),
        Planted("calls scaled_dot_product_attention", AT,
                ("    o = torch.empty_like(q)\n",
                 "    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)\n"),
                groups=("smoke",), expect={C_SMOKE: "flagged", C_CAUSAL: "flagged"}),
        Planted("backward without the rowsum(dO * O) term", AT,
                ("        ds = p * (dp - delta[:, None])\n", "        ds = p * dp\n"),
                groups=("attention",), expect={C_BWD: "failed", C_DTYPES: "passed"}),
        Planted("infinite loop in the forward kernel", AT,
                ("    o = acc / l_i[:, None]\n", "    while True:\n        pass\n    o = acc / l_i[:, None]\n"),
                groups=("smoke",), expect={C_SMOKE: "timeout"},
                timeout_s=10),  # the plant hangs: no need to wait the group's limit
        *(Planted(name, AT, replace, groups=("smoke",), expect={C_SMOKE: outcome})
          for name, (replace, outcome) in kernel_attacks(
              file=AT, kernel="attention_fwd_kernel", anchor="\n\ndef attention_tiles(",
              result_line="    o = acc / l_i[:, None]\n", result="o", zero="acc * 0.0",
              checks=[C_SMOKE, C_HUGE], source=str(REPO / "kernels" / AT)).items()),
    ),
)


# ---- trials: reference here (float64), the student's kernels in the worker ------------------------
def _dtype(name):
    import torch
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


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


def _inputs(bh, seq_q, seq_k, d, dtype, seed, scale=1.0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(bh, s, d, generator=gen).to(_dtype(dtype)) for s in (seq_q, seq_k, seq_k))
    return (q * scale).to(q.dtype), k, v


def attention_forward(ctx, bh, seq_q, seq_k, d, *, causal=False, dtype="fp32", seed=0, scale=1.0,
                      max_elements=None):
    from scaletrain.testing import TOLERANCE, assert_close

    q, k, v = _inputs(bh, seq_q, seq_k, d, dtype, seed, scale)
    out, lse, *_ = _reference(q, k, v, causal)
    what = f"attention forward {bh}x{seq_q}x{seq_k}x{d} causal={causal} {dtype}"
    o, lse_got = sized(ctx.untrusted().call(PROBE + "run", "attention_fwd", [q, k, v, causal, None, TILE, TILE],
                                            interpret=ctx.device != "cuda", device=ctx.device,
                                            max_elements=max_elements), 2, f"{what}: (O, L)")
    assert_close(o, out, rtol=TOLERANCE[_dtype(dtype)], what=f"{what}: O")
    assert_close(lse_got, lse, rtol=TOLERANCE["float32"], what=f"{what}: log-sum-exp L")


def attention_backward(ctx, bh, seq, d, *, causal=False, dtype="fp32", seed=0):
    import torch
    from scaletrain.ops.testing import attention_grad_atol
    from scaletrain.testing import TOLERANCE, assert_close

    q, k, v = _inputs(bh, seq, seq, d, dtype, seed)
    do = torch.randn(bh, seq, d, generator=torch.Generator().manual_seed(seed + 1)).to(q.dtype)
    out, lse, dq, dk, dv = _reference(q, k, v, causal, do)
    got = ctx.untrusted().call(PROBE + "run", "attention_bwd",
                               [do, q, k, v, out.to(q.dtype), lse.float(), causal, None, TILE, TILE],
                               interpret=ctx.device != "cuda", device=ctx.device)
    tol, what = 4 * TOLERANCE[_dtype(dtype)], f"attention backward {bh}x{seq}x{d} causal={causal} {dtype}"
    atol = attention_grad_atol(q, k, v, do, storage=q.dtype)  # derived: where dS = P (dP - D) cancels
    for name, (g, ref) in zip(("dQ", "dK", "dV"), paired(got, (dq, dk, dv), f"{what}: (dQ, dK, dV)"), strict=True):
        assert_close(g, ref, rtol=tol, atol=atol[name], what=f"{what}: {name}")


def cross_entropy_trial(ctx, rows, vocab, *, smoothing, dtype="fp32", seed=0, scale=3.0, block_v=64, grad_tol=None):
    import torch
    import torch.nn.functional as F
    from scaletrain.testing import TOLERANCE, assert_close

    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, vocab, generator=gen) * scale).to(_dtype(dtype))
    target = torch.randint(0, vocab, (rows,), generator=gen)
    target[rows // 2] = -100
    ref = x.double().requires_grad_()
    loss = F.cross_entropy(ref, target, label_smoothing=smoothing, reduction="none")
    dloss = torch.rand(rows, generator=gen)
    loss.backward(dloss.double())
    lse = torch.logsumexp(ref.detach(), 1)
    worker, kw = ctx.untrusted(), dict(interpret=ctx.device != "cuda", device=ctx.device)
    got_loss, got_lse = sized(worker.call(PROBE + "run", "cross_entropy_fwd", [x, target, smoothing, -100, block_v],
                                          **kw), 2, f"cross-entropy {rows}x{vocab}: (loss, L)")
    dx = worker.call(PROBE + "run", "cross_entropy_bwd", [x, target, lse.float(), dloss, smoothing, -100, block_v],
                     **kw)
    tol = TOLERANCE[_dtype(dtype)]
    what = f"cross-entropy {rows}x{vocab} eps={smoothing} {dtype}"
    assert_close(got_loss, loss.detach(), rtol=TOLERANCE["float32"], what=f"{what}: loss per row")
    valid = target != -100
    assert_close(got_lse[valid], lse[valid], rtol=TOLERANCE["float32"], what=f"{what}: L")
    assert_close(dx, ref.grad, rtol=grad_tol or 4 * tol, what=f"{what}: dlogits")


# ---- groups -----------------------------------------------------------------------------------
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
    with ctx.check(C_DTYPES):
        attention_forward(ctx, 3, 17, 17, 32, dtype="fp16", seed=seeds[0])
        attention_forward(ctx, 1, 33, 33, 64, causal=True, dtype="bf16", seed=seeds[1])
    with ctx.check(C_BWD):
        attention_backward(ctx, 3, 17, 16, seed=seeds[2])
        attention_backward(ctx, 1, 1, 16, seed=seeds[3])
        attention_backward(ctx, 1, 40, 24, seed=seeds[4])
    with ctx.check(C_BWD_CAUSAL):
        attention_backward(ctx, 1, 33, 16, causal=True, seed=seeds[5])
        attention_backward(ctx, 3, 17, 32, causal=True, dtype="fp16", seed=seeds[0])
        attention_backward(ctx, 1, 20, 16, causal=True, dtype="bf16", seed=seeds[1])
        attention_backward(ctx, 1, 33, 16, causal=True, dtype="fp16", seed=seeds[2])  # the public test's


def group_cross_entropy(ctx):
    _start(ctx)
    seeds = checks.trial_seeds(4, salt=2)
    with ctx.check(C_CE):
        cross_entropy_trial(ctx, 5, 1000, smoothing=0.1, seed=seeds[0])
        cross_entropy_trial(ctx, 7, 17, smoothing=0.0, dtype="fp16", seed=seeds[1])
        cross_entropy_trial(ctx, 3, 129, smoothing=0.2, dtype="bf16", seed=seeds[2])
        cross_entropy_trial(ctx, 3, 17, smoothing=0.0, seed=seeds[3])  # the public test's
    with ctx.check(C_CE_HUGE):
        # L near 4000 is itself rounded to fp32 (ulp 2.4e-4): exp(x - L) carries ~1e-4 relative error
        cross_entropy_trial(ctx, 4, 300, smoothing=0.1, scale=4000.0, seed=seeds[3], grad_tol=1e-3)


def group_compile_triton(ctx):
    worker = ctx.untrusted()
    extra = {"1b.2": [BACKWARD_DQ], "1b.3": [CE_BACKWARD]}
    for task, kernel in TRITON_KERNELS.items():
        with ctx.check(_compile_check(task)):
            for stem, name in [kernel, *extra.get(task, [])]:
                worker.call(PROBE + "compile_triton", stem, name)


# ---- GPU only ---------------------------------------------------------------------------------
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
