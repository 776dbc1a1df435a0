"""The rank function behind notebook 06: one spawn of 4 ranks measures everything the notebook plots.

`measure(world_size=4)` returns a dict:
  * "fg": on t = 2, the MLP of Megatron's Figure 3a (column -> GeLU -> row) against the unsharded
    MLP: max relative error of output and input gradient, and the bytes each rank sent forward and
    backward (comm_counter), beside one allreduce of b·s·h;
  * "activations": per (t, sequence_parallel) for t = 1, 2, 4, the bytes one GPT block saved on
    rank 0 (`activations.measure_block_activations`) and the formula (`block_activation_bytes`);
  * "ring": (bytes, seconds) of our ring allreduce on 2 ranks at a few sizes, for the α–β fit
    (`scaletrain.comm.cost_model.fit`) the notebook evaluates the seminar's equation 5 with.
Subgroups of the first 1 and 2 ranks give the smaller t; everything runs on the reference layers
(in a student repository, on the student's: the library runs their files).
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from scaletrain.comm import comm_counter, ring_allreduce
from scaletrain.launch import spawn
from scaletrain.models import GPT, GPTConfig
from scaletrain.testing import rel_error
from scaletrain.tp.activations import block_activation_bytes, measure_block_activations
from scaletrain.tp.collectives import split
from scaletrain.tp.gpt import parallelize
from scaletrain.tp.layers import ColumnParallelLinear, RowParallelLinear

__all__ = ["measure", "CFG", "BATCH", "SEQ"]

CFG = GPTConfig(vocab_size=64, block_size=32, n_layer=1, n_head=4, n_embd=64)
BATCH, SEQ = 4, 32
RING_SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 19)  # floats: 4 KiB .. 2 MiB


def _fg(group) -> dict:
    torch.manual_seed(0)
    h = CFG.n_embd
    ref = nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h))
    mlp = nn.Sequential(ColumnParallelLinear.from_linear(ref[0], tp_group=group), nn.GELU(),
                        RowParallelLinear.from_linear(ref[2], tp_group=group))
    x = torch.randn(BATCH, SEQ, h, generator=torch.Generator().manual_seed(1))
    x_ref, x_tp = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y_ref = ref(x_ref)
    y_ref.square().sum().backward()
    with comm_counter() as fwd:
        y = mlp(x_tp)
    with comm_counter() as bwd:
        y.square().sum().backward()
    return {"output_error": rel_error(y.detach(), y_ref.detach()), "grad_error": rel_error(x_tp.grad, x_ref.grad),
            "forward_bytes": fwd.bytes_sent, "backward_bytes": bwd.bytes_sent,
            "allreduce_bytes": 2 * (dist.get_world_size(group) - 1) * x.numel() * 4 // dist.get_world_size(group)}


def _activations(group, t: int) -> list[dict]:
    rows = []
    for sp in (False, True):
        block = parallelize(GPT(CFG, seed=0), group, sequence_parallel=sp).blocks[0]
        x = torch.randn(BATCH, SEQ, CFG.n_embd, generator=torch.Generator().manual_seed(2))
        x = (split(x, 1, group) if sp else x).requires_grad_(True)
        rows.append({"t": t, "sp": sp, "measured": measure_block_activations(block, x),
                     "formula": block_activation_bytes(batch_size=BATCH, seq_len=SEQ, hidden=CFG.n_embd,
                                                       n_head=CFG.n_head, tp=t, sequence_parallel=sp)})
    return rows


def _ring(group, reps: int = 5) -> list[tuple[int, float]]:
    out = []
    for n in RING_SIZES:
        x = torch.randn(n)
        ring_allreduce(x, group=group)  # warm-up (scratch buffers)
        times = []
        for _ in range(reps):
            dist.barrier(group=group)
            t0 = time.perf_counter()
            ring_allreduce(x, group=group)
            times.append(time.perf_counter() - t0)
        out.append((4 * n, sorted(times)[reps // 2]))
    return out


def _rank(rank: int, world_size: int) -> dict:
    timeout = datetime.timedelta(seconds=60)
    groups = {t: dist.new_group(list(range(t)), timeout=timeout) for t in (1, 2) if t < world_size}
    groups[world_size] = None
    out: dict = {"activations": []}
    for t, group in sorted(groups.items()):
        if rank < t:
            out["activations"] += _activations(group, t)
            if t == 2:
                out["fg"] = _fg(group)
                out["ring"] = _ring(group)
        dist.barrier()
    return out


def measure(world_size: int = 4) -> dict:
    """Everything the notebook plots, from rank 0 (see the module docstring)."""
    return spawn(_rank, world_size, timeout_s=120)[0]
