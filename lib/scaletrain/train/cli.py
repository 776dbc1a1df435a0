"""`python -m scaletrain.train --dp D --pp P --tp T [--zero S]`: the capstone on spawned ranks or under torchrun."""

from __future__ import annotations

import argparse

from scaletrain.bench_cli import positive_int
from scaletrain.launch import is_primary, spawn
from scaletrain.train.config import OPTIMIZER_CLASSES, ZERO_STAGES, TrainConfig
from scaletrain.train.loop import train_rank

__all__ = ["run", "main"]


def run(cfg: TrainConfig, *, log: bool = True, timeout_s: float = 300) -> list[dict]:
    """`train_rank` on dp·pp·tp spawned ranks (or this torchrun rank)."""
    return spawn(train_rank, cfg.dp * cfg.pp * cfg.tp, cfg, log, timeout_s=timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.train", description=__doc__.splitlines()[0])
    for axis in ("dp", "pp", "tp"):
        parser.add_argument(f"--{axis}", type=positive_int, default=1, help=f"{axis} degree (default 1)")
    parser.add_argument("--steps", type=positive_int, default=20)
    parser.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b")
    parser.add_argument("--sp", action="store_true", help="sequence parallelism on the tp group")
    parser.add_argument("--zero", type=int, choices=ZERO_STAGES, default=0,
                        help="ZeRO stage on the dp group (default 0: plain data parallelism; 2 and 3 need --pp 1)")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZER_CLASSES), default="adamw")
    args = parser.parse_args(argv)
    try:
        cfg = TrainConfig(dp=args.dp, pp=args.pp, tp=args.tp, steps=args.steps, schedule=args.schedule,
                          sequence_parallel=args.sp, zero=args.zero, optimizer=args.optimizer)
    except ValueError as exc:
        parser.error(str(exc).removeprefix("TrainConfig: "))
    if is_primary():  # under torchrun every rank runs main: one header
        print(f"{cfg.dp}·{cfg.pp}·{cfg.tp} ranks (dp·pp·tp), {cfg.steps} steps of {cfg.global_batch} sequences "
              f"of {cfg.seq_len} bytes, {cfg.schedule}, sequence parallelism "
              f"{'on' if cfg.sequence_parallel else 'off'}, {cfg.optimizer}, "
              f"{f'ZeRO-{cfg.zero}' if cfg.zero else 'plain data parallelism'} on dp")
    run(cfg)
    return 0
