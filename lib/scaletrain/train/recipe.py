"""Build one rank of the capstone: its place on the mesh, its tensor-parallel GPT, its pipeline stage.

The order is PTD-P's (Narayanan et al. 2021; seminar §1.2.5), as torchtitan writes its recipe:
  1. the rank grid (`ParallelDims(dp, pp, tp).build`, TP innermost) and the tied embedding's groups;
  2. tensor parallelism inside each stage: the GPT converted by `scaletrain.tp.parallelize` on the tp
     group, before it is cut, so every stage holds its tp slice of the same model;
  3. pipeline parallelism across stages: the GPT's blocks cut into P equal runs (`Stage`), the
     embedding on the first stage, the head and the vocabulary-parallel loss on the last, run by
     `scaletrain.pipeline.PipelineExecutor` on the pp group (GPipe, or 1F1B where m >= p).
Data parallelism is the gradient synchronization the loop calls (`scaletrain.train.sync`).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch.distributed as dist
import torch.nn as nn

from scaletrain.mesh import Mesh, ParallelDims
from scaletrain.models import GPT
from scaletrain.pipeline import PipelineExecutor
from scaletrain.pipeline.schedules import gpipe, one_f_one_b
from scaletrain.tp.gpt import TensorParallelGPT, parallelize
from scaletrain.train.config import TrainConfig

__all__ = ["Stage", "Recipe", "build"]

TIMEOUT_S = 120


class Stage(nn.Module):
    """Blocks [lo, hi) of a tensor-parallel GPT, with its embedding first and/or its head last."""

    def __init__(self, model: TensorParallelGPT, lo: int, hi: int, *, first: bool, last: bool):
        super().__init__()
        # bound methods, not the model: registering it would make every stage own every parameter
        self.embed, self.head = (model.embed if first else None), (model.head if last else None)
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        self.ends = nn.ModuleList(([model.wte, model.wpe] if first else []) +
                                  ([model.ln_f, model.lm_head] if last else []))

    def forward(self, x):
        x = self.embed(x) if self.embed is not None else x
        for block in self.blocks:
            x = block(x)
        return self.head(x) if self.head is not None else x


@dataclass
class Recipe:
    """What one rank built: its mesh, the whole (tp-sliced) model, its stage and the executor running it."""
    mesh: Mesh
    model: TensorParallelGPT
    stage: Stage
    executor: PipelineExecutor
    params: list            # this stage's parameters, each once (the tied embedding may appear twice)
    names: dict             # id(parameter) -> its name in the GPT
    embedding_groups: dict  # (dp_rank, tp_rank) -> the group of the first and last stage (pp > 1)

    @property
    def tied_group(self):
        """The group over which this rank sums the tied wte/lm_head gradient, or None: the first and
        last stage each hold the weight and half its gradient (Megatron's embedding group)."""
        mesh = self.mesh
        if not (mesh.is_first_stage or mesh.is_last_stage):
            return None
        return self.embedding_groups.get((mesh.dp_rank, mesh.tp_rank))


def _embedding_groups(dims: ParallelDims, timeout_s: float) -> dict:
    """(dp, tp) -> the group of the first and last stage's ranks (every rank creates every group)."""
    out = {}
    if dims.pp == 1:
        return out
    for d in range(dims.dp):
        for t in range(dims.tp):
            ranks = [dims.rank_of(dp=d, pp=0, tp=t), dims.rank_of(dp=d, pp=dims.pp - 1, tp=t)]
            group = dist.new_group(ranks, timeout=datetime.timedelta(seconds=timeout_s))
            if dist.get_rank() in ranks:
                out[(d, t)] = group
    return out


def build(cfg: TrainConfig) -> Recipe:
    """Steps 1-3 of the module docstring, on this rank (collective: every rank of the world calls it)."""
    dims = ParallelDims(dp=cfg.dp, pp=cfg.pp, tp=cfg.tp)
    mesh = dims.build(timeout_s=TIMEOUT_S)
    embedding_groups = _embedding_groups(dims, TIMEOUT_S)
    model = parallelize(GPT(cfg.model, seed=cfg.seed), mesh.tp_group, sequence_parallel=cfg.sequence_parallel)
    per_stage = cfg.n_layer // cfg.pp
    stage = Stage(model, mesh.pp_rank * per_stage, (mesh.pp_rank + 1) * per_stage,
                  first=mesh.is_first_stage, last=mesh.is_last_stage)
    make = one_f_one_b if cfg.schedule == "1f1b" and cfg.micro_batches >= cfg.pp else gpipe  # 1F1B needs m >= p
    executor = PipelineExecutor([stage], schedule=make(cfg.pp, cfg.micro_batches), loss_fn=model.loss,
                                group=mesh.pp_group)
    return Recipe(mesh=mesh, model=model, stage=stage, executor=executor,
                  params=list(dict.fromkeys(stage.parameters())),
                  names={id(p): n for n, p in model.named_parameters()},
                  embedding_groups=embedding_groups)
