"""The capstone's configuration, validated when built, and the batch of a step (the same on every layout)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scaletrain.data import windows
from scaletrain.models import GPTConfig
from scaletrain.zero.stages import STAGES

__all__ = ["TrainConfig", "OPTIMIZER_CLASSES", "ZERO_STAGES", "batch", "make_optimizer"]

OPTIMIZER_CLASSES = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
ZERO_STAGES = STAGES  # 0: plain data parallelism (the flat allreduce of `sync.PlainDataParallel`)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    dp: int = 1
    pp: int = 1
    tp: int = 1
    steps: int = 5
    micro_batches: int = 2        # m, per pipeline
    micro_batch_size: int = 2     # sequences per micro-batch
    seq_len: int = 32
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 64
    lr: float = 3e-3
    optimizer: str = "adamw"      # a key of OPTIMIZER_CLASSES (plain SGD: errors stay linear in rounding, for tight tests)
    seed: int = 0
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    zero: int = 0                 # ZeRO stage on the dp group; 0: plain data parallelism

    def __post_init__(self):
        if self.n_layer % self.pp:
            raise ValueError(f"TrainConfig: n_layer={self.n_layer} must be divisible by pp={self.pp} (equal stages)")
        if self.optimizer not in OPTIMIZER_CLASSES:
            raise ValueError(f"TrainConfig: optimizer must be one of {sorted(OPTIMIZER_CLASSES)}, got {self.optimizer!r}")
        if isinstance(self.zero, bool) or self.zero not in ZERO_STAGES:
            raise ValueError(f"TrainConfig: --zero must be one of {ZERO_STAGES} (0: plain data parallelism), "
                             f"got {self.zero!r}")
        if self.schedule not in ("gpipe", "1f1b"):
            raise ValueError(f"TrainConfig: schedule must be 'gpipe' or '1f1b', got {self.schedule!r}")

    @property
    def model(self) -> GPTConfig:
        return GPTConfig(vocab_size=256, block_size=self.seq_len, n_layer=self.n_layer, n_head=self.n_head,
                         n_embd=self.n_embd)

    @property
    def global_batch(self) -> int:
        return self.dp * self.micro_batches * self.micro_batch_size

    @property
    def rows_per_replica(self) -> int:
        """Sequences one dp replica trains on per step: m micro-batches of `micro_batch_size`."""
        return self.micro_batches * self.micro_batch_size


def batch(tokens: torch.Tensor, step: int, cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's whole batch (global_batch, seq_len): windows at seeded offsets; targets shifted by one."""
    gen = torch.Generator().manual_seed(cfg.seed * 100_003 + step)
    starts = torch.randint(0, len(tokens) - cfg.seq_len - 1, (cfg.global_batch,), generator=gen)
    return windows(tokens, starts.tolist(), cfg.seq_len)


def make_optimizer(cfg: TrainConfig, params: list) -> torch.optim.Optimizer:
    return OPTIMIZER_CLASSES[cfg.optimizer](params, lr=cfg.lr)
