"""The rank function behind notebook 05: every stage trained on spawned ranks, measured.

`measure_stages(world_size)` trains the tiny GPT (AdamW) a few steps at each stage and returns,
per (stage, rank), the memory the rank holds (`ZeRO.memory_report`), the ZeRO paper's formula at
the padded Ψ' (`report.expected_memory`) and the bytes it sent (`ZeRO.comm_report`): the bars,
marks and figures the notebook plots next to each other.
"""

from __future__ import annotations

import torch

from scaletrain.launch import spawn
from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.zero.engine import ZeRO
from scaletrain.zero.report import expected_memory, padded_params
from scaletrain.zero.stages import STAGES

__all__ = ["measure_stages"]


def measure_stages(world_size: int, *, cfg: GPTConfig | None = None, steps: int = 2,
                   stages: tuple[int, ...] = STAGES) -> list[dict]:
    """Train the tiny GPT (AdamW) `steps` steps at each stage on `world_size` spawned ranks.

    Returns one row per (stage, rank): the measured `MemoryReport` after the last step, the
    formula at Ψ' (`expected_memory`), the `CommReport`, Ψ and Ψ'.
    """
    return [row for rows in spawn(_measure_rank, world_size, cfg, steps, tuple(stages), timeout_s=120)
            for row in rows]


def _measure_rank(rank: int, world_size: int, cfg: GPTConfig | None, steps: int, stages) -> list[dict]:
    cfg = cfg or GPTConfig()
    rows = []
    for stage in stages:
        model = GPT(cfg, seed=0)
        zero = ZeRO(model, optimizer_class=torch.optim.AdamW, stage=stage, lr=1e-3)
        for step in range(steps):
            zero.zero_grad()
            model(*make_batch(cfg, 2, seed=1000 * step + rank))[1].backward()
            zero.step()
        rows.append(dict(stage=stage, rank=rank, world_size=world_size, memory=zero.memory_report(),
                         formula=expected_memory(zero.units, zero.optimizer, stage), comm=zero.comm_report(),
                         psi=sum(u.numel for u in zero.units), psi_padded=padded_params(zero.units)))
    return rows
