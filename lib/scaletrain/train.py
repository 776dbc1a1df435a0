"""`python -m scaletrain.train --dp D --pp P --tp T`: the tiny GPT trained on a 3D grid of D·P·T ranks.

PTD-P (Narayanan et al. 2021; seminar §1.2.5) composed from the course's own parts, in the order a
step runs them on every rank of `scaletrain.mesh.ParallelDims(dp, pp, tp)`:

  1. tensor parallelism inside each stage: the GPT converted by `scaletrain.tp.parallelize` on the
     tp group (its layers' collectives run inside forward and backward);
  2. pipeline parallelism across stages: `scaletrain.pipeline.PipelineExecutor` on the pp group runs
     m micro-batches through this rank's stage (GPipe or 1F1B); the GPT's layers are cut into P
     equal runs of blocks, the embedding on the first stage, the head and the vocabulary-parallel
     loss on the last;
  3. gradient fix-ups, before anything is averaged: the sequence-parallel parameters' partial
     gradients summed over the tp group (`allreduce_sequence_parallel_grads`); the tied token
     embedding, used by the first stage (lookup) and the last (head), summed over those two ranks
     (Megatron's embedding group);
  4. data parallelism across replicas: every gradient averaged over the dp group by one ring
     allreduce of a flat buffer after the pipeline's backward (bucketing and overlap with it, as in
     `scaletrain.dp.DataParallel`, would need the executor to mark the last micro-batch);
  5. the optimizer (AdamW, or SGD) steps this rank's parameters, identical across dp by construction.

The data are the course's own handouts (assignments/*/README.md), read as bytes: a byte-level
tokenizer with the GPT's default vocabulary of 256. Every rank builds the whole batch of the step
from the step number and takes its dp slice, so one process on the whole batch is the reference
(`reference_losses`): the same losses and parameters within float tolerance, whatever the layout
(tests/test_tp_train.py). Each step prints the loss, tokens/s and the bytes rank 0 sent on each
axis: tp and dp counted by `comm_counter` (step 1's tp figure includes the executor's one shape
probe, a forward without gradients), pp computed from the activations and gradients it sent, and
the tied embedding's sum. Not composed yet: ZeRO on the dp group (`--zero` must be 0) and bucketed
overlap of the dp allreduce with the pipeline's backward.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from scaletrain.comm import comm_counter, ring_allreduce
from scaletrain.launch import is_primary, spawn
from scaletrain.mesh import Mesh, ParallelDims
from scaletrain.models import GPT, GPTConfig
from scaletrain.pipeline import PipelineExecutor
from scaletrain.pipeline.schedules import gpipe, one_f_one_b
from scaletrain.tp.gpt import TensorParallelGPT, allreduce_sequence_parallel_grads, parallelize

__all__ = ["TrainConfig", "corpus", "batch", "Stage", "train_rank", "reference", "main"]

REPO = Path(__file__).resolve().parents[2]


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
    optimizer: str = "adamw"      # or "sgd" (plain SGD: errors stay linear in rounding, for tight tests)
    seed: int = 0
    sequence_parallel: bool = False
    schedule: str = "1f1b"

    def __post_init__(self):
        if self.n_layer % self.pp:
            raise ValueError(f"TrainConfig: n_layer={self.n_layer} must be divisible by pp={self.pp} (equal stages)")
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"TrainConfig: optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        if self.schedule not in ("gpipe", "1f1b"):
            raise ValueError(f"TrainConfig: schedule must be 'gpipe' or '1f1b', got {self.schedule!r}")

    @property
    def model(self) -> GPTConfig:
        return GPTConfig(vocab_size=256, block_size=self.seq_len, n_layer=self.n_layer, n_head=self.n_head,
                         n_embd=self.n_embd)

    @property
    def global_batch(self) -> int:
        return self.dp * self.micro_batches * self.micro_batch_size


def corpus() -> torch.Tensor:
    """The course's handouts as one byte string, one token per byte (int64)."""
    text = b"\n\n".join(p.read_bytes() for p in sorted(REPO.glob("assignments/*/README.md")))
    if len(text) < 4096:
        raise FileNotFoundError(f"scaletrain.train: the handouts under {REPO / 'assignments'} are missing")
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


def batch(tokens: torch.Tensor, step: int, cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's whole batch (global_batch, seq_len): windows at seeded offsets; targets shifted by one."""
    gen = torch.Generator().manual_seed(cfg.seed * 100_003 + step)
    starts = torch.randint(0, len(tokens) - cfg.seq_len - 1, (cfg.global_batch,), generator=gen)
    rows = torch.stack([tokens[s:s + cfg.seq_len + 1] for s in starts.tolist()])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


class Stage(nn.Module):
    """Blocks [lo, hi) of a tensor-parallel GPT, with its embedding first and/or its head last."""

    def __init__(self, model: TensorParallelGPT, lo: int, hi: int, *, first: bool, last: bool):
        super().__init__()
        # bound methods, not the model: registering it would make every stage own every parameter
        self.embed, self.head = (model.embed if first else None), (model.head if last else None)
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        self.ends = nn.ModuleList(([model.wte, model.wpe] if first else []) +
                                  ([model.ln_f, model.lm_head] if last else []))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x) if self.embed is not None else x
        for block in self.blocks:
            x = block(x)
        return self.head(x) if self.head is not None else x


def _sum_tied_embedding(model: TensorParallelGPT, mesh: Mesh, groups: dict) -> None:
    """First and last stage each hold the tied wte/lm_head weight and half its gradient: sum them."""
    group = groups.get((mesh.dp_rank, mesh.tp_rank))
    if group is None or not (mesh.is_first_stage or mesh.is_last_stage):
        return
    w = model.wte.weight
    if w.grad is None:
        w.grad = torch.zeros_like(w)
    ring_allreduce(w.grad, group=group)


def _embedding_groups(dims: ParallelDims, timeout_s: float) -> dict:
    """(dp, tp) -> the group of the first and last stage's ranks (every rank creates every group)."""
    import datetime
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


def train_rank(rank: int, world_size: int, cfg: TrainConfig, log: bool = True) -> dict:
    """One rank of the run: returns {"losses": [...] (every rank), "params": {name: this rank's slice}}."""
    dims = ParallelDims(dp=cfg.dp, pp=cfg.pp, tp=cfg.tp)
    mesh = dims.build(timeout_s=120)
    embedding_groups = _embedding_groups(dims, 120)
    model = parallelize(GPT(cfg.model, seed=cfg.seed), mesh.tp_group, sequence_parallel=cfg.sequence_parallel)
    per_stage = cfg.n_layer // cfg.pp
    stage = Stage(model, mesh.pp_rank * per_stage, (mesh.pp_rank + 1) * per_stage,
                  first=mesh.is_first_stage, last=mesh.is_last_stage)
    make = one_f_one_b if cfg.schedule == "1f1b" and cfg.micro_batches >= cfg.pp else gpipe  # 1F1B needs m >= p
    schedule = make(cfg.pp, cfg.micro_batches)
    executor = PipelineExecutor([stage], schedule=schedule, loss_fn=model.loss, group=mesh.pp_group)
    params = list(dict.fromkeys(stage.parameters()))
    optimizer = _optimizer(cfg, params)
    tokens, rows = corpus(), cfg.micro_batches * cfg.micro_batch_size
    act_bytes = rows * cfg.seq_len * cfg.n_embd * 4 // (cfg.tp if cfg.sequence_parallel else 1)
    losses = []
    for step in range(cfg.steps):
        start = time.perf_counter()
        idx, targets = (x[mesh.dp_rank * rows:(mesh.dp_rank + 1) * rows] for x in batch(tokens, step, cfg))
        optimizer.zero_grad(set_to_none=True)
        with comm_counter() as tp_sent:
            out = executor.step(idx if mesh.is_first_stage else None, targets if mesh.is_last_stage else None)
            allreduce_sequence_parallel_grads(stage, mesh.tp_group)
        with comm_counter() as emb_sent:
            _sum_tied_embedding(model, mesh, embedding_groups)
        with comm_counter() as dp_sent:
            for p in params:  # a parameter this stage did not use this step still takes part (zeros)
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            ring_allreduce(flat, op="avg", group=mesh.dp_group)
            for p, g in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(g.view_as(p))
        optimizer.step()
        # the step's loss: the mean of the last stage's micro-batch losses, averaged over dp, sent to all
        loss = torch.tensor([sum(out) / len(out) if out is not None else 0.0], dtype=torch.float64)
        dist.all_reduce(loss)  # only the dp·tp last-stage ranks contributed
        losses.append(loss.item() / (cfg.dp * cfg.tp))
        pp_sent = cfg.micro_batches * act_bytes * ((not mesh.is_last_stage) + (not mesh.is_first_stage))
        if log and rank == 0:
            tok_s = cfg.global_batch * cfg.seq_len / (time.perf_counter() - start)
            print(f"step {step + 1:3d}  loss {losses[-1]:.4f}  {tok_s:8.0f} tokens/s  sent by rank 0: "
                  f"tp {tp_sent.bytes_sent / 1e3:.1f} KB  pp {pp_sent / 1e3:.1f} KB  "
                  f"dp {dp_sent.bytes_sent / 1e3:.1f} KB  embedding {emb_sent.bytes_sent / 1e3:.1f} KB", flush=True)
    names = {id(p): n for n, p in model.named_parameters()}
    return {"losses": losses, "coords": asdict(mesh.coords),
            "params": {names[id(p)]: p.detach().clone() for p in params}}


def _optimizer(cfg: TrainConfig, params: list) -> torch.optim.Optimizer:
    return (torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.SGD)(params, lr=cfg.lr)


def reference(cfg: TrainConfig) -> dict:
    """One process, the whole batch of every step, the same optimizer: {"losses": [...], "params": {name: tensor}}."""
    model = GPT(cfg.model, seed=cfg.seed)
    optimizer = _optimizer(cfg, list(model.parameters()))
    tokens, losses = corpus(), []
    for step in range(cfg.steps):
        optimizer.zero_grad(set_to_none=True)
        loss = model(*batch(tokens, step, cfg))[1]
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def run(cfg: TrainConfig, *, log: bool = True, timeout_s: float = 300) -> list[dict]:
    """`train_rank` on dp·pp·tp spawned ranks (or this torchrun rank)."""
    return spawn(train_rank, cfg.dp * cfg.pp * cfg.tp, cfg, log, timeout_s=timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.train", description=__doc__.splitlines()[0])
    for axis in ("dp", "pp", "tp"):
        parser.add_argument(f"--{axis}", type=int, default=1, help=f"{axis} degree (default 1)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b")
    parser.add_argument("--sp", action="store_true", help="sequence parallelism on the tp group")
    parser.add_argument("--zero", type=int, default=0, help="only 0 (plain data parallelism) is composed so far")
    args = parser.parse_args(argv)
    if args.zero:
        parser.error("--zero S: ZeRO on the dp group is not composed with the pipeline yet; use --zero 0")
    cfg = TrainConfig(dp=args.dp, pp=args.pp, tp=args.tp, steps=args.steps, schedule=args.schedule,
                      sequence_parallel=args.sp)
    if is_primary():  # under torchrun every rank runs main: one header
        print(f"{cfg.dp}·{cfg.pp}·{cfg.tp} ranks (dp·pp·tp), {cfg.steps} steps of {cfg.global_batch} sequences "
              f"of {cfg.seq_len} bytes, {cfg.schedule}, sequence parallelism "
              f"{'on' if cfg.sequence_parallel else 'off'}")
    run(cfg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
