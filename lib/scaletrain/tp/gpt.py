"""`parallelize(model, tp_group)`: the tiny GPT of `scaletrain.models`, tensor (and sequence) parallel.

The recipe of Megatron-LM (Shoeybi et al. 2019, §3) on `scaletrain.models.GPT`, module by module,
weights sliced from the unsharded model so that the result is comparable with one process. Which
module gets which split is data, `scaletrain.tp.plan.GPT_PLAN` (module path -> style), read both
by `parallelize` and by `gpt_shard`:

    wte             vocab     -> VocabParallelEmbedding           rows split; g (or reduce-scatter under SP)
    blocks.*.attn   heads     -> ParallelSelfAttention             heads split: QKV column, proj row
    blocks.*.mlp.0  colwise   -> ColumnParallelLinear  h -> 4h/t   f before it
    blocks.*.mlp.2  rowwise   -> RowParallelLinear     4h/t -> h   g after it
    lm_head         colwise   -> ColumnParallelLinear  h -> V/t    the same rows as wte (tied weights)
    loss                      -> vocab_parallel_cross_entropy      never the full logits
LayerNorms, the residual stream and the position embedding stay whole on every rank (tensor
parallelism) or hold this rank's s/t positions (`sequence_parallel=True`, Korthikanti et al. 2022).
The block's own forward is unchanged: the parallel layers carry the communication.

Per layer, forward + backward communicate 4 allreduces of b·s·h elements (f and g of attention
and MLP: 8·b·s·h·(t-1)/t elements per rank, the seminar's equation 5); under sequence parallelism
the same volume as 4 all-gathers + 4 reduce-scatters, plus 2 all-gathers that re-gather the column
layers' inputs in the backward (sequence.py).

Under sequence parallelism the parameters applied to sequence shards (LayerNorms, the row layers'
biases, the position embedding) get from each rank the gradient of its positions only: call
`allreduce_sequence_parallel_grads(model, tp_group)` after backward, as Megatron does before the optimizer
step (they are marked `param.sequence_parallel = True`).

Dropout (the model's `cfg.dropout` > 0): the GPT's two dropouts per block become counter-based
`TensorParallelDropout`s (dropout.py), numbered 2i (attention probabilities: split by heads) and
2i + 1 (the MLP's output: replicated under tensor parallelism, split by positions under sequence
parallelism), seeded by `dropout_seed`. Their masks are those of the unsplit tensors, so the t-rank
model equals `parallelize(GPT(cfg, seed=...), None)`, the same conversion at t = 1, in one process.
(The unconverted `scaletrain.models.GPT` draws from torch's generator: the same distribution, other
masks.)

The conversion is in place: the model's class becomes `TensorParallelGPT` (a GPT whose forward
uses the vocabulary-parallel loss and returns this rank's slice of the logits, (b, s, V/t)).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from scaletrain.models import GPT
from scaletrain.tp.attention import ParallelSelfAttention
from scaletrain.tp.collectives import DEFAULT_BACKEND, allreduce, check_backend, divide, tp_rank, tp_world_size
from scaletrain.tp.cross_entropy import vocab_parallel_cross_entropy
from scaletrain.tp.dropout import TensorParallelDropout
from scaletrain.tp.embedding import VocabParallelEmbedding
from scaletrain.tp.layers import ColumnParallelLinear, RowParallelLinear, shard
from scaletrain.tp.plan import COLWISE, GPT_PLAN, HEADS, REPLICATED, ROWWISE, VOCAB, param_split, style_of

__all__ = ["TensorParallelGPT", "parallelize", "allreduce_sequence_parallel_grads", "sequence_parallel_params",
           "gpt_shard"]


class TensorParallelGPT(GPT):
    """A `GPT` converted by `parallelize`; built only by it."""

    tp_group: Any
    tp_rank: int
    tp_world_size: int
    sequence_parallel: bool
    backend: str

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx, targets: (b, s) int64, whole on every rank -> (this rank's logits (b, s, V/t), mean loss or None)."""
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        return logits, None if targets is None else self.loss(logits, targets)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token + position embeddings: (b, s, h), or this rank's (b, s/t, h) under SP (a pipeline's first stage)."""
        b, s = idx.shape
        if s > self.cfg.block_size:
            raise ValueError(f"GPT: sequence length {s} exceeds block_size {self.cfg.block_size}")
        if self.sequence_parallel:
            n = divide("sequence length (sequence parallelism)", s, self.tp_world_size)
            positions = torch.arange(self.tp_rank * n, (self.tp_rank + 1) * n, device=idx.device)
        else:
            positions = torch.arange(s, device=idx.device)
        return self.wte(idx) + self.wpe(positions)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final LayerNorm and output head: this rank's logits (b, s, V/t); the head gathers the sequence."""
        return self.lm_head(self.ln_f(x))

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the vocabulary-parallel logits against the whole targets (b, s)."""
        return vocab_parallel_cross_entropy(logits, targets, self.tp_group, self.backend)


def _check(model: GPT, t: int, sequence_parallel: bool) -> None:
    if not isinstance(model, GPT):
        raise TypeError(f"parallelize: expected a scaletrain.models.GPT, got {type(model).__name__}")
    if isinstance(model, TensorParallelGPT):
        raise ValueError("parallelize: this model is already tensor parallel")
    cfg = model.cfg
    divide("parallelize: n_head", cfg.n_head, t)
    divide("parallelize: n_embd", cfg.n_embd, t)
    divide("parallelize: vocab_size", cfg.vocab_size, t)
    if sequence_parallel and model.lm_head.weight is not model.wte.weight:
        raise ValueError("parallelize: expected the GPT's tied wte / lm_head weights")


def _mark_sequence_parallel(*modules: nn.Module) -> None:
    for m in modules:
        for p in m.parameters():
            p.sequence_parallel = True


def parallelize(model: GPT, tp_group: Any = None, *, sequence_parallel: bool = False,
                backend: str = DEFAULT_BACKEND, dropout_seed: int = 0) -> TensorParallelGPT:
    """Convert `model` in place to tensor parallelism over `tp_group` (None: every rank); return it.

    Every rank of the group must call it on the same unsharded weights (e.g. `GPT(cfg, seed=0)`) and
    the same `dropout_seed` (the dropout masks' stream, when `cfg.dropout` > 0).
    ValueError when the heads, the hidden size or the vocabulary is not divisible by t, and, in
    the forward under sequence parallelism, when the sequence length is not.
    """
    t = tp_world_size(tp_group)
    check_backend(backend)
    _check(model, t, sequence_parallel)
    kw = dict(tp_group=tp_group, sequence_parallel=sequence_parallel, backend=backend)
    r = tp_rank(tp_group)
    tied = model.lm_head.weight is model.wte.weight
    for path, module in [(p, m) for p, m in model.named_modules() if style_of(p, GPT_PLAN) != REPLICATED]:
        _replace(model, path, _convert(style_of(path, GPT_PLAN), module, path, kw, dropout_seed))
    if tied:
        model.lm_head.weight = model.wte.weight  # the head's rows are the embedding's rows of this rank
    for i, block in enumerate(model.blocks):
        # after g: the whole (b, s, h) on every rank; after SP's reduce-scatter: this rank's positions
        block.mlp[3] = TensorParallelDropout(block.mlp[3].p, seed=dropout_seed, site=2 * i + 1,
                                             split_dim=1 if sequence_parallel else None, tp_rank=r, tp_world_size=t)
        if sequence_parallel:
            _mark_sequence_parallel(block.ln1, block.ln2)
    if sequence_parallel:
        _mark_sequence_parallel(model.ln_f, model.wpe)
    model.__class__ = TensorParallelGPT
    model.tp_group, model.tp_rank, model.tp_world_size = tp_group, tp_rank(tp_group), t
    model.sequence_parallel, model.backend = sequence_parallel, backend
    return model


def _convert(style: str, module: nn.Module, path: str, kw: dict, dropout_seed: int) -> nn.Module:
    """The tensor-parallel module of `style` (scaletrain.tp.plan) made from the unsharded `module`."""
    if style == COLWISE:
        return ColumnParallelLinear.from_linear(module, **kw)
    if style == ROWWISE:
        return RowParallelLinear.from_linear(module, input_is_parallel=True, **kw)
    if style == VOCAB:
        return VocabParallelEmbedding.from_embedding(module, **kw)
    if style == HEADS:  # its dropout stream: site 2i of block i (the MLP's dropout is 2i + 1)
        block = int(path.split(".")[1])
        return ParallelSelfAttention.from_attention(module, dropout_seed=dropout_seed, dropout_site=2 * block, **kw)
    raise ValueError(f"parallelize: no conversion for style {style!r} of module {path!r}")


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    """Put `new` at the dotted `path` of `model` ("blocks.0.mlp.0": an index of a Sequential too)."""
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, new)


def gpt_shard(name: str, full: torch.Tensor, *, rank: int, world_size: int) -> torch.Tensor:
    """The slice of the unsharded GPT's tensor `name` (a parameter or its gradient) that rank `rank`
    holds after `parallelize`, computed without a process group (what the grader compares with):
    the split `GPT_PLAN` gives the parameter's module."""
    split = param_split(name, GPT_PLAN)
    if split is None:
        return full
    return shard(full, dim=split[0], rank=rank, world_size=world_size, parts=split[1])


def sequence_parallel_params(model: nn.Module) -> list[nn.Parameter]:
    """The parameters whose gradients each rank computes from its own sequence shard only."""
    return [p for p in model.parameters() if getattr(p, "sequence_parallel", False)]


def allreduce_sequence_parallel_grads(module: nn.Module, tp_group: Any = None, *,
                                      backend: str = DEFAULT_BACKEND) -> None:
    """Sum the gradients of `module`'s sequence-parallel parameters over `tp_group` (one allreduce of
    a flat buffer, Megatron's `finalize_model_grads`); nothing to do without sequence parallelism."""
    params = [p for p in sequence_parallel_params(module) if p.grad is not None]
    if not params:
        return
    flat = allreduce(torch.cat([p.grad.reshape(-1) for p in params]), tp_group, backend)
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(g.view_as(p.grad))
