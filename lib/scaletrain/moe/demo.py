"""Notebook 10's measurements, shared with `python -m scaletrain.bench moe`.

  train_load        the tiny MoE GPT trained on the course's corpus (its handouts, byte by byte,
                    scaletrain.data.corpus) with several auxiliary-loss weights α, the same seeds and
                    batches: per step, each expert's share of the first MoE layer's tokens, the
                    dropped fraction and the cross-entropy
  routing_picture   a trained router's probabilities for the bytes of one sentence (tokens x experts)
  drop_rates        the fraction of (token, choice) pairs over capacity, for a range of capacity
                    factors, on held-out batches
  measure_alltoall  one spawn: our all-to-all's bytes per rank against the formula, and the
                    expert-parallel GPT's bytes per step against cost.ep_step_bytes

Default sizes (DEMO_CFG, 100 steps of 8 x 32 bytes) train three models in about 10 s on 2 cores.
Top-1 routing with lr 1e-3: without the auxiliary loss the router sends most tokens to one or two
experts within the first tens of steps (their outputs improve first, so they score higher); with
α = 10⁻² the shares drift back towards 1/E.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from scaletrain.models import GPTConfig
from scaletrain.moe.gpt import MoEGPT
from scaletrain.moe.layer import MoEConfig

__all__ = ["DEMO_CFG", "DEMO_MOE", "BATCH", "LR", "History", "corpus_batch", "train_load", "routing_picture", "alltoall_rank",
           "drop_rates", "measure_alltoall"]

DEMO_CFG = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=32)
DEMO_MOE = MoEConfig(num_experts=8, top_k=1, capacity_factor=1.25, every=2)
BATCH, LR = 8, 1e-3


@dataclass
class History:
    """One training run: per step, `load` (steps, E) each expert's share of the first MoE layer's
    chosen tokens, `dropped` the share of pairs over capacity, `ce` the cross-entropy, and the model."""
    aux_loss_coef: float
    load: torch.Tensor
    dropped: list[float]
    ce: list[float]
    model: MoEGPT

    @property
    def imbalance(self) -> torch.Tensor:
        """max share × E per step: 1 when balanced, E when one expert takes everything."""
        return self.load.max(dim=1).values * self.load.shape[1]


def corpus_batch(tokens: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator):
    """`batch` windows of the corpus at random offsets: (idx, targets), targets shifted by one."""
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch,), generator=gen)
    rows = torch.stack([tokens[s:s + seq_len + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def train_load(coefs: Sequence[float] = (0.0, 0.01, 0.1), *, steps: int = 100, cfg: GPTConfig = DEMO_CFG,
               moe: MoEConfig = DEMO_MOE, batch: int = BATCH, lr: float = LR, seed: int = 0) -> dict[float, History]:
    """Train one model per α in `coefs` (same init, same batches) and record the load per step."""
    from scaletrain.data import corpus

    tokens, out = corpus(), {}
    for coef in coefs:
        torch.manual_seed(seed)
        model = MoEGPT(cfg, dataclasses.replace(moe, aux_loss_coef=coef), seed=seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        gen = torch.Generator().manual_seed(seed)
        load, dropped, ce = [], [], []
        for _ in range(steps):
            _, loss = model(*corpus_batch(tokens, batch, cfg.block_size, gen))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            stats = model.moe_layers()[0].stats
            load.append(stats.chosen.double() / stats.chosen.sum())
            dropped.append(stats.dropped / (stats.tokens * moe.top_k))
            ce.append(model.last_ce.item())
        out[coef] = History(aux_loss_coef=coef, load=torch.stack(load), dropped=dropped, ce=ce, model=model)
    return out


@torch.no_grad()
def routing_picture(model: MoEGPT, text: str) -> tuple[torch.Tensor, list[str]]:
    """The first MoE layer's router probabilities (T, E) for the bytes of `text` (one sequence of at
    most block_size bytes), and the characters, for a heatmap's rows."""
    data = torch.tensor(list(text.encode())[:model.cfg.block_size])[None]
    model(data)
    return model.moe_layers()[0].stats.probs, [chr(b) for b in data[0].tolist()]


@torch.no_grad()
def drop_rates(model: MoEGPT, factors: Sequence[float], *, batches: int = 4, seed: int = 1) -> list[float]:
    """Share of (token, choice) pairs over capacity in the first MoE layer, for each capacity factor,
    on `batches` held-out batches (the model's own weights; only the capacity changes)."""
    from scaletrain.data import corpus

    tokens, layer = corpus(), model.moe_layers()[0]
    saved, rates = layer.cfg, []
    try:
        for cf in factors:
            layer.cfg = dataclasses.replace(saved, routing="capacity", capacity_factor=cf)
            gen, dropped, pairs = torch.Generator().manual_seed(seed), 0, 0
            for _ in range(batches):
                model(*corpus_batch(tokens, BATCH, model.cfg.block_size, gen))
                dropped += layer.stats.dropped
                pairs += layer.stats.tokens * saved.top_k
            rates.append(dropped / pairs)
    finally:
        layer.cfg = saved
    return rates


def alltoall_rank(rank: int, world_size: int, rows: Sequence[int], hidden: int, moe: MoEConfig) -> dict[str, Any]:
    """In a rank of a spawn: measure_alltoall's figures for this rank (the benchmark calls it too)."""
    import torch.distributed as dist

    from scaletrain.comm.counter import comm_counter
    from scaletrain.moe.all_to_all import all_to_all, all_to_all_bytes
    from scaletrain.moe.cost import ep_step_bytes
    from scaletrain.moe.expert_parallel import apply_expert_parallel
    from scaletrain.data import corpus

    out: dict[str, Any] = {"alltoall": []}
    for n in rows:  # n rows of `hidden` fp32 per rank, n/p to each rank
        x = torch.randn(n, hidden)
        with comm_counter() as c:
            all_to_all(x)
        out["alltoall"].append((n * hidden * 4, c.bytes_sent,
                                all_to_all_bytes(rows=n, row_bytes=hidden * 4, world_size=world_size)))
    cfg = dataclasses.replace(DEMO_CFG, n_embd=hidden)
    model = apply_expert_parallel(MoEGPT(cfg, moe, seed=0), dist.group.WORLD)
    idx, targets = corpus_batch(corpus(), BATCH, cfg.block_size, torch.Generator().manual_seed(100 + rank))
    with comm_counter() as c:
        model(idx, targets)[1].backward()
    kept = [layer.stats.kept.tolist() for layer in model.moe_layers()]
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, kept)  # every rank's routed counts, for the formula
    out["step"] = {"tokens": idx.numel(), "counted": c.bytes_sent, "dropped": sum(l.stats.dropped for l in model.moe_layers()),
                   "formula": sum(ep_step_bytes([everyone[r][i] for r in range(world_size)], rank=rank,
                                                row_bytes=hidden * 4) for i in range(len(kept)))}
    return out


def measure_alltoall(world_size: int = 4, *, rows: Sequence[int] = (64, 256, 1024, 4096), hidden: int = 32,
                     moe: MoEConfig = DEMO_MOE) -> list[dict[str, Any]]:
    """One spawn of `world_size` ranks: per rank, [(bytes of the input, bytes counted, formula)] for
    the equal all-to-all of each size in `rows`, and one expert-parallel step of the demo GPT
    (ep = world size) with its counted bytes beside cost.ep_step_bytes."""
    from scaletrain.launch import spawn

    return spawn(alltoall_rank, world_size, tuple(rows), hidden, moe, timeout_s=120)
