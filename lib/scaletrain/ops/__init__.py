"""Fused softmax and LayerNorm, forward and backward, over three backends.

    from scaletrain.ops import softmax, layer_norm
    y = softmax(scores, mask=pad_mask, causal=True)          # backend="auto"
    h = layer_norm(x, (d,), weight, bias, backend="triton")

backend: "torch" (naive composed ops, naive.py), "triton" (kernels/*_triton.py; on CPU tensors
through the Triton interpreter, TRITON_INTERPRET=1), "cuda" (kernels/*.cu, built on first use,
cuda_ext.py), "auto" (cuda, then triton on a GPU; torch on CPU).  traffic.py counts the bytes
each version moves; `python -m scaletrain.bench kernels` measures them (benchmark.py).
"""

from scaletrain.ops.backends import BACKENDS, Backend, get_backend, triton_interpreter_on
from scaletrain.ops.functional import layer_norm, softmax
from scaletrain.ops.mask import MaskView

__all__ = ["softmax", "layer_norm", "Backend", "BACKENDS", "get_backend", "MaskView", "triton_interpreter_on"]

# Module 1b: FlashAttention, the fused cross-entropy criterion (and the LM head + loss over row
# chunks, never the whole logits) and the fused embedding (attention.py, cross_entropy.py,
# linear_cross_entropy.py, embedding.py; kernels/attention_triton.py and siblings).
from scaletrain.ops.attention import attention  # noqa: E402
from scaletrain.ops.cross_entropy import cross_entropy  # noqa: E402
from scaletrain.ops.embedding import embedding  # noqa: E402
from scaletrain.ops.linear_cross_entropy import linear_cross_entropy  # noqa: E402

__all__ += ["attention", "cross_entropy", "embedding", "linear_cross_entropy"]
