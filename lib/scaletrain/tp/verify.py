"""Each tensor-parallel piece against its unsharded self, run on every rank of a group.

Every check builds the unsharded module from a seed, feeds it and its tensor-parallel version the
same input (identical on every rank), and compares, on every rank: the output (this rank's slice of
it when the layer leaves it split), the input's gradient, and each parameter's gradient with the
slice of the unsharded gradient that the parameter holds (`shard_like`). A failure on any rank
raises AssertionError on all of them (`scaletrain.testing.agree`), so no rank runs ahead into the
next collective. The tests, the notebook and the benchmark (before it times anything) use these.

Shapes are the caller's: use irregular ones (odd batch and sequence, t = 3). Without a process
group every check runs as t = 1 (one process holds the whole layer).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.testing import agree, assert_close
from scaletrain.tp.attention import ParallelSelfAttention
from scaletrain.tp.collectives import DEFAULT_BACKEND, split, tp_rank, tp_world_size
from scaletrain.tp.cross_entropy import vocab_parallel_cross_entropy
from scaletrain.tp.embedding import VocabParallelEmbedding
from scaletrain.tp.gpt import allreduce_sequence_parallel_grads, gpt_shard, parallelize
from scaletrain.tp.layers import ColumnParallelLinear, RowParallelLinear, shard_like
from scaletrain.tp.sequence import SEQ_DIM, gather_from_sp, reduce_scatter_to_sp

__all__ = ["check_column", "check_row", "check_mlp", "check_embedding", "check_cross_entropy", "check_attention",
           "check_sequence_pair", "check_gpt", "check_logits_never_whole", "largest_tensor", "randn"]

RTOL = 2e-5  # fp32, sums in another order than one process


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _agreed(group: Any, check: Callable[[], None]) -> None:
    """Run `check` on every rank; an AssertionError on one is raised on all. Without a process
    group (t = 1 in one process, where the layers work as well) there is no one to agree with."""
    if not dist.is_initialized():
        check()
        return
    error = None
    try:
        check()
    except AssertionError as exc:
        error = f"tp rank {tp_rank(group)} of {tp_world_size(group)}: {exc}"
    agree(error, group)


def _compare_params(parallel: nn.Module, reference: nn.Module, group: Any, what: str, *, by_name: bool = False) -> None:
    """Each parameter's gradient against its slice of the reference's: sliced as the parameter says
    it is (`shard_like`), or, `by_name`, as `gpt_shard` says the GPT is split (checking that map)."""
    ref = dict(reference.named_parameters())
    r, t = tp_rank(group), tp_world_size(group)
    for name, p in parallel.named_parameters():
        assert p.grad is not None, f"{what}: {name}.grad is None"
        want = (gpt_shard(name, ref[name].grad, rank=r, world_size=t) if by_name
                else shard_like(ref[name].grad, p, rank=r, world_size=t))
        assert_close(p.grad, want, rtol=RTOL, what=f"{what}: gradient of {name}")


def _run(parallel: nn.Module, reference: nn.Module, x: torch.Tensor, group: Any, what: str, *,
         out_slice: Callable[[torch.Tensor], torch.Tensor] = lambda y: y,
         in_slice: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
         grad_slice: Callable[[torch.Tensor], torch.Tensor] | None = None, backend: str = DEFAULT_BACKEND) -> None:
    """Forward, backward of sum(out * w) (w random, so every output element matters), compare."""
    x_ref = x.clone().requires_grad_(True)
    y_ref = reference(x_ref)
    w = randn(*y_ref.shape, seed=7)
    (y_ref * w).sum().backward()
    x_par = in_slice(x.clone()).requires_grad_(True)
    y_par = parallel(x_par)

    def check():
        assert_close(y_par, out_slice(y_ref.detach()), rtol=RTOL, what=f"{what}: output")
    _agreed(group, check)
    (y_par * out_slice(w)).sum().backward()
    allreduce_sequence_parallel_grads(parallel, group, backend=backend)  # no-op without sequence parallelism

    def check_grads():
        assert_close(x_par.grad, (grad_slice or in_slice)(x_ref.grad), rtol=RTOL, what=f"{what}: input gradient")
        _compare_params(parallel, reference, group, what)
    _agreed(group, check_grads)


def _linear(d_in: int, d_out: int, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(d_in, d_out)


def check_column(group: Any = None, *, batch: int = 3, seq: int = 5, d_in: int = 12, d_out: int = 24,
                 gather_output: bool = False, backend: str = DEFAULT_BACKEND, seed: int = 0) -> None:
    ref = _linear(d_in, d_out, seed)
    layer = ColumnParallelLinear.from_linear(ref, tp_group=group, gather_output=gather_output, backend=backend)
    keep = (lambda y: y) if gather_output else (lambda y: split(y, -1, group))
    _run(layer, ref, randn(batch, seq, d_in, seed=seed + 1), group, f"column gather_output={gather_output}",
         out_slice=keep)


def check_row(group: Any = None, *, batch: int = 3, seq: int = 5, d_in: int = 24, d_out: int = 12,
              input_is_parallel: bool = True, backend: str = DEFAULT_BACKEND, seed: int = 0) -> None:
    ref = _linear(d_in, d_out, seed)
    layer = RowParallelLinear.from_linear(ref, tp_group=group, input_is_parallel=input_is_parallel, backend=backend)
    cut = (lambda x: split(x, -1, group)) if input_is_parallel else (lambda x: x)
    _run(layer, ref, randn(batch, seq, d_in, seed=seed + 1), group, f"row input_is_parallel={input_is_parallel}",
         in_slice=cut)


def check_mlp(group: Any = None, *, batch: int = 3, seq: int = 5, hidden: int = 12, sequence_parallel: bool = False,
              backend: str = DEFAULT_BACKEND, seed: int = 0) -> None:
    """Column -> GeLU -> row, Megatron's MLP: one allreduce (or RS + AG) each way."""
    ref = nn.Sequential(_linear(hidden, 4 * hidden, seed), nn.GELU(), _linear(4 * hidden, hidden, seed + 1))
    kw = dict(tp_group=group, sequence_parallel=sequence_parallel, backend=backend)
    mlp = nn.Sequential(ColumnParallelLinear.from_linear(ref[0], **kw), nn.GELU(),
                        RowParallelLinear.from_linear(ref[2], **kw))
    seq_cut = (lambda y: split(y, SEQ_DIM, group)) if sequence_parallel else (lambda y: y)
    _run(mlp, ref, randn(batch, seq, hidden, seed=seed + 2), group, f"MLP sequence_parallel={sequence_parallel}",
         out_slice=seq_cut, in_slice=seq_cut, backend=backend)


def check_embedding(group: Any = None, *, batch: int = 3, seq: int = 5, vocab: int = 36, hidden: int = 12,
                    sequence_parallel: bool = False, backend: str = DEFAULT_BACKEND, seed: int = 0) -> None:
    torch.manual_seed(seed)
    ref = nn.Embedding(vocab, hidden)
    layer = VocabParallelEmbedding.from_embedding(ref, tp_group=group, sequence_parallel=sequence_parallel,
                                                  backend=backend)
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed + 1))
    y_ref = ref(ids)
    w = randn(*y_ref.shape, seed=seed + 2)
    (y_ref * w).sum().backward()
    y = layer(ids)
    cut = (lambda z: split(z, SEQ_DIM, group)) if sequence_parallel else (lambda z: z)
    (y * cut(w)).sum().backward()

    def check():
        assert_close(y, cut(y_ref.detach()), rtol=RTOL, what=f"embedding sequence_parallel={sequence_parallel}: output")
        _compare_params(layer, ref, group, "embedding")
    _agreed(group, check)


def check_cross_entropy(group: Any = None, *, rows: int = 7, vocab: int = 36, backend: str = DEFAULT_BACKEND,
                        seed: int = 0) -> None:
    """Loss and logits gradient equal F.cross_entropy on the whole logits (scaled up: large logits)."""
    logits = 8 * randn(rows, vocab, seed=seed)
    targets = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(seed + 1))
    full = logits.clone().requires_grad_(True)
    ref = F.cross_entropy(full, targets)
    ref.backward()
    mine = split(logits, -1, group).requires_grad_(True)
    loss = vocab_parallel_cross_entropy(mine, targets, group, backend)
    loss.backward()

    def check():
        assert_close(loss.detach(), ref.detach(), rtol=RTOL, what="vocab-parallel cross-entropy: loss")
        assert_close(mine.grad, split(full.grad, -1, group), rtol=RTOL, what="vocab-parallel cross-entropy: gradient")
    _agreed(group, check)


def largest_tensor(fn: Callable[[], Any]) -> int:
    """The most elements of any tensor an aten op produced while `fn()` ran (forward and backward)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Largest(TorchDispatchMode):
        most = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            sizes = [x.numel() for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
            Largest.most = max([Largest.most, *sizes])
            return out

    with Largest():
        fn()
    return Largest.most


def check_logits_never_whole(group: Any = None, *, rows: int = 21, vocab: int = 96,
                             backend: str = DEFAULT_BACKEND, seed: int = 0) -> None:
    """The vocabulary-parallel loss, forward and backward, never makes a tensor of N·V/t + 1 elements
    or more: the whole logits (N·V) are never assembled, not even in pieces glued together."""
    t = tp_world_size(group)
    mine = split(randn(rows, vocab, seed=seed), -1, group).requires_grad_(True)
    targets = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(seed + 1))
    most = largest_tensor(lambda: vocab_parallel_cross_entropy(mine, targets, group, backend).backward())

    def check():
        assert most <= rows * vocab // t, (f"a tensor of {most} elements was made; this rank's logits have "
                                           f"{rows * vocab // t} and the whole logits {rows * vocab}")
    _agreed(group, check)


def check_attention(group: Any = None, *, batch: int = 3, seq: int = 5, n_head: int = 12, hidden: int = 48,
                    sequence_parallel: bool = False, backend: str = DEFAULT_BACKEND, seed: int = 0) -> None:
    from scaletrain.models import CausalSelfAttention
    torch.manual_seed(seed)
    ref = CausalSelfAttention(GPTConfig(n_head=n_head, n_embd=hidden, block_size=seq))
    attn = ParallelSelfAttention.from_attention(ref, tp_group=group, sequence_parallel=sequence_parallel,
                                                backend=backend)
    seq_cut = (lambda y: split(y, SEQ_DIM, group)) if sequence_parallel else (lambda y: y)
    _run(attn, ref, randn(batch, seq, hidden, seed=seed + 1), group,
         f"attention sequence_parallel={sequence_parallel}", out_slice=seq_cut, in_slice=seq_cut, backend=backend)


def check_sequence_pair(group: Any = None, *, batch: int = 3, seq: int = 6, hidden: int = 5,
                        backend: str = DEFAULT_BACKEND, seed: int = 0) -> None:
    """All-gather along the sequence and its backward (a reduce-scatter); reduce-scatter and its
    backward (an all-gather), against the same sums done in one process."""
    t, r = tp_world_size(group), tp_rank(group)
    parts = [randn(batch, seq, hidden, seed=seed + k) for k in range(t)]  # rank k's tensor
    shard = split(parts[r], SEQ_DIM, group).requires_grad_(True)
    gathered = gather_from_sp(shard, group, backend)
    w = parts[(r + 1) % t]
    (gathered * w).sum().backward()
    whole = torch.cat([p.narrow(SEQ_DIM, k * (seq // t), seq // t) for k, p in enumerate(parts)], dim=SEQ_DIM)
    grad_sum = sum(parts[(k + 1) % t] for k in range(t))
    x = parts[r].clone().requires_grad_(True)
    scattered = reduce_scatter_to_sp(x, group, backend)
    scattered.sum().backward()

    def check():
        assert_close(gathered.detach(), whole, rtol=RTOL, what="all-gather along the sequence: output")
        assert_close(shard.grad, split(grad_sum, SEQ_DIM, group), rtol=RTOL,
                     what="all-gather along the sequence: gradient (a reduce-scatter)")
        assert_close(scattered.detach(), split(sum(parts), SEQ_DIM, group), rtol=RTOL,
                     what="reduce-scatter along the sequence: output")
        assert_close(x.grad, torch.ones_like(x), rtol=RTOL, what="reduce-scatter along the sequence: gradient")
    _agreed(group, check)


def check_gpt(group: Any = None, *, cfg: GPTConfig, batch: int = 3, seq: int = 7, sequence_parallel: bool = False,
              backend: str = DEFAULT_BACKEND, seed: int = 0) -> None:
    """Loss, this rank's logits and every gradient of the parallel GPT equal one process."""
    ref = GPT(cfg, seed=seed)
    x, y = make_batch(cfg, batch, seed=seed + 1, seq_len=seq)
    logits_ref, loss_ref = ref(x, y)
    loss_ref.backward()
    model = parallelize(GPT(cfg, seed=seed), group, sequence_parallel=sequence_parallel, backend=backend)
    logits, loss = model(x, y)
    loss.backward()
    allreduce_sequence_parallel_grads(model, group, backend=backend)
    what = f"GPT t={tp_world_size(group)} sequence_parallel={sequence_parallel}"

    def check():
        assert_close(loss.detach(), loss_ref.detach(), rtol=RTOL, what=f"{what}: loss")
        assert_close(logits.detach(), split(logits_ref.detach(), -1, group), rtol=RTOL, what=f"{what}: logits")
        _compare_params(model, ref, group, what, by_name=True)
    _agreed(group, check)
