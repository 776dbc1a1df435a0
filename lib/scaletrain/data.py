"""The course's own corpus: its handouts (assignments/*/README.md) read as bytes, one token per byte.

A byte-level tokenizer needs no vocabulary file: 256 tokens, the GPT's default `vocab_size`. The
capstone (`scaletrain.train`), the compression benchmark and the MoE notebook train on it; each
takes windows of `seq_len + 1` bytes at offsets it draws, the targets shifted by one.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["corpus", "windows"]

REPO = Path(__file__).resolve().parents[2]


def corpus() -> torch.Tensor:
    """The course's handouts as one byte string, one token per byte (int64)."""
    text = b"\n\n".join(p.read_bytes() for p in sorted(REPO.glob("assignments/*/README.md")))
    if len(text) < 4096:
        raise FileNotFoundError(f"scaletrain.data: the handouts under {REPO / 'assignments'} are missing")
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


def windows(tokens: torch.Tensor, starts: list[int], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx, targets), each (len(starts), seq_len): the windows of `tokens` at `starts`, targets shifted by one."""
    rows = torch.stack([tokens[s:s + seq_len + 1] for s in starts])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
