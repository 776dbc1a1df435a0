"""What tensor parallelism sends: the closed forms the tests, the benchmark and the grader compare with.

"Large scale deep learning optimizations" seminar, §1.2.5.1, equation 5 (after Narayanan et al.
2021, §3.3): per transformer layer, forward and backward together, each tensor-parallel rank sends

    8 · b · s · h · (t - 1)/t  elements

the four allreduces of b·s·h elements (f and g of attention and of the MLP), each 2(t-1)/t·n on a
ring. A pipeline boundary instead sends one b·s·h
activation forward and one gradient back, point to point, per micro-batch: 2·b·s·h for all of a
stage's l_stage layers, against 8·b·s·h·(t-1)/t·l_stage for tensor parallelism. That factor, and
the allreduce's α terms on a slow link, is why PTD-P keeps t inside a node (seminar §1.2.5.1).

Sequence parallelism (Korthikanti et al. 2022, §4.2.2) replaces each allreduce by a reduce-scatter
and an all-gather, (t-1)/t·n each: the same volume, plus the two all-gathers with which the
column-parallel layers re-gather their saved input shard in the backward (sequence.py).

The whole step of the GPT (`scaletrain.tp.gpt`) adds the embedding's g (forward), the head's f
(backward) and the vocabulary-parallel cross-entropy's three reductions of N = b·s numbers; on our
ring the max is an all-gather of t·N (collectives.py). Counts are in bytes, `itemsize` per element.
"""

from __future__ import annotations

__all__ = ["allreduce_bytes", "gather_bytes", "layer_bytes", "gpt_step_bytes", "sequence_parallel_grad_bytes",
           "pipeline_boundary_bytes"]


def allreduce_bytes(numel: int, t: int, itemsize: int = 4) -> int:
    """Bytes one rank sends in our ring allreduce of `numel` elements: 2(t-1) chunks of ⌈numel/t⌉
    (= `scaletrain.comm.cost_model.bytes_per_rank("ring", ...)` when t divides numel)."""
    return 2 * (t - 1) * -(-numel // t) * itemsize


def gather_bytes(numel: int, t: int, itemsize: int = 4) -> int:
    """Bytes one rank sends in a ring all-gather producing, or a reduce-scatter consuming, `numel` elements."""
    return (t - 1) * (numel // t) * itemsize


def layer_bytes(*, batch_size: int, seq_len: int, hidden: int, t: int, sequence_parallel: bool = False,
                itemsize: int = 4, forward: bool = True, backward: bool = True) -> int:
    """Bytes one rank sends for one transformer layer (forward and/or backward)."""
    n = batch_size * seq_len * hidden
    if not sequence_parallel:
        return (2 * forward + 2 * backward) * allreduce_bytes(n, t, itemsize)
    # forward: 2 all-gathers + 2 reduce-scatters; backward: their conjugates + 2 re-gathers
    return (4 * forward + 6 * backward) * gather_bytes(n, t, itemsize)


def gpt_step_bytes(*, batch_size: int, seq_len: int, hidden: int, n_layer: int, t: int,
                   sequence_parallel: bool = False, itemsize: int = 4, forward: bool = True,
                   backward: bool = True) -> int:
    """Bytes one rank sends in the forward and/or backward of the tensor-parallel GPT on our ring."""
    n, tokens = batch_size * seq_len * hidden, batch_size * seq_len
    layers = n_layer * layer_bytes(batch_size=batch_size, seq_len=seq_len, hidden=hidden, t=t,
                                   sequence_parallel=sequence_parallel, itemsize=itemsize,
                                   forward=forward, backward=backward)
    if sequence_parallel:  # forward: embedding reduce-scatter, head all-gather; backward: their conjugates + re-gather
        ends = (2 * forward + 3 * backward) * gather_bytes(n, t, itemsize)
    else:                  # forward: the embedding's g; backward: the head's f
        ends = (forward + backward) * allreduce_bytes(n, t, itemsize)
    # the loss: max (our ring: an all-gather of t·N), the target logit and the sum of exponentials
    loss = gather_bytes(t * tokens, t, itemsize) + 2 * allreduce_bytes(tokens, t, itemsize) if forward and t > 1 else 0
    return layers + ends + loss


def sequence_parallel_grad_bytes(*, hidden: int, n_layer: int, block_size: int, t: int, itemsize: int = 4) -> int:
    """Bytes of `allreduce_sequence_parallel_grads` on the GPT: one allreduce of the gradients that
    each rank computed from its own positions (per layer two LayerNorms 4h and two row biases 2h;
    the final LayerNorm 2h; the position embedding block_size·h)."""
    return allreduce_bytes(n_layer * 6 * hidden + 2 * hidden + block_size * hidden, t, itemsize)


def pipeline_boundary_bytes(*, batch_size: int, seq_len: int, hidden: int, itemsize: int = 4) -> int:
    """Bytes a pipeline stage sends across one boundary per micro-batch: activation forward, gradient back."""
    return 2 * batch_size * seq_len * hidden * itemsize
