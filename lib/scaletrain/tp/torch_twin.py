"""The baseline: the same tiny GPT, tensor (and sequence) parallel through torch's own API.

`torch.distributed.tensor.parallel.parallelize_module` with `ColwiseParallel`, `RowwiseParallel`,
`SequenceParallel` and `PrepareModuleInput`, DTensors on a CPU `DeviceMesh` over gloo, the plan
torchtitan applies to Llama (its `apply_tp`), and `loss_parallel()` for the vocabulary-parallel loss.

torch's plan splits each Linear along one dimension as a whole, so the GPT's fused QKV projection
would hand rank 0 all of Q instead of its heads' Q, K and V. `twin_of(gpt)` therefore builds a
module with the same weights and the same computation whose attention has three projections q, k,
v (and reads its number of local heads from their width, as torchtitan's attention does), its own
untied output head, and positions added to this rank's sequence shard. Only the benchmark uses it:
the course's reference is `scaletrain.tp.parallelize`.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from scaletrain.models import GPT

__all__ = ["twin_of", "torch_parallelize", "twin_step", "saved_bytes_at_forward_end"]


class _Attention(nn.Module):
    def __init__(self, attn: nn.Module):
        super().__init__()
        h = attn.qkv.in_features
        self.head_dim = h // attn.n_head
        self.q, self.k, self.v = (nn.Linear(h, h) for _ in range(3))
        with torch.no_grad():
            for lin, w, b in zip((self.q, self.k, self.v), attn.qkv.weight.split(h), attn.qkv.bias.split(h)):
                lin.weight.copy_(w)
                lin.bias.copy_(b)
        self.proj = copy.deepcopy(attn.proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)          # (b, s, h/t) local after ColwiseParallel
        b, s, width = q.shape
        q, k, v = (z.view(b, s, width // self.head_dim, self.head_dim).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, width))


class _Twin(nn.Module):
    def __init__(self, gpt: GPT):
        super().__init__()
        self.wte, self.wpe, self.ln_f = (copy.deepcopy(m) for m in (gpt.wte, gpt.wpe, gpt.ln_f))
        self.blocks = copy.deepcopy(gpt.blocks)
        for block, original in zip(self.blocks, gpt.blocks):
            block.attn = _Attention(original.attn)
        self.lm_head = nn.Linear(gpt.cfg.n_embd, gpt.cfg.vocab_size, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(gpt.wte.weight)     # untied: torch's plan shards them differently
        self.seq_shard = None                             # (rank, t) under sequence parallelism

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        s = idx.shape[1]
        x = self.wte(idx)
        if self.seq_shard is None:
            positions = torch.arange(s)
        else:
            rank, t = self.seq_shard
            positions = torch.arange(rank * s // t, (rank + 1) * s // t)
        x = x + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))                 # DTensor, vocabulary-sharded


def twin_step(twin: _Twin, idx: torch.Tensor, targets: torch.Tensor, *, on_forward_end=None) -> torch.Tensor:
    """Forward, loss (torch's `loss_parallel`: cross-entropy on vocabulary-sharded logits), backward."""
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():  # the loss and its backward must both run inside it
        logits = twin(idx)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        if on_forward_end is not None:
            on_forward_end()
        loss.backward()
    return loss.detach()


def saved_bytes_at_forward_end(step, params) -> int:
    """Bytes autograd holds for backward when `step(on_forward_end=...)` reaches the end of its
    forward, storages counted once, `params` skipped (DTensors or tensors). memory_measure's tracker reads each saved
    tensor's storage, which a DTensor wrapper does not have: this one reads its local tensor's."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    skip = {local(p).untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}
    at_end: list[int] = []

    def pack(t):
        st = local(t).untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step(on_forward_end=lambda: at_end.append(sum(seen.values())))
    return at_end[0]


def twin_of(gpt: GPT) -> _Twin:
    return _Twin(gpt)


def torch_parallelize(twin: _Twin, t: int, *, sequence_parallel: bool) -> _Twin:
    """Apply torch's tensor-parallel plan over a 1-D CPU mesh of the t ranks of the world."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    mesh = init_device_mesh("cpu", (t,))
    seq = Shard(1) if sequence_parallel else Replicate()
    plan = {"wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
            "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)}
    if sequence_parallel:
        plan["ln_f"] = SequenceParallel()
    for i in range(len(twin.blocks)):
        b = f"blocks.{i}"
        plan.update({f"{b}.attn.q": ColwiseParallel(), f"{b}.attn.k": ColwiseParallel(),
                     f"{b}.attn.v": ColwiseParallel(), f"{b}.attn.proj": RowwiseParallel(output_layouts=seq),
                     f"{b}.mlp.0": ColwiseParallel(), f"{b}.mlp.2": RowwiseParallel(output_layouts=seq)})
        if sequence_parallel:
            gather = dict(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))  # one all-gather
            plan.update({f"{b}.ln1": SequenceParallel(), f"{b}.ln2": SequenceParallel(),
                         f"{b}.attn": PrepareModuleInput(**gather), f"{b}.mlp": PrepareModuleInput(**gather)})
    parallelize_module(twin, mesh, plan)
    if sequence_parallel:
        twin.seq_shard = (dist.get_rank(), t)
    return twin
