"""Tiny models used by every demo, test and benchmark: a GPT and an MLP.

They are plain `nn.Module`s that know nothing about distribution (nanoGPT's habit): data
parallel, pipeline and ZeRO wrappers take them as arguments. Initialisation is deterministic
given `seed`, so a single-process reference and a p-rank run start from the same weights.

The GPT is pre-LN (Radford et al., 2019, GPT-2 §2.3): x + attn(ln(x)), x + mlp(ln(x)), with a
4h MLP and tied input/output embeddings; its parameter count is what `scaletrain.memory`
estimates (≈ 12·L·h² + V·h + s·h).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["GPTConfig", "GPT", "Block", "MLP", "make_batch"]


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    vocab_size: int = 256      # V: byte-level, so no tokenizer is needed
    block_size: int = 64       # s: maximum sequence length
    n_layer: int = 2           # L
    n_head: int = 4            # a
    n_embd: int = 64           # h
    dropout: float = 0.0       # 0 keeps runs bitwise-reproducible across ranks

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd={self.n_embd} must be divisible by n_head={self.n_head}")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)
        # (b, s, h) -> (b, a, s, h/a)
        q, k, v = (t.view(b, s, self.n_head, h // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class Block(nn.Module):
    """One pre-LN transformer layer: the unit that pipeline stages and ZeRO-3 gathers work on."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd), nn.Dropout(cfg.dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, *, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying (GPT-2): one tensor, two uses
        _init_weights(self, seed, cfg.n_layer)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx, targets: (b, s) int64 → (logits (b, s, V), mean cross-entropy or None)."""
        b, s = idx.shape
        if s > self.cfg.block_size:
            raise ValueError(f"GPT: sequence length {s} exceeds block_size {self.cfg.block_size}")
        x = self.wte(idx) + self.wpe(torch.arange(s, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


class MLP(nn.Sequential):
    """`MLP([d0, d1, ..., dk])`: Linear layers with ReLU between them (none after the last)."""

    def __init__(self, sizes: list[int], *, seed: int = 0):
        if len(sizes) < 2:
            raise ValueError(f"MLP: need at least an input and an output size, got {sizes}")
        layers: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(zip(sizes, sizes[1:])):
            layers.append(nn.Linear(d_in, d_out))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        super().__init__(*layers)
        _init_weights(self, seed, n_layer=1)


def _init_weights(module: nn.Module, seed: int, n_layer: int) -> None:
    """GPT-2 init: weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), biases 0, LN 1/0."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, m in module.named_modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()
            elif isinstance(m, (nn.Linear, nn.Embedding)):
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj") else 0.02
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * std)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()


def make_batch(cfg: GPTConfig, batch_size: int, *, seed: int = 0, seq_len: int | None = None):
    """Random token batch (idx, targets), each (batch_size, seq_len) int64, reproducible by seed."""
    gen = torch.Generator().manual_seed(seed)
    s = seq_len or cfg.block_size
    data = torch.randint(0, cfg.vocab_size, (batch_size, s + 1), generator=gen)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()
