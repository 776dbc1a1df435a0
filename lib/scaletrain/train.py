"""`python -m scaletrain.train --dp D --pp P --tp T [--zero S]`: the tiny GPT trained on a 3D grid of D·P·T ranks.

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
  5. the optimizer (Adam, AdamW or SGD) steps this rank's parameters, identical across dp by construction.

`--zero S` replaces 4-5 with `scaletrain.zero.ZeRO` (Rajbhandari et al. 2020, §5; seminar §1.2.6) on
the dp group only: the tp and pp groups are untouched; each rank shards, over its dp peers, the Ψ
parameters it holds (its tp slice of its pp stage). Per rank, in fp32 with Adam (p = g = 4 and
K = 8 bytes per parameter; the seminar's mixed-precision form is Ψ·(2 + 2 + K)/N_d at stage 3):
stage 1 (4 + 4)Ψ + 8Ψ/N_d, stage 2 4Ψ + (4 + 8)Ψ/N_d, stage 3 (4 + 4 + 8)Ψ/N_d bytes, which the
run's last line prints, measured on rank 0, next to the formula. Stage 1 reduce-scatters in the
step, after the fix-ups of 3 as before. Stages 2 and 3 reduce-scatter inside the backward, before 3
can run, so the fix-ups sum gradient shards instead (`_allreduce_shards`: every sum is linear, so
the order does not matter). Every stage composes with every layout, pipelines and sequence
parallelism included (tests/test_train_zero.py), at a price under a pipeline: stages 2 and 3
reduce-scatter once per micro-batch, and stage 3 gathers every parameter twice per micro-batch, which
is why DeepSpeed's pipeline engine accepts only stage 1.

The data are the course's own handouts (assignments/*/README.md), read as bytes: a byte-level
tokenizer with the GPT's default vocabulary of 256. Every rank builds the whole batch of the step
from the step number and takes its dp slice, so one process on the whole batch is the reference
(`reference_losses`): the same losses and parameters within float tolerance, whatever the layout
(tests/test_tp_train.py). Each step prints the loss, tokens/s and the bytes rank 0 sent on each
axis: tp and dp counted by `comm_counter` (step 1's tp figure includes the executor's one shape
probe, a forward without gradients), pp computed from the activations and gradients it sent, and
the tied embedding's sum (with ZeRO, its traffic, hooks included, is the dp figure). Not composed yet:
bucketed overlap of the dp allreduce with the pipeline's backward, and dropout (the trainer's GPT has
none; `scaletrain.tp.dropout` makes tensor parallelism equal one process, but data and pipeline
parallelism would need masks keyed by the sample's index in the global batch).
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
from scaletrain.tp.collectives import allreduce
from scaletrain.tp.gpt import (TensorParallelGPT, allreduce_sequence_parallel_grads, parallelize,
                               sequence_parallel_params)
from scaletrain.zero import ZeRO, expected_memory, unshard

__all__ = ["TrainConfig", "OPTIMIZER_CLASSES", "ZERO_STAGES", "corpus", "batch", "Stage", "train_rank", "reference",
           "zero_summary", "main"]

REPO = Path(__file__).resolve().parents[2]
OPTIMIZER_CLASSES = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
ZERO_STAGES = (0, 1, 2, 3)  # 0: plain data parallelism (the flat allreduce below)


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


def _sum_tied_embedding(model: TensorParallelGPT, mesh: Mesh, groups: dict, zero: ZeRO | None) -> None:
    """First and last stage each hold the tied wte/lm_head weight and half its gradient: sum them
    (in `.grad`, or, after ZeRO-2/3's reduce-scatter, in the gradient shards)."""
    group = groups.get((mesh.dp_rank, mesh.tp_rank))
    if group is None or not (mesh.is_first_stage or mesh.is_last_stage):
        return
    w = model.wte.weight
    if zero is not None and zero.stage >= 2:
        _allreduce_shards(zero, {id(w)}, group)
        return
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
    """One rank of the run: returns {"losses": [...] (every rank), "params": {name: this rank's slice}}, and
    with ZeRO "memory": the model-state bytes this rank holds after the last step, beside ZeRO §5's."""
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
    names = {id(p): n for n, p in model.named_parameters()}  # before ZeRO: the GPT's names
    optimizer = _optimizer(cfg, params) if not cfg.zero else _zero(cfg, stage, model.wte.weight, mesh.dp_group)
    sp_params = {id(p) for p in sequence_parallel_params(stage)}
    tokens, rows = corpus(), cfg.micro_batches * cfg.micro_batch_size
    act_bytes = rows * cfg.seq_len * cfg.n_embd * 4 // (cfg.tp if cfg.sequence_parallel else 1)
    losses = []
    for step in range(cfg.steps):
        start = time.perf_counter()
        idx, targets = (x[mesh.dp_rank * rows:(mesh.dp_rank + 1) * rows] for x in batch(tokens, step, cfg))
        optimizer.zero_grad(set_to_none=True)
        zero_before = optimizer.sent.bytes_sent if cfg.zero else 0
        with comm_counter() as tp_sent:
            out = executor.step(idx if mesh.is_first_stage else None, targets if mesh.is_last_stage else None)
            # ZeRO-2/3's hooks sent inside the backward (this counter saw it): dp traffic, not tp
            zero_hooks = optimizer.sent.bytes_sent - zero_before if cfg.zero else 0
            if cfg.zero >= 2:
                _allreduce_shards(optimizer, sp_params, mesh.tp_group)
            else:
                allreduce_sequence_parallel_grads(stage, mesh.tp_group)
        with comm_counter() as emb_sent:
            _sum_tied_embedding(model, mesh, embedding_groups, optimizer if cfg.zero else None)
        with comm_counter() as dp_sent:
            if cfg.zero:
                optimizer.step()  # stage 1 reduce-scatters here; every stage averages over dp
            else:
                _average_over_dp(params, mesh.dp_group)
        if not cfg.zero:
            optimizer.step()
        # the step's loss: the mean of the last stage's micro-batch losses, averaged over dp, sent to all
        loss = torch.tensor([sum(out) / len(out) if out is not None else 0.0], dtype=torch.float64)
        dist.all_reduce(loss)  # only the dp·tp last-stage ranks contributed
        losses.append(loss.item() / (cfg.dp * cfg.tp))
        pp_sent = cfg.micro_batches * act_bytes * ((not mesh.is_last_stage) + (not mesh.is_first_stage))
        if log and rank == 0:
            tok_s = cfg.global_batch * cfg.seq_len / (time.perf_counter() - start)
            print(f"step {step + 1:3d}  loss {losses[-1]:.4f}  {tok_s:8.0f} tokens/s  sent by rank 0: "
                  f"tp {(tp_sent.bytes_sent - zero_hooks) / 1e3:.1f} KB  pp {pp_sent / 1e3:.1f} KB  "
                  f"dp {(dp_sent.bytes_sent + zero_hooks) / 1e3:.1f} KB  embedding {emb_sent.bytes_sent / 1e3:.1f} KB",
                  flush=True)
    result = {"losses": losses, "coords": asdict(mesh.coords),
              "params": {names[id(p)]: v for p, v in zip(params, _final_params(optimizer, params))}}
    if cfg.zero:
        result["memory"] = _zero_memory(optimizer, cfg.zero)
        if log and rank == 0:
            print(zero_summary(result["memory"], cfg), flush=True)
    return result


def _average_over_dp(params: list, dp_group) -> None:
    """Plain data parallelism: every gradient averaged over dp by one ring allreduce of a flat buffer."""
    for p in params:  # a parameter this stage did not use this step still takes part (zeros)
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    ring_allreduce(flat, op="avg", group=dp_group)
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(g.view_as(p))


def _zero(cfg: TrainConfig, stage: Stage, tied: nn.Parameter, dp_group) -> ZeRO:
    """ZeRO over the dp group, the tied embedding in a param group of its own when this stage holds it:
    its own flat unit, laid out alike on the first and the last stage, so that the two halves of its
    gradient can be summed shard by shard after ZeRO-2/3's reduce-scatter."""
    params = list(dict.fromkeys(stage.parameters()))
    groups = [{"params": [p for p in params if p is not tied]}]
    if any(p is tied for p in params):
        groups.insert(0, {"params": [tied]})
    return ZeRO(stage, optimizer_class=OPTIMIZER_CLASSES[cfg.optimizer], stage=cfg.zero, group=dp_group,
                param_groups=groups, lr=cfg.lr)


def _allreduce_shards(zero: ZeRO, param_ids: set[int], group) -> None:
    """ZeRO-2/3: sum over `group` the elements of this rank's gradient shards that belong to the
    parameters `param_ids`: the sequence-parallel ones over tp, the tied embedding over its group.

    The dp reduce-scatter ran in the backward, before these sums; all are linear, so the sum of the
    dp means is the dp mean of the sums (Megatron's `finalize_model_grads` also sums after its
    distributed optimizer's reduce-scatter). Rank r's shard of a unit is elements [r·m, (r+1)·m) of
    its flat buffer; the ranks of `group` share r and hold those parameters at the same offsets of
    equal-sized units (tp peers: the same units; the embedding: a unit of its own, `_zero`), so the
    pieces below line up across them: one allreduce of their concatenation."""
    pieces = []
    for unit in zero.units:
        lo, hi = unit.dp_rank * unit.shard_numel, (unit.dp_rank + 1) * unit.shard_numel
        for p, offset in zip(unit.params, unit.offsets):
            a, b = max(lo, offset), min(hi, offset + p.numel())
            if id(p) in param_ids and a < b:
                pieces.append(unit.shard.grad[a - lo:b - lo])
    if pieces:
        flat = allreduce(torch.cat(pieces), group)
        for piece, g in zip(pieces, flat.split([x.numel() for x in pieces])):
            piece.copy_(g)


def _final_params(optimizer: torch.optim.Optimizer, params: list) -> list[torch.Tensor]:
    """Copies of this rank's parameters; ZeRO-3 keeps only shards, so each unit is gathered into a
    fresh buffer (collective over dp) and read through the unit's views."""
    if not isinstance(optimizer, ZeRO) or optimizer.stage < 3:
        return [p.detach().clone() for p in params]
    values = {}
    for unit in optimizer.units:
        buffer = unit.shard.new_empty(unit.padded_numel)
        unshard(buffer, unit.shard.detach(), optimizer.group)
        values.update({id(p): v.clone() for p, v in zip(unit.params, unit.views(buffer))})
    return [values[id(p)] for p in params]


def _zero_memory(zero: ZeRO, stage: int) -> dict:
    """Bytes this rank holds now (after a step, before the next zero_grad), and ZeRO §5's formula
    at this rank's padded parameter count Ψ' (flat buffers are padded to a multiple of N_d)."""
    held, formula = zero.memory_report(), expected_memory(zero.units, zero.optimizer, stage)
    return {"params": held.params, "grads": held.grads, "optimizer": held.optimizer,
            "expected": asdict(formula), "num_params": sum(u.numel for u in zero.units),
            "padded_params": sum(u.padded_numel for u in zero.units), "dp": zero.dp_world_size}


def zero_summary(memory: dict, cfg: TrainConfig) -> str:
    kb = lambda key: f"{memory[key] / 1e3:.1f} KB (formula {memory['expected'][key] / 1e3:.1f})"  # noqa: E731
    return (f"ZeRO-{cfg.zero} over dp={memory['dp']}, rank 0 holds Ψ = {memory['num_params']:,} parameters "
            f"(Ψ' = {memory['padded_params']:,} padded): params {kb('params')}, grads {kb('grads')}, "
            f"{cfg.optimizer} state {kb('optimizer')}")


def _optimizer(cfg: TrainConfig, params: list) -> torch.optim.Optimizer:
    return OPTIMIZER_CLASSES[cfg.optimizer](params, lr=cfg.lr)


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


if __name__ == "__main__":
    raise SystemExit(main())
