"""What one tensor-parallel transformer layer saves for backward on a rank: predicted and measured.

Korthikanti et al. 2022, §4 (the seed's formula, "Techniques for large-scale training", memory
section), per layer and e bytes per element:
    tensor parallelism                     s·b·h·(10 + 24/t + 5·a·s/(h·t))   at e = 2
    tensor + sequence parallelism          s·b·h·(34/t + 5·a·s/(h·t))
(`scaletrain.memory.activation_bytes(tp=t)` and `sequence_parallel_activation_bytes`). The "10"
is what tensor parallelism leaves whole on every rank: the two LayerNorm inputs, the inputs of the
QKV and of the first MLP projection (4 tensors of s·b·h, 4e bytes) and the two dropout masks
(2·s·b·h bytes). Sequence parallelism splits those too.

On CPU in fp32 the tiny GPT of `scaletrain.models` saves the same tensors with three differences
(`scaletrain.memory.tiny_gpt_activation_bytes` lists them): e = 4, no dropout masks (dropout 0),
and fused attention, which keeps a logsumexp (b, a, s) instead of the a·s² softmax. LayerNorm also
keeps its mean and 1/std, (b, s) each, which the paper neglects. So per layer and rank:
    replicated  4·e·s·b·h + 2·2·e·s·b       LayerNorm and projection inputs, LayerNorm statistics
    split       everything else of the layer (Q, K, V, attention output, GeLU input and output,
                the logsumexp), taken from `tiny_gpt_activation_bytes` as one layer's total minus
                the replicated part
    TP:  replicated + split/t               TP + SP:  (replicated + split)/t
`measure_block_activations` counts what autograd really saves (`scaletrain.memory_measure`), so the
tests compare the two exactly for t = 1, 2, 4, with and without sequence parallelism.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from scaletrain.memory import tiny_gpt_activation_bytes
from scaletrain.memory_measure import track_saved_tensors
from scaletrain.tp.collectives import divide

__all__ = ["block_activation_bytes", "replicated_block_bytes", "measure_block_activations"]

FP32 = 4


def replicated_block_bytes(*, batch_size: int, seq_len: int, hidden: int) -> int:
    """Bytes of one layer that tensor parallelism keeps whole on every rank (fp32, no dropout)."""
    s, b, h, e = seq_len, batch_size, hidden, FP32
    return 4 * e * s * b * h + 4 * e * s * b


def block_activation_bytes(*, batch_size: int, seq_len: int, hidden: int, n_head: int, tp: int = 1,
                           sequence_parallel: bool = False) -> int:
    """Saved-for-backward bytes of one `scaletrain.models.Block` on one of t ranks, fp32, on CPU."""
    divide("block_activation_bytes: n_head", n_head, tp)
    if sequence_parallel:
        divide("block_activation_bytes: seq_len (sequence parallelism)", seq_len, tp)
    kw = dict(batch_size=batch_size, seq_len=seq_len, hidden=hidden, n_head=n_head, vocab_size=1)
    layer = tiny_gpt_activation_bytes(n_layer=2, **kw) - tiny_gpt_activation_bytes(n_layer=1, **kw)
    replicated = replicated_block_bytes(batch_size=batch_size, seq_len=seq_len, hidden=hidden)
    split = layer - replicated
    if sequence_parallel:
        return (replicated + split) // tp
    return replicated + split // tp


def measure_block_activations(block: nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd saves during `block(x)` on this rank (parameters excluded, storages counted once)."""
    with track_saved_tensors(list(block.parameters())) as tracker:
        out = block(x)
        saved = tracker.bytes
    del out
    return saved
