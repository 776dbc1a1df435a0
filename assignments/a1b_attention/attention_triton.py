# The file to fill in (handout: README.md here). Staff: generated from kernels/attention_triton.py by `python -m autograder release`; edit the source.
"""FlashAttention forward and backward in Triton: O = softmax(Q K^T * scale) V without the n x n matrix.

Why: the composed attention (scaletrain/ops/attention_naive.py) writes the (n, n) scores S, reads
them back for the softmax, writes P and reads it again for P V: O(n^2) bytes per head, and O(n^2)
memory kept for the backward ("Attention Layer Speed-up", training-speedup-lecture.md).
FlashAttention (Dao et al., 2022) tiles Q into BLOCK_M query rows and K, V into BLOCK_N key
rows and keeps a tile of S on chip; the softmax over a row spans many key tiles, so it is the
online softmax of module 1 (kernels/softmax_triton.py; Milakov & Gimelshein 2018) carried over to
the output: Dao et al. 2022, Algorithm 1, lines 9-12, and Dao 2023, Algorithm 1 (FlashAttention-2
rescales once, at the end). Which running statistics you keep per query row, where they live and
when you rescale are yours to design; the contract is O and the log-sum-exp L of each row.  Each
query tile reads Q once and every K, V tile once, and writes O and L: O(n d) bytes (traffic.py).
The work is split over query tiles (the outer loop of FlashAttention-2, Dao 2023, section 3.1),
so no two programs write the same output and no atomics are needed.  The tile shape (BLOCK_M,
BLOCK_N) is the launcher's (`attention_tiles`); the grader also launches with BLOCK_M != BLOCK_N,
so a kernel must hold for any tile.

Causal (query i sees keys j <= i, torch's is_causal): a query tile [s, s + BLOCK_M) sees no key
at or past s + BLOCK_M, so its key loop stops there -- the fully masked tiles above the
diagonal are never loaded (about half the work).  Rows and columns past the sequence end and
head dims past head_dim are masked, so any length and any head_dim <= BLOCK_D run.

Backward (FlashAttention-2, Dao 2023, Algorithm 2): P is recomputed from Q, K and the saved L
instead of being stored (`_recompute_p`); derive dV, dP, dS, dQ and dK from the chain rule through
the softmax, with the row term D = rowsum(dO * O) (the given delta kernel). One kernel per key tile
accumulates dK, dV over the query tiles (from the first that sees the tile, when causal); another
per query tile accumulates dQ over the key tiles: no atomics, but S and dP computed twice (7
matmuls per tile pair).  DQ_BY_ATOMICS switches to FlashAttention-2's own design (Dao 2023,
section 3.2): the dK/dV kernel also adds each query tile's dS K into an fp32 dQ with atomic adds
(5 matmuls, but dQ's read-modify-write traffic and a summation order that varies from run to
run).  All arithmetic is fp32 (tl.dot accumulates in fp32; P is cast to V's storage type
before P V, as FlashAttention does); storage fp32, fp16 or bf16.

Layout: contiguous (batch * heads, seq, head_dim) tensors; scaletrain.ops.attention reshapes.
Runs on a GPU, or on CPU tensors under the Triton interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

__all__ = ["attention_fwd", "attention_bwd", "attention_tiles"]


@triton.jit
def _load_rows(base, rows, seq, head_dim, offs_d):
    """The (len(rows), BLOCK_D) tile base[rows, :head_dim], zeros outside the sequence and the head dim."""
    ok = (rows[:, None] < seq) & (offs_d[None, :] < head_dim)
    return tl.load(base + rows[:, None] * head_dim + offs_d[None, :], mask=ok, other=0.0)


@triton.jit
def _mm(a, b, DOT_PRECISION: tl.constexpr):
    """a @ b accumulated in fp32.  "upcast": the Triton interpreter multiplies bf16 operands'
    raw uint16 bits (interpreter.py's create_dot), so there bf16 tiles go through fp32."""
    if DOT_PRECISION == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def _mask_scores(s, offs_m, offs_n, seq_k, CAUSAL: tl.constexpr):
    """-inf where the key is past the sequence end or (CAUSAL) in the query's future."""
    hidden = offs_n[None, :] >= seq_k
    if CAUSAL:
        hidden = hidden | (offs_n[None, :] > offs_m[:, None])
    return tl.where(hidden, float("-inf"), s)


# (helpers of your own may go here: top-level @triton.jit functions, which the grader keeps)


@triton.jit
def attention_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, seq_q, seq_k, head_dim, scale,
                         CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """O and L = logsumexp(S) for the BLOCK_M query rows program_id(0) of head program_id(1).

    Contract: `o` (O in fp32, the given store casts it) and `lse` (L, fp32) for these rows, with
    S = Q K^T * scale in fp32 and -inf past seq_k and, when CAUSAL, in each query's future
    (`_mask_scores`); never an (n, n) matrix. Graded: O and L against float64 SDPA on ragged and
    tile-multiple lengths, seq_q != seq_k, causal (the diagonal inside a tile, n = 1), scores near
    1e4, three dtypes, tiles with BLOCK_M != BLOCK_N, each a check of its own. Pitfalls: exp
    overflows without a running max; key tiles entirely in a query tile's future need not be
    loaded (about half the causal work), but the tile on the diagonal does.
    """
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_rows(q_ptr + bh * seq_q * head_dim, offs_m, seq_q, head_dim, offs_d)
    k_base = k_ptr + bh * seq_k * head_dim
    v_base = v_ptr + bh * seq_k * head_dim
    raise NotImplementedError('a1b task 1b.1: implement `attention_fwd_kernel` (see assignments/a1b_attention/README.md)')
    row_ok = offs_m < seq_q
    tl.store(o_ptr + bh * seq_q * head_dim + offs_m[:, None] * head_dim + offs_d[None, :], o,
             mask=row_ok[:, None] & (offs_d[None, :] < head_dim))
    tl.store(lse_ptr + bh * seq_q + offs_m, lse, mask=row_ok)


@triton.jit
def attention_bwd_delta_kernel(o_ptr, do_ptr, delta_ptr, seq_q, head_dim,
                               BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """D = rowsum(dO * O) in fp32 (FlashAttention-2's preprocessing step): the row term of the
    softmax backward, dS = P * (dP - D), computed once instead of in every key tile."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(1).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    o = _load_rows(o_ptr + bh * seq_q * head_dim, offs_m, seq_q, head_dim, offs_d).to(tl.float32)
    do = _load_rows(do_ptr + bh * seq_q * head_dim, offs_m, seq_q, head_dim, offs_d).to(tl.float32)
    tl.store(delta_ptr + bh * seq_q + offs_m, tl.sum(o * do, axis=1), mask=offs_m < seq_q)


@triton.jit
def _recompute_p(q, kt, lse, offs_m, offs_n, seq_q, seq_k, scale,
                 CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """P = exp(Q K^T * scale - L) for one (query tile, key tile), 0 where hidden or past seq_q."""
    s = _mm(q, kt, DOT_PRECISION) * scale
    s = _mask_scores(s, offs_m, offs_n, seq_k, CAUSAL)
    p = tl.exp(s - lse[:, None])
    return tl.where(offs_m[:, None] < seq_q, p, 0.0)


@triton.jit
def attention_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_ptr,
                              seq_q, seq_k, head_dim, scale,
                              CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """dK, dV for the BLOCK_N keys program_id(0) of head program_id(1), over the query tiles.

    Contract: `dk` and `dv` (fp32 accumulators, stored by the given code) of these keys, K and V
    kept on chip, P recomputed per query tile from Q and the saved L (`_recompute_p`), D from
    `delta_ptr`. Causal: query tiles that end before this key tile starts see none of its keys and
    may be skipped; mind that BLOCK_M and BLOCK_N need not be equal.
    ATOMIC_DQ (FlashAttention-2, Dao 2023, Algorithm 2 and section 3.2): `dq_ptr` is an fp32
    (batch * heads, seq_q, head_dim) buffer the wrapper zero-fills; every query tile visited adds
    its share of dQ (these keys' part of dS K * scale) into it, so that when all programs have
    ended dq holds dQ.  Other key tiles' programs add into the same rows at the same time: only
    atomic adds keep every contribution (their order, hence dQ's last bits, varies from run to
    run).  Rows past seq_q and columns past head_dim belong to other rows and heads: never touch
    them.  Without ATOMIC_DQ, dq_ptr is not used (the dq kernel computes dQ).
    """
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_base, do_base = q_ptr + bh * seq_q * head_dim, do_ptr + bh * seq_q * head_dim
    kt = tl.trans(_load_rows(k_ptr + bh * seq_k * head_dim, offs_n, seq_k, head_dim, offs_d))  # (BLOCK_D, BLOCK_N)
    vt = tl.trans(_load_rows(v_ptr + bh * seq_k * head_dim, offs_n, seq_k, head_dim, offs_d))
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    raise NotImplementedError('a1b task 1b.2: implement `attention_bwd_dkdv_kernel` (see assignments/a1b_attention/README.md)')
    out = (offs_n[:, None] < seq_k) & (offs_d[None, :] < head_dim)
    offs = bh * seq_k * head_dim + offs_n[:, None] * head_dim + offs_d[None, :]
    tl.store(dk_ptr + offs, dk, mask=out)
    tl.store(dv_ptr + offs, dv, mask=out)


@triton.jit
def attention_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                            seq_q, seq_k, head_dim, scale,
                            CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """dQ (fp32, stored by the given code) for the BLOCK_M queries program_id(0) of head
    program_id(1), accumulated over the key tiles they see; P recomputed as in the dK/dV kernel."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_rows(q_ptr + bh * seq_q * head_dim, offs_m, seq_q, head_dim, offs_d)
    do = _load_rows(do_ptr + bh * seq_q * head_dim, offs_m, seq_q, head_dim, offs_d)
    lse = tl.load(lse_ptr + bh * seq_q + offs_m, mask=offs_m < seq_q, other=0.0)
    delta = tl.load(delta_ptr + bh * seq_q + offs_m, mask=offs_m < seq_q, other=0.0)
    k_base, v_base = k_ptr + bh * seq_k * head_dim, v_ptr + bh * seq_k * head_dim
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    raise NotImplementedError('a1b task 1b.2: implement `attention_bwd_dq_kernel` (see assignments/a1b_attention/README.md)')
    tl.store(dq_ptr + bh * seq_q * head_dim + offs_m[:, None] * head_dim + offs_d[None, :], dq,
             mask=(offs_m[:, None] < seq_q) & (offs_d[None, :] < head_dim))


def attention_tiles(q: torch.Tensor, block_m: int | None = None, block_n: int | None = None) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D): BLOCK_D = next power of two >= head_dim (>= 16, tl.dot's
    minimum); 64 x 64 tiles by default (FlashAttention-2's choice for head_dim <= 128 on A100)."""
    block_d = max(16, triton.next_power_of_2(q.shape[-1]))
    if q.element_size() == 4 and q.is_cuda:
        # fp32's tf32x3 products hold each operand twice (_precision): tiles whose three kernels keep
        # <= 64 B a thread in local memory at 8 warps (sm_90, Triton 3.6 and 3.9; 64 x 64 keeps ~900 B)
        square = (32, 32) if block_d <= 64 else (16, 32)
    else:
        # fp32 tiles of 64 x 128 need ~190 KB of shared memory in the backward, over an A100's 164 KB
        square = (32, 32) if q.element_size() == 4 and block_d > 64 else (64, 64)
    return block_m or square[0], block_n or square[1], block_d


def _precision(q: torch.Tensor) -> str:
    """How tl.dot multiplies. fp16 / bf16: the tensor cores, fp32 accumulation ("tf32" is ignored for
    16-bit operands). fp32 on a GPU: "tf32x3", fp32-accurate products on the tensor cores, each operand
    split into a TF32 part and a TF32 remainder, three products (the small x small one dropped, ~2^-22
    relative): what torch's own fp32 attention does, whose memory-efficient kernel multiplies fp32 with
    CUTLASS's OpMultiplyAddFastF32 on sm_80+ (xformers' gemm_kernel_utils.h, DefaultGemmType<float>).
    Not "ieee": Triton lowers an exact fp32 dot to scalar FMAs, and at 64 x 64 tiles sm_90's build of the
    backward keeps 8-19 KB a thread in local memory (Triton 3.6; the likely cause of the fused GPT-2 step
    running 3.9x slower than torch's on an H200, 2026-11-27). Not "tf32" alone: 4-7e-4 relative error,
    over fp32's tolerance. On CPU the interpreter multiplies in numpy whatever the precision: "ieee"."""
    if q.dtype == torch.bfloat16 and not q.is_cuda:
        return "upcast"  # the interpreter (see _mm)
    if q.dtype == torch.float32:
        return "tf32x3" if q.is_cuda else "ieee"
    return "tf32"


def _warps(q: torch.Tensor, block_m: int, block_d: int) -> int:
    """4 warps a program, 8 for the largest tiles and for fp32 on a GPU (whose tf32x3 tiles spill at 4)."""
    return 8 if block_m * block_d >= 64 * 128 or (q.is_cuda and q.element_size() == 4) else 4


def launch_options(q: torch.Tensor, block_m: int | None = None, block_n: int | None = None) -> dict:
    """The launcher's constexprs and warps for q, shared by the forward and backward kernels."""
    bm, bn, bd = attention_tiles(q, block_m, block_n)
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, DOT_PRECISION=_precision(q), num_warps=_warps(q, max(bm, bn), bd))


def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  scale: float | None = None, block_m: int | None = None, block_n: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, L) for contiguous q (BH, seq_q, d), k and v (BH, seq_k, d); L is fp32 (BH, seq_q)."""
    bh, seq_q, head_dim = q.shape
    seq_k = k.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    options = launch_options(q, block_m, block_n)
    o = torch.empty_like(q)
    lse = torch.empty(bh, seq_q, device=q.device, dtype=torch.float32)
    attention_fwd_kernel[(triton.cdiv(seq_q, options["BLOCK_M"]), bh)](
        q, k, v, o, lse, seq_q, seq_k, head_dim, scale, CAUSAL=causal, **options)
    return o, lse


# True: dQ by atomic adds from the dK/dV kernel, the dq kernel not launched (FlashAttention-2's
# design: 5 matmuls instead of 7, atomics' traffic, run-to-run rounding). Off, the deterministic
# two-kernel backward, until a GPU has timed both (`bench attention`'s "triton atomic dq" row).
DQ_BY_ATOMICS = False


def attention_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                  lse: torch.Tensor, causal: bool = False, scale: float | None = None,
                  block_m: int | None = None, block_n: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) from contiguous dO, the forward's inputs, O and L."""
    bh, seq_q, head_dim = q.shape
    seq_k = k.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    common = dict(CAUSAL=causal, **launch_options(q, block_m, block_n))
    bm, bn, bd = common["BLOCK_M"], common["BLOCK_N"], common["BLOCK_D"]
    delta = torch.empty(bh, seq_q, device=q.device, dtype=torch.float32)
    attention_bwd_delta_kernel[(triton.cdiv(seq_q, bm), bh)](o, do, delta, seq_q, head_dim,
                                                             BLOCK_M=bm, BLOCK_D=bd)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    # atomics add into dq, so it starts at zero, in fp32 (16-bit partial sums would round each add)
    dq = torch.zeros_like(q, dtype=torch.float32) if DQ_BY_ATOMICS else torch.empty_like(q)
    attention_bwd_dkdv_kernel[(triton.cdiv(seq_k, bn), bh)](q, k, v, do, lse, delta, dk, dv, dq, seq_q, seq_k,
                                                            head_dim, scale, ATOMIC_DQ=DQ_BY_ATOMICS, **common)
    if DQ_BY_ATOMICS:
        return dq.to(q.dtype), dk, dv
    attention_bwd_dq_kernel[(triton.cdiv(seq_q, bm), bh)](q, k, v, do, lse, delta, dq, seq_q, seq_k,
                                                          head_dim, scale, **common)
    return dq, dk, dv
