"""a1b's names: the submitted files, their sources, the probe, the forbidden names, the kernels each
task compiles, and every check's name (no check name is written anywhere else)."""

AT, CE = "attention_triton.py", "cross_entropy_triton.py"
SOURCES = {AT: "kernels/attention_triton.py", CE: "kernels/cross_entropy_triton.py"}
PROBE = "autograder.probes.a1b_attention:"
TILE = 16  # the interpreter trials' tile: short sequences still cross several tiles
OTHER_TILES = ((16, 32), (32, 16))  # BLOCK_M != BLOCK_N: the tile shape is the launcher's, any must work

FORBIDDEN = ("torch.softmax", "torch.log_softmax", "torch.logsumexp", "torch.nn", "torch.special", "torch.ops",
             "torch._C", "torch.Tensor.softmax", "torch.Tensor.logsumexp", "scaled_dot_product_attention",
             "scaletrain.ops", "importlib", "__import__", "exec", "eval", "runpy")

# split by property: ragged / tile-multiple lengths, causal, each dtype, other tiles, forward / backward
C_SMOKE = "attention forward on small irregular shapes"
C_HUGE = "attention forward: scores near 1e4 stay finite (running max)"
C_CAUSAL = "attention forward, causal: the diagonal inside a tile, sequence 1 and 129"
C_FP16 = "attention forward with fp16 storage"
C_BF16 = "attention forward with bf16 storage"
C_FWD_TILES = "attention forward under tiles with BLOCK_M != BLOCK_N, causal and not"
C_DENSE = "attention forward keeps no n x n score matrix"
C_BWD = "attention backward dq, dk, dv on irregular shapes"
C_BWD_EVEN = "attention backward on lengths that are multiples of the tile"
C_BWD_CAUSAL = "attention backward, causal, fp32"
C_BWD_FP16 = "attention backward, causal, fp16"
C_BWD_BF16 = "attention backward, causal, bf16"
C_BWD_TILES = "attention backward under tiles with BLOCK_M != BLOCK_N, causal and not"
C_BWD_ATOMIC = "attention backward with dQ by atomic adds from the dK/dV kernel (ATOMIC_DQ), causal and not"
C_CE_FWD = "cross-entropy forward (loss and L): label smoothing, ignore_index, irregular vocabularies"
C_CE_BWD = "cross-entropy backward (dlogits): label smoothing, ignore_index, irregular vocabularies"
C_CE_HUGE = "cross-entropy on logits near 1e4 over several vocabulary chunks"

TRITON_KERNELS = {"1b.1": ("attention_triton", "attention_fwd_kernel"),
                  "1b.2": ("attention_triton", "attention_bwd_dkdv_kernel"),
                  "1b.3": ("cross_entropy_triton", "cross_entropy_fwd_kernel")}
# a task's compile check is granted only with its kernels' correctness in the same run: an empty kernel compiles
COMPUTES = {"1b.1": (C_SMOKE, C_CAUSAL), "1b.2": (C_BWD, C_BWD_CAUSAL), "1b.3": (C_CE_FWD, C_CE_BWD)}
BACKWARD_DQ = ("attention_triton", "attention_bwd_dq_kernel")
CE_BACKWARD = ("cross_entropy_triton", "cross_entropy_bwd_kernel")
SPEED = {"1b.1": "FlashAttention forward speed: >= 2x SDPA's math path, >= 0.7x its flash path (n = 4096, fp16)",
         "1b.2": "FlashAttention forward + backward speed: >= 2x SDPA's math path (n = 4096, fp16)"}


def compile_check(task: str) -> str:
    return f"{task} kernels compile for sm_80 (Triton compiler)"
