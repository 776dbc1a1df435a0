"""Tensor and sequence parallelism: Megatron-LM's layers on our collectives (module 6, assignment a6).

    copy_to_tp / reduce_from_tp                f and g: the conjugate operators (operators.py)
    ColumnParallelLinear(gather_output=...)     weight split along out; RowParallelLinear(input_is_parallel=...)
    VocabParallelEmbedding                      the token table split along the vocabulary (embedding.py)
    vocab_parallel_cross_entropy                the loss from (N, V/t) logits, never the full (N, V) (cross_entropy.py)
    ParallelSelfAttention                       heads split over the ranks (attention.py)
    gather_from_sp / reduce_scatter_to_sp       sequence parallelism's all-gather / reduce-scatter pair (sequence.py)
    parallelize(gpt, tp_group, sequence_parallel=False)   the tiny GPT, converted in place (gpt.py)
    GPT_PLAN, param_split                       the plan as data: module path -> split style (plan.py)
    TensorParallelDropout, keep_mask            dropout whose masks do not depend on the split (dropout.py)
    allreduce, all_gather, reduce_scatter       the wire: backend="ring" (ours, counted) or "torch" (collectives.py)
    shard / shard_like                          which slice of an unsharded weight a rank holds (layers.py)

Beside them: cost.py (the bytes a layer and a step send: the seminar's equation 5), activations.py
(what a block saves, Korthikanti's formula on CPU, and its measurement), verify.py (each piece
against its unsharded self, on every rank), benchmark.py + torch_twin.py (`python -m scaletrain.bench
tp`, against torch's parallelize_module), demo.py (notebook 06).

Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism", §3; Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", §4; Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM" (PTD-P, `scaletrain.mesh`). Seeds: "Techniques for large-scale training"
(Tensor Parallelism, Sequence Parallelism, the activation formula with t); "Large scale deep learning
optimizations" seminar, §1.2.4-1.2.5 (equation 5: TP communication per layer). Notebook 06.
"""

from scaletrain.tp.attention import ParallelSelfAttention
from scaletrain.tp.collectives import (BACKENDS, all_gather, allreduce, allreduce_max, reduce_scatter, split,
                                       tp_rank, tp_world_size)
from scaletrain.tp.cross_entropy import VocabParallelCrossEntropy, vocab_parallel_cross_entropy
from scaletrain.tp.dropout import TensorParallelDropout, keep_mask
from scaletrain.tp.embedding import VocabParallelEmbedding, vocab_range
from scaletrain.tp.gpt import (TensorParallelGPT, allreduce_sequence_parallel_grads, parallelize,
                               sequence_parallel_params)
from scaletrain.tp.layers import ColumnParallelLinear, RowParallelLinear, mark_sharded, shard, shard_like
from scaletrain.tp.plan import GPT_PLAN, param_split
from scaletrain.tp.operators import (CopyToTensorParallel, GatherFromTensorParallel, ReduceFromTensorParallel,
                                     ScatterToTensorParallel, copy_to_tp, gather_from_tp, reduce_from_tp,
                                     scatter_to_tp)
from scaletrain.tp.sequence import (SEQ_DIM, GatherFromSequenceParallel, ReduceScatterToSequenceParallel,
                                    SequenceGatherLinear, gather_from_sp, reduce_scatter_to_sp,
                                    sequence_gather_linear)

__all__ = ["copy_to_tp", "reduce_from_tp", "gather_from_tp", "scatter_to_tp", "CopyToTensorParallel",
           "ReduceFromTensorParallel", "GatherFromTensorParallel", "ScatterToTensorParallel",
           "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "vocab_range",
           "VocabParallelCrossEntropy", "vocab_parallel_cross_entropy", "ParallelSelfAttention",
           "SEQ_DIM", "GatherFromSequenceParallel", "ReduceScatterToSequenceParallel", "SequenceGatherLinear",
           "gather_from_sp", "reduce_scatter_to_sp", "sequence_gather_linear",
           "TensorParallelGPT", "parallelize", "allreduce_sequence_parallel_grads", "sequence_parallel_params",
           "BACKENDS", "allreduce", "allreduce_max", "all_gather", "reduce_scatter", "split", "tp_rank",
           "tp_world_size", "shard", "shard_like", "mark_sharded", "TensorParallelDropout", "keep_mask", "GPT_PLAN",
           "param_split"]
