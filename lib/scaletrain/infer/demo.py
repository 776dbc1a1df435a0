"""Notebook 12's helpers, shared with `python -m scaletrain.bench infer`.

  train_tiny      a tiny GPT trained on the course's corpus (its handouts, byte by byte,
                  scaletrain.data.corpus): the model the rest decodes, searches and quantizes
  held_out_loss   mean cross-entropy on windows from the corpus's last tenth (not trained on)
  text            bytes ↔ str for prompts and generations
  quant_sweep     held-out loss of the model with its blocks' Linears quantized, per spec
  distill_vs_scratch   a smaller student (STUDENT_CFG) distilled from the model against the same
                  student trained on the labels alone, on the same batches
  prune_sweep     held-out loss of the model pruned at each sparsity, per kind

Default sizes (DEMO_CFG, 300 steps of 16 x 64 bytes, one thread) train in about 6 s on an idle
core; the held-out loss falls from ln 256 ≈ 5.5 to about 3.0 nats per byte: spaces and common
letters in roughly the right places, not yet words.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch

from scaletrain.infer.distill import fit
from scaletrain.infer.prune import KINDS, prune, zero_fraction
from scaletrain.infer.quant import QuantSpec
from scaletrain.infer.quant_linear import quantize_model
from scaletrain.models import GPT, GPTConfig

__all__ = ["DEMO_CFG", "STUDENT_CFG", "train_tiny", "held_out_loss", "encode", "decode_text", "quant_sweep",
           "group_specs", "num_params", "distill_vs_scratch", "prune_sweep"]

DEMO_CFG = GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=64)
STUDENT_CFG = GPTConfig(vocab_size=256, block_size=64, n_layer=1, n_head=2, n_embd=32)  # a fifth of DEMO_CFG's weights


def _split(tokens: torch.Tensor) -> int:
    return len(tokens) * 9 // 10  # training windows start before, held-out windows after


def train_tiny(*, steps: int = 300, batch: int = 16, lr: float = 3e-3, cfg: GPTConfig = DEMO_CFG,
               seed: int = 0) -> tuple[GPT, list[float]]:
    """(model in eval mode, the loss per step), trained with AdamW on the corpus's first nine tenths."""
    with one_thread():
        torch.manual_seed(seed)
        model = GPT(cfg, seed=seed)
        return model, fit(model, train_batches(batch, cfg.block_size, seed=seed), steps, lr=lr)


@contextmanager
def one_thread():
    """Tiny matmuls: a second thread on a shared 2-core box costs 30x here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_batches(batch: int, block_size: int, *, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (idx, targets) windows drawn from the corpus's first nine tenths."""
    from scaletrain.data import corpus, windows

    tokens, gen = corpus(), torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, _split(tokens) - block_size - 1, (batch,), generator=gen).tolist()
        yield windows(tokens, starts, block_size)


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


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # the tied embedding / lm_head once


def distill_vs_scratch(teacher: GPT, *, transfer: int | None = None, steps: int = 150, batch: int = 16,
                       temperature: float = 2.0, alpha: float = 0.5, seed: int = 0) -> dict:
    """Held-out losses of the teacher and of two STUDENT_CFG students trained `steps` on the same
    batches, one from scratch (labels only), one distilled; the batches are `transfer` fixed ones
    cycled (a small transfer set: Hinton et al. §3's 3 % of the data), or fresh each step (None)."""
    with one_thread():
        size = "fresh batches" if transfer is None else f"{transfer * batch * STUDENT_CFG.block_size} B"
        row = {"transfer set": size, "teacher": held_out_loss(teacher), "teacher params": num_params(teacher)}
        for name, source in (("scratch", None), ("distilled", teacher)):
            batches = train_batches(batch, STUDENT_CFG.block_size, seed=seed + 1)  # not the teacher's draws
            if transfer is not None:
                batches = itertools.cycle(list(itertools.islice(batches, transfer)))
            student = GPT(STUDENT_CFG, seed=seed)
            fit(student, batches, steps, teacher=source, temperature=temperature, alpha=alpha)
            row[name] = held_out_loss(student)
        return row | {"student params": num_params(student)}


def prune_sweep(model: GPT, sparsities: Sequence[float], kinds: Sequence[str] = KINDS) -> list[dict]:
    """One row per (kind, sparsity): the share of zeros reached, held-out loss and perplexity."""
    rows = []
    with one_thread():
        for kind in kinds:
            for sparsity in sparsities:
                pruned, _ = prune(model, sparsity, kind=kind)
                loss = held_out_loss(pruned)
                rows.append({"kind": kind, "sparsity": sparsity, "zeros": zero_fraction(pruned), "loss": loss,
                             "perplexity": float(torch.tensor(loss).exp())})
    return rows
