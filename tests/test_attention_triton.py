"""FlashAttention's Triton kernels (kernels/attention_triton.py) on CPU through the Triton
interpreter against torch.nn.functional.scaled_dot_product_attention in float64, forward and
dq, dk, dv; the tiny GPT on the fused attention, cross-entropy and embedding with torch's loss;
every Triton kernel of module 1b (attention, cross-entropy, embedding) built for sm_80 by
Triton's compiler and the CUDA sources (attention.cu, cross_entropy.cu) by nvcc (their numbers are
checked in the CPU emulator by test_attention_cuda_cpu.py); the GPU runs
carry the `gpu` marker.

Irregular, small shapes: the interpreter costs ~1 ms of Python per tile step.  Sequence 1, 17
and 129 with 16- or default-sized tiles, so rows and columns end inside a tile; batch x heads odd.
"""

import importlib.util
import shutil

import pytest
import torch
import torch.nn.functional as F

from scaletrain.ops.toolchain import nvcc
from scaletrain.ops.backends import KERNELS_DIR
from scaletrain.ops.toolchain.isolated import IsolatedWorker
from scaletrain.ops.testing import attention_grad_atol
from scaletrain.testing import TOLERANCE, assert_close

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the triton package is not installed (Linux x86-64 only)")


# ---- cases: run inside the interpreter worker -------------------------------------------------
def _reference(q, k, v, do, causal):
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*ref, is_causal=causal)
    out.backward(do.double())
    hidden = torch.full((q.shape[-2], k.shape[-2]), -torch.inf, dtype=torch.float64, device=q.device).triu(1) if causal else 0.0
    lse = torch.logsumexp(ref[0].detach() @ ref[1].detach().transpose(-1, -2) / q.shape[-1] ** 0.5 + hidden, -1)
    return out.detach(), lse, [r.grad for r in ref]


def kernel_case(bh, seq_q, seq_k, d, causal, dtype, block, seed=0):
    """The kernels' wrappers with explicit tiles: O, L and dQ, dK, dV."""
    from scaletrain.ops.backends import load_kernel_module
    kernels = load_kernel_module(KERNELS_DIR / "attention_triton.py")
    torch.manual_seed(seed)
    q, k, v = (torch.randn(bh, s, d).to(dtype) for s in (seq_q, seq_k, seq_k))
    do = torch.randn(bh, seq_q, d).to(dtype)
    o, lse = kernels.attention_fwd(q, k, v, causal, block_m=block, block_n=block)
    dq, dk, dv = kernels.attention_bwd(do, q, k, v, o, lse, causal, block_m=block, block_n=block)
    out, lse_ref, grads = _reference(q, k, v, do, causal)
    tol = TOLERANCE[dtype]
    assert_close(o, out, rtol=tol, what=f"O {bh}x{seq_q}x{seq_k}x{d} causal={causal} {dtype}")
    assert_close(lse, lse_ref, rtol=TOLERANCE[torch.float32], what="L")
    atol = attention_grad_atol(q, k, v, do, storage=dtype)  # where dS = P (dP - D) cancels (one key)
    for name, got, ref in zip(("dQ", "dK", "dV"), (dq, dk, dv), grads):
        assert_close(got, ref, rtol=4 * tol, atol=atol[name], what=name)


def atomic_dq_case(bh, seq_q, seq_k, d, causal, dtype, block_m, block_n, seed=3, device="cpu"):
    """DQ_BY_ATOMICS (FlashAttention-2's design), through `bench attention`'s "triton atomic dq"
    backend: dQ from the dK/dV kernel's atomic adds agrees with the dq kernel's and float64 SDPA's,
    dK and dV are the same bits, the dq kernel never runs, and the switch is off again after."""
    from scaletrain.ops.attention_benchmark import atomic_dq_backend
    from scaletrain.ops.backends import load_kernel_module
    kernels = load_kernel_module(KERNELS_DIR / "attention_triton.py")
    torch.manual_seed(seed)
    q, k, v = (torch.randn(bh, s, d).to(device, dtype) for s in (seq_q, seq_k, seq_k))
    do = torch.randn(bh, seq_q, d).to(device, dtype)
    o, lse = kernels.attention_fwd(q, k, v, causal, block_m=block_m, block_n=block_n)
    two = kernels.attention_bwd(do, q, k, v, o, lse, causal, block_m=block_m, block_n=block_n)
    dq_kernel, launches = kernels.attention_bwd_dq_kernel, []

    class Counted:
        def __getitem__(self, grid):
            launches.append(grid)
            return dq_kernel[grid]
    try:
        kernels.attention_bwd_dq_kernel = Counted()
        atomic = atomic_dq_backend().bwd(do, q, k, v, o, lse, causal, None, block_m, block_n)
    finally:
        kernels.attention_bwd_dq_kernel = dq_kernel
    assert not launches, "atomics on: the dq kernel must not be launched"
    assert not kernels.DQ_BY_ATOMICS, "the default stays the two-kernel backward"
    assert atomic[0].dtype == dtype
    if device == "cpu":  # the interpreter runs dK and dV's code as it stands in both programs: the same bits
        assert torch.equal(atomic[1], two[1]) and torch.equal(atomic[2], two[2])
    else:  # two programs compiled apart (ATOMIC_DQ is a constexpr): allowed their own instruction order
        for got, ref, name in ((atomic[1], two[1], "dK"), (atomic[2], two[2], "dV")):
            assert_close(got, ref, rtol=TOLERANCE[dtype], what=f"{name} with dQ by atomics against without")
    # one rounding to the storage type apart (the atomic sum is cast once, at the end)
    assert_close(atomic[0], two[0], rtol=TOLERANCE[dtype], what="dQ by atomics against the dq kernel's")
    _, _, grads = _reference(q, k, v, do, causal)
    atol = attention_grad_atol(q, k, v, do, storage=dtype)
    assert_close(atomic[0], grads[0], rtol=4 * TOLERANCE[dtype], atol=atol["dQ"], what="dQ by atomics")


def autograd_case(lead, seq, d, causal, dtype, seed=1):
    """Through scaletrain.ops.attention (default tiles): reshapes, the Function, the saved L."""
    from scaletrain.ops import attention
    torch.manual_seed(seed)
    q, k, v = (torch.randn(*lead, seq, d).to(dtype).requires_grad_() for _ in range(3))
    do = torch.randn(*lead, seq, d).to(dtype)
    attention(q, k, v, causal=causal, backend="triton").backward(do)
    out, _, grads = _reference(q, k, v, do, causal)
    tol = TOLERANCE[dtype]
    assert_close(attention(q, k, v, causal=causal, backend="triton"), out, rtol=tol)
    atol = attention_grad_atol(q, k, v, do, storage=dtype)
    for name, got, ref in zip("QKV", (q, k, v), grads):
        assert_close(got.grad, ref, rtol=4 * tol, atol=atol[f"d{name}"], what=f"d{name}")


def huge_scores_case():
    """Scores near 1e4: without the running max exp() overflows to inf (fp32 max ~ 3.4e38)."""
    from scaletrain.ops.backends import load_kernel_module
    kernels = load_kernel_module(KERNELS_DIR / "attention_triton.py")
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 40, 16) for _ in range(3))
    q = q * 400
    o, _ = kernels.attention_fwd(q, k, v, True, block_m=16, block_n=16)
    assert_close(o, F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True))


@pytest.fixture(scope="module")
def interp():
    with IsolatedWorker({"TRITON_INTERPRET": "1"}, timeout_s=300) as worker:
        yield worker.run


@needs_triton
def test_kernels_on_irregular_lengths_and_dtypes(interp):
    interp(kernel_case, 3, 17, 17, 16, False, torch.float32, 16)   # two tiles, the second holds one row
    interp(kernel_case, 3, 1, 1, 16, True, torch.float32, 16)      # one query, one key
    interp(kernel_case, 3, 17, 40, 24, False, torch.float16, 16)   # seq_q != seq_k, head dim not a power of 2
    interp(kernel_case, 1, 33, 33, 64, True, torch.bfloat16, 16)   # causal: the diagonal inside a tile


@needs_triton
@pytest.mark.parametrize("bh,seq_q,seq_k,d,causal,dtype,block_m,block_n", [
    (3, 17, 40, 24, False, torch.float32, 16, 32),   # seq_q != seq_k, ragged, head dim not a power of 2
    (1, 45, 45, 16, True, torch.float32, 16, 32),    # causal: two query tiles per key tile
    (2, 33, 33, 16, True, torch.float16, 32, 16),    # causal, the cast of the fp32 sum to fp16
])
def test_dq_by_atomic_adds_matches_the_dq_kernel(interp, bh, seq_q, seq_k, d, causal, dtype, block_m, block_n):
    interp(atomic_dq_case, bh, seq_q, seq_k, d, causal, dtype, block_m, block_n)


@needs_triton
def test_causal_129_through_autograd(interp):
    interp(autograd_case, (1, 3), 129, 32, True, torch.float32)    # 3 tiles of 64, the last holds one row


@needs_triton
def test_online_softmax_survives_huge_scores(interp):
    interp(huge_scores_case)


# ---- the tiny GPT on the fused ops -----------------------------------------------------------
def fused_gpt_loss(model, idx, targets, backend):
    """scaletrain.models.GPT.forward with its embedding, attention and criterion replaced by
    scaletrain.ops' fused ones (the same parameters, so the same function of them)."""
    from scaletrain.ops import attention, cross_entropy, embedding
    b, s = idx.shape
    x = embedding(idx, model.wte.weight, model.wpe.weight, backend=backend)
    for block in model.blocks:
        h = block.ln1(x)
        q, k, v = (t.view(b, s, block.attn.n_head, -1).transpose(1, 2) for t in block.attn.qkv(h).split(h.shape[-1], 2))
        y = attention(q, k, v, causal=True, backend=backend).transpose(1, 2).reshape(b, s, -1)
        x = x + block.attn.proj(y)
        x = x + block.mlp(block.ln2(x))
    return cross_entropy(model.lm_head(model.ln_f(x)), targets, backend=backend)


def gpt_case():
    from scaletrain.models import GPT, GPTConfig, make_batch
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=67, block_size=33, n_layer=2, n_head=3, n_embd=48)
    model = GPT(cfg, seed=0).double()  # float64: the reference's rounding far below fp32's tolerance
    idx, targets = make_batch(cfg, 3, seed=1)
    _, expected = model(idx, targets)
    expected.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.float()
    loss = fused_gpt_loss(model, idx, targets, "triton")
    loss.backward()
    assert_close(loss, expected, rtol=TOLERANCE[torch.float32], what="GPT loss on the fused ops")
    for name, p in model.named_parameters():
        assert_close(p.grad, grads[name], rtol=1e-4, what=f"d{name}")


@needs_triton
def test_tiny_gpt_on_the_fused_ops_has_torchs_loss_and_gradients(interp):
    interp(gpt_case)


# ---- builds: every kernel of module 1b compiles for sm_80 -------------------------------------
def _compile_module_1b():
    from scaletrain.ops.toolchain.attention_compile import compile_fused
    from scaletrain.ops.backends import load_kernel_module
    rows = []
    for name in ("attention_triton.py", "cross_entropy_triton.py", "embedding_triton.py"):
        rows += compile_fused(load_kernel_module(KERNELS_DIR / name))
    return [(r["kernel"], r["shared_bytes"], round(r["seconds"], 1)) for r in rows]


@needs_triton
def test_triton_kernels_compile_for_sm80():
    """attention, cross-entropy and embedding kernels in one compiler process (a worker costs seconds)."""
    from scaletrain.ops.toolchain.attention_compile import SIGNATURES
    with IsolatedWorker({"TRITON_INTERPRET": "0"}, timeout_s=300) as worker:
        rows = worker.run(_compile_module_1b)
    for row in rows:
        print(row)
    assert {r[0] for r in rows} == set(SIGNATURES)
    assert all(shared <= 164 * 1024 for _, shared, _ in rows)  # fits an A100's shared memory


def _launch_local_memory():
    from scaletrain.ops.backends import load_kernel_module
    from scaletrain.ops.toolchain.attention_compile import launch_local_memory
    kernels = load_kernel_module(KERNELS_DIR / "attention_triton.py")
    return [row for d in (64, 128) for row in launch_local_memory(kernels, torch.float32, d)]


@needs_triton
def test_gpu_launches_keep_their_tiles_in_registers():
    """fp32 attention as the launcher configures it for a GPU (tiles, dot precision, warps), built for
    sm_90: a thread keeps at most a few registers' worth in local memory. With exact "ieee" dots at
    64 x 64 tiles the backward kept 8-19 KB (Triton 3.6; the likely cause of the fused GPT-2 step's
    3.9x). 16-bit launches keep none (64 x 64, head dim 64 and 128, Triton 3.6 and 3.9)."""
    with IsolatedWorker({"TRITON_INTERPRET": "0"}, timeout_s=300) as worker:
        rows = worker.run(_launch_local_memory)
    for row in rows:
        print(row)
    assert {(r["dtype"], r["head_dim"]) for r in rows} == {("fp32", 64), ("fp32", 128)}
    assert all(r["local_bytes"] <= 128 for r in rows), [r for r in rows if r["local_bytes"] > 128]
    assert {r["DOT_PRECISION"] for r in rows} == {"tf32x3"}  # fp32-accurate, on the tensor cores


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: CUDA sources not compiled here")
def test_cuda_sources_compile_for_sm80_without_spills():
    """attention.cu (forward, dQ and dK/dV kernels for head-dim buckets 32, 64, 128 x causal or not,
    and the delta kernel: 19) and cross_entropy.cu
    (forward, backward), fp32 instances, compiled in parallel; a spill fails."""
    files = [KERNELS_DIR / "attention.cu", KERNELS_DIR / "cross_entropy.cu"]
    procs = nvcc.start(files)
    for path, kernels in zip(files, (19, 2)):
        report = nvcc.finish(procs, path.name)
        for mangled, (regs, spills) in report.items():
            print(f"  {regs:>4} registers  {spills:>3} B spilled  {mangled[:90]}")
        assert len(report) == kernels, path.name


# ---- GPU: executed kernels (not run on CPU machines) ------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seq,d,causal", [(1, 16, True), (129, 64, True), (1000, 128, False), (257, 80, True)])
def test_gpu_matches_sdpa(backend, dtype, seq, d, causal):
    from scaletrain.ops import attention
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 5, seq, d, device="cuda").to(dtype).requires_grad_() for _ in range(3))
    do = torch.randn_like(q)
    attention(q, k, v, causal=causal, backend=backend).backward(do)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*ref, is_causal=causal)
    out.backward(do.double())
    tol = TOLERANCE[dtype] * (4 if dtype == torch.float32 else 1)
    assert_close(attention(q, k, v, causal=causal, backend=backend), out, rtol=tol)
    atol = attention_grad_atol(q, k, v, do, storage=dtype)  # sequence 1: dQ, dK are 0 in float64 (H200: 5e-7)
    for name, got, r in zip("QKV", (q, k, v), ref):
        assert_close(got.grad, r.grad, rtol=8 * tol, atol=atol[f"d{name}"], what=f"d{name}")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_dq_by_atomic_adds_under_real_concurrency(causal):
    """On a GPU the key tiles' programs run at once and race to add into the same dQ rows (the
    interpreter runs them one after another): 32 key tiles a head, every contribution kept."""
    atomic_dq_case(32, 2048, 2048, 64, causal, torch.float16, 64, 64, device="cuda")


@pytest.mark.gpu
def test_gpu_speed_targets():
    """Issue 17's targets: >= 2x torch's math path at n >= 1024, >= 0.7x its flash path forward at
    the size a1b grades (attention_benchmark.GRADED, n = 4096), peak memory of forward + backward
    O(n).  At n = 1024 the flash target is not claimed: the H200 (2026-11-27) measured 0.43-0.44x
    there (0.77x at 4096) with the untuned 64 x 64 tiles, 16 key tiles per program (issue 29)."""
    from scaletrain.ops.attention_benchmark import GRADED, speed_rows
    rows = speed_rows(ns=(1024, GRADED["n"]), dtype=torch.float16, reps=10)
    for row in (r for r in rows if r["impl"] == "triton"):  # the CUDA kernels: test_attention_mma_gpu.py
        print(row)
        assert row["vs math"] >= 2.0, row
        if row["direction"] == "fwd" and row["n"] == GRADED["n"]:
            assert row["vs flash"] >= 0.7, row
    peak = {r["n"]: r["peak MB"] for r in rows if r["impl"] == "triton" and r["direction"] == "fwd+bwd"}
    assert peak[GRADED["n"]] / peak[1024] < 6, f"memory must grow as O(n) (x4), not O(n^2) (x16): {peak}"
