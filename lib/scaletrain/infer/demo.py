"""Notebook 12's helpers, shared with `python -m scaletrain.bench infer`.

  train_tiny      a tiny GPT trained on the course's corpus (its handouts, byte by byte,
                  scaletrain.data.corpus): the model the rest decodes, searches and quantizes
  held_out_loss   mean cross-entropy on windows from the corpus's last tenth (not trained on)
  text            bytes ↔ str for prompts and generations
  quant_sweep     held-out loss of the model with its blocks' Linears quantized, per spec

Default sizes (DEMO_CFG, 300 steps of 16 x 64 bytes, one thread) train in about 6 s on an idle
core; the held-out loss falls from ln 256 ≈ 5.5 to about 3.0 nats per byte: spaces and common
letters in roughly the right places, not yet words.
"""

from __future__ import annotations

from typing import Sequence

import torch

from scaletrain.infer.quant import QuantSpec
from scaletrain.infer.quant_linear import quantize_model
from scaletrain.models import GPT, GPTConfig

__all__ = ["DEMO_CFG", "train_tiny", "held_out_loss", "encode", "decode_text", "quant_sweep", "group_specs"]

DEMO_CFG = GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=64)


def _split(tokens: torch.Tensor) -> int:
    return len(tokens) * 9 // 10  # training windows start before, held-out windows after


def train_tiny(*, steps: int = 300, batch: int = 16, lr: float = 3e-3, cfg: GPTConfig = DEMO_CFG,
               seed: int = 0) -> tuple[GPT, list[float]]:
    """(model in eval mode, the loss per step), trained with AdamW on the corpus's first nine tenths."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: a second thread on a shared 2-core box costs 30x here
    try:
        return _train(steps, batch, lr, cfg, seed)
    finally:
        torch.set_num_threads(threads)


def _train(steps: int, batch: int, lr: float, cfg: GPTConfig, seed: int) -> tuple[GPT, list[float]]:
    from scaletrain.data import corpus, windows

    tokens, gen = corpus(), torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = GPT(cfg, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, _split(tokens) - cfg.block_size - 1, (batch,), generator=gen).tolist()
        _, loss = model(*windows(tokens, starts, cfg.block_size))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return model.eval(), losses


@torch.no_grad()
def held_out_loss(model: GPT, *, batches: int = 4, batch: int = 16, seed: int = 1) -> float:
    """Mean cross-entropy (nats per byte) on windows of the corpus's last tenth; exp of it is the perplexity."""
    from scaletrain.data import corpus, windows

    tokens, gen, s = corpus(), torch.Generator().manual_seed(seed), model.cfg.block_size
    lo = _split(tokens)
    total = 0.0
    for _ in range(batches):
        starts = torch.randint(lo, len(tokens) - s - 1, (batch,), generator=gen).tolist()
        total += model(*windows(tokens, starts, s))[1].item()
    return total / batches


def encode(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode()), dtype=torch.long)


def decode_text(tokens: torch.Tensor) -> str:
    return bytes(tokens.tolist()).decode(errors="replace")


def quant_sweep(model: GPT, specs: dict[str, QuantSpec | None], *, real: bool = False) -> list[dict]:
    """One row per named spec (None: the float model): held-out loss and perplexity."""
    rows = []
    for name, spec in specs.items():
        loss = held_out_loss(model if spec is None else quantize_model(model, spec, real=real))
        rows.append({"weights": name, "loss": loss, "perplexity": float(torch.tensor(loss).exp())})
    return rows


def group_specs(bits: int, sizes: Sequence[int], *, symmetric: bool = True) -> dict[str, QuantSpec]:
    """Per-tensor, per-channel and group-wise specs at `bits`, named for a table or a plot's x axis."""
    specs = {"tensor": QuantSpec(bits=bits, symmetric=symmetric, granularity="tensor"),
             "channel": QuantSpec(bits=bits, symmetric=symmetric, granularity="channel")}
    specs |= {f"g{g}": QuantSpec(bits=bits, symmetric=symmetric, granularity="group", group_size=g) for g in sizes}
    return specs
