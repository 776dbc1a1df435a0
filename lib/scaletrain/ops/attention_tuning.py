"""The Triton FlashAttention forward with its tile shape chosen on the GPU it runs on.

kernels/attention_triton.py launches 64 x 64 tiles (FlashAttention-2's choice for head dim <= 128
on an A100): the tile the a1b grader launches a student's kernel with, and one of many a correct
kernel must hold for. Which tile is fastest depends on the GPU. A taller query tile (BLOCK_M =
128) reads each K, V tile once for twice the rows, so half the K/V traffic, at the cost of
registers; a deeper pipeline (num_stages) holds more K, V tiles in flight in shared memory to hide
the loads' latency. Triton's fused-attention tutorial (06-fused-attention.py) and FlashAttention-2
(Dao 2023, section 3.3) pick among such shapes per head dim and GPU. Here `triton.autotune` times
CONFIGS on the first call of each (sequence-length bucket, head dim, causal, dtype) and keeps the
fastest; the launcher's own tiles are among them, so the tuned forward is the fixed one at worst
(up to timing noise), and a shape the GPU cannot hold (shared memory) is skipped by the tuner.

Only fp16 / bf16 on a GPU for sequences of at least MIN_TUNED_SEQ; everything else, and the a1b
grader, uses the fixed launcher. The backward keeps the launcher's tiles.
"""

from __future__ import annotations

import math

import torch

__all__ = ["CONFIGS", "MIN_TUNED_SEQ", "chosen", "tunable", "tuned_attention_fwd", "tuner"]

# (BLOCK_M, BLOCK_N, num_warps, num_stages): the launcher's 64 x 64 (4 warps at head dim 64, 8 at
# 128), taller query tiles, and longer or shorter key tiles with the pipeline depth to match.
CONFIGS = ((64, 64, 4, 3), (64, 64, 8, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 32, 4, 4),
           (128, 128, 8, 3), (64, 128, 4, 3))
MIN_TUNED_SEQ = 512   # below, a launch is too short for the tile to matter: no tuning time spent
MAX_BUCKET = 16384


def tunable(q: torch.Tensor) -> bool:
    """Whether tuned_attention_fwd tunes for q (BH, seq, head_dim): fp16 / bf16 on a GPU, long enough."""
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and q.shape[1] >= MIN_TUNED_SEQ


_TUNERS: dict = {}  # (kernel, bucket) -> its autotuner


def tuner(kernel, bucket: int):
    """The autotuner of `kernel` (attention_fwd_kernel) for sequences in `bucket` (a power of two):
    one per bucket, so a tile chosen for 512 tokens is not kept for 16k. Keyed inside by head dim,
    causal and the tensors' dtypes."""
    import triton

    if (kernel, bucket) not in _TUNERS:
        configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in CONFIGS]
        _TUNERS[kernel, bucket] = triton.autotune(configs, key=["head_dim", "CAUSAL"])(kernel)
    return _TUNERS[kernel, bucket]


def chosen() -> list[dict]:
    """Every tile chosen so far: sequence bucket, the tuner's key (head dim, causal, dtypes), the config."""
    return [{"bucket": bucket, "key": key, "BLOCK_M": c.kwargs["BLOCK_M"], "BLOCK_N": c.kwargs["BLOCK_N"],
             "warps": c.num_warps, "stages": c.num_stages}
            for (_, bucket), t in _TUNERS.items() for key, c in t.cache.items()]


def tuned_attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, L) as kernels/attention_triton.py's attention_fwd, for contiguous (BH, seq, head_dim)
    q, k, v; the tile shape tuned where `tunable(q)`, the launcher's elsewhere."""
    from scaletrain.ops.backends import KERNELS_DIR, load_kernel_module
    import triton

    kernels = load_kernel_module(KERNELS_DIR / "attention_triton.py")
    if not tunable(q):
        return kernels.attention_fwd(q, k, v, causal, scale)
    bh, seq_q, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    o = torch.empty_like(q)
    lse = torch.empty(bh, seq_q, device=q.device, dtype=torch.float32)
    bucket = min(triton.next_power_of_2(seq_q), MAX_BUCKET)
    grid = lambda meta: (triton.cdiv(seq_q, meta["BLOCK_M"]), bh)  # noqa: E731
    tuner(kernels.attention_fwd_kernel, bucket)[grid](
        q, k, v, o, lse, seq_q, k.shape[1], head_dim, scale, CAUSAL=causal, DOT_PRECISION="tf32",  # 16-bit: as the launcher
        BLOCK_D=kernels.attention_tiles(q)[2])
    return o, lse
