"""The capstone's training loop, the same for every layout and every ZeRO stage, and its one-process
reference. Each step on every rank:

  1. the pipeline executor runs this rank's stage on its dp slice of the step's batch (tensor
     parallelism's collectives run inside forward and backward);
  2. the gradient fix-ups: sequence-parallel gradients summed over tp, the tied embedding over the
     first and the last stage (`sync.sum_sequence_parallel`, `sync.sum_tied`);
  3. `sync.step()`: data parallelism (plain averaging or ZeRO) and the optimizer.

Every rank builds the whole batch of the step from the step number and takes its dp slice, so one
process on the whole batch is the reference (`reference`): the same losses and parameters within
float tolerance, whatever the layout (tests/test_tp_train.py, tests/test_train_zero.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from scaletrain.comm import comm_counter
from scaletrain.data import corpus
from scaletrain.models import GPT
from scaletrain.train.config import TrainConfig, batch, make_optimizer
from scaletrain.train.recipe import build
from scaletrain.train.report import pp_bytes, step_line, zero_summary
from scaletrain.train.sync import for_config

__all__ = ["train_rank", "reference"]


def train_rank(rank: int, world_size: int, cfg: TrainConfig, log: bool = True) -> dict:
    """One rank of the run: returns {"losses": [...] (every rank), "params": {name: this rank's slice}}, and
    with ZeRO "memory": the model-state bytes this rank holds after the last step, beside ZeRO §5's."""
    recipe = build(cfg)
    sync = for_config(cfg, recipe)
    mesh, tokens, rows = recipe.mesh, corpus(), cfg.rows_per_replica
    losses = []
    for step in range(cfg.steps):
        start = time.perf_counter()
        idx, targets = (x[mesh.dp_rank * rows:(mesh.dp_rank + 1) * rows] for x in batch(tokens, step, cfg))
        sync.zero_grad()
        before = sync.bytes_sent
        with comm_counter() as tp_sent:
            out = recipe.executor.step(idx if mesh.is_first_stage else None, targets if mesh.is_last_stage else None)
            hooks = sync.bytes_sent - before  # ZeRO-2/3's hooks sent inside the backward: dp traffic, not tp
            sync.sum_sequence_parallel(recipe.stage, mesh.tp_group)
        with comm_counter() as emb_sent:
            if recipe.tied_group is not None:
                sync.sum_tied(recipe.model.wte.weight, recipe.tied_group)
        with comm_counter() as dp_sent:
            sync.step()
        losses.append(_step_loss(out, cfg))
        if log and rank == 0:
            tok_s = cfg.global_batch * cfg.seq_len / (time.perf_counter() - start)
            print(step_line(step, losses[-1], tok_s, tp=tp_sent.bytes_sent - hooks, pp=pp_bytes(cfg, mesh),
                            dp=dp_sent.bytes_sent + hooks, embedding=emb_sent.bytes_sent), flush=True)
    result = {"losses": losses, "coords": asdict(mesh.coords),
              "params": {recipe.names[id(p)]: v for p, v in zip(recipe.params, sync.final_params())}}
    memory = sync.memory()
    if memory is not None:
        result["memory"] = memory
        if log and rank == 0:
            print(zero_summary(memory, cfg), flush=True)
    return result


def _step_loss(out: list | None, cfg: TrainConfig) -> float:
    """The step's loss: the mean of the last stage's micro-batch losses, averaged over dp, sent to all."""
    loss = torch.tensor([sum(out) / len(out) if out is not None else 0.0], dtype=torch.float64)
    dist.all_reduce(loss)  # only the dp·tp last-stage ranks contributed
    return loss.item() / (cfg.dp * cfg.tp)


def reference(cfg: TrainConfig) -> dict:
    """One process, the whole batch of every step, the same optimizer: {"losses": [...], "params": {name: tensor}}."""
    model = GPT(cfg.model, seed=cfg.seed)
    optimizer = make_optimizer(cfg, list(model.parameters()))
    tokens, losses = corpus(), []
    for step in range(cfg.steps):
        optimizer.zero_grad(set_to_none=True)
        loss = model(*batch(tokens, step, cfg))[1]
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}
