"""Closing the loop on this machine: a ClusterSpec measured here, and the planner's prediction of the
course's own runs held against their measured step times (tests/test_plan_local.py).

What is measured, in one spawn of p gloo ranks (one thread each, as every course run has):
  * peak: the FLOP rate of a single-threaded fp32 matmul (the planner's "peak");
  * links: α and β of gloo's allreduce at a few sizes, fitted by module 2's
    `scaletrain.comm.cost_model.fit` (every rank is on this host: intra = inter);
  * efficiency: one number, a = peak / achieved, from the tiny GPT's forward + backward on each
    rank alone (no communication) at the runs' microbatch, the way Table 1 calibrates the A100;
  * the runs: a data-parallel step (module 3's DataParallel, one bucket reduced after the
    backward, i.e. overlap_dp=False) and a 1F1B pipeline step (module 4's executor, the GPT cut
    into p stages of whole layers), each predicted by `scaletrain.plan.prediction.predict`.

The calibration sees no communication, no bubble and no pipeline message: those the planner must
predict. The planner counts 16-bit values on the wire; these runs are fp32, so the measured
links are handed to it at half their bandwidth (`fp32_link`). The steps leave the optimizer out,
so the local cluster's memory bandwidth is infinite (its optimizer term is 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from scaletrain.bench import time_fn
from scaletrain.comm.cost_model import AlphaBeta, Sample, fit
from scaletrain.launch import spawn
from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.ops import ceiling
from scaletrain.plan.efficiency import GemmEfficiency
from scaletrain.plan.flops import iteration_flops
from scaletrain.plan.prediction import predict
from scaletrain.plan.specs import ClusterSpec, Layout, ModelSpec

__all__ = ["LOOP_CONFIG", "model_spec", "fp32_link", "measure", "local_cluster",
           "LoopRow", "close_the_loop"]

# big enough that a step is GEMM time, not Python, on one core; small enough for a test
LOOP_CONFIG = GPTConfig(vocab_size=256, block_size=128, n_layer=4, n_head=4, n_embd=256)
SIZES = (64 << 10, 1 << 20, 8 << 20)  # allreduce sizes for the α–β fit


def model_spec(cfg: GPTConfig) -> ModelSpec:
    return ModelSpec(layers=cfg.n_layer, hidden=cfg.n_embd, heads=cfg.n_head, seq=cfg.block_size,
                     vocab=cfg.vocab_size, name="tiny GPT")


def fp32_link(link: AlphaBeta) -> AlphaBeta:
    """The planner moves 2-byte values; an fp32 run moves 4: the same link at half the bandwidth."""
    return AlphaBeta(alpha_s=link.alpha_s, beta_s_per_byte=2 * link.beta_s_per_byte)


class _Stage(nn.Module):
    """Layers [lo, hi) of a GPT, with the embedding on the first stage and the head on the last."""

    def __init__(self, gpt: GPT, lo: int, hi: int):
        super().__init__()
        self.gpt, self.lo, self.hi = gpt, lo, hi
        self.first, self.last = lo == 0, hi == gpt.cfg.n_layer

    def forward(self, x):
        if self.first:
            x = self.gpt.wte(x) + self.gpt.wpe(torch.arange(x.shape[1]))
        for block in self.gpt.blocks[self.lo:self.hi]:
            x = block(x)
        return self.gpt.lm_head(self.gpt.ln_f(x)) if self.last else x


def _loss(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _measure_rank(rank: int, p: int, cfg: GPTConfig, microbatch: int, m: int, reps: int) -> dict:
    import statistics

    from scaletrain.dp.data_parallel import DataParallel
    from scaletrain.pipeline import PipelineExecutor, one_f_one_b

    group, out = dist.group.WORLD, {}
    out["matmul_flops"] = ceiling.measure_matmul("cpu", size=512, dtype=torch.float32) * 1e12  # median of 10
    samples = []
    for nbytes in SIZES:
        t = time_fn(dist.all_reduce, setup=lambda n=nbytes: (torch.ones(n // 4),), warmup=2, reps=reps, group=group)
        samples.append((nbytes, t.median))
    out["allreduce"] = samples

    gpt, (x, y) = GPT(cfg), make_batch(cfg, microbatch, seed=rank)
    ddp = DataParallel(GPT(cfg), bucket_cap_mb=None, allreduce="torch", overlap=False)
    per = cfg.n_layer // p
    ex = PipelineExecutor({rank: _Stage(GPT(cfg), rank * per, (rank + 1) * per)}, schedule=one_f_one_b(p, m),
                          loss_fn=_loss)
    xb, yb = make_batch(cfg, microbatch * m, seed=7)

    def dp_step():
        ddp(x, y)[1].backward()
        ddp.finish_gradient_synchronization()

    runs = {"single_s": lambda: gpt(x, y)[1].backward(), "dp_s": dp_step,
            "pp_s": lambda: ex.step(xb if ex.is_first_stage else None, yb if ex.is_last_stage else None)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(reps + 1):  # one after another, rep by rep: a shared machine's drift hits all three
        for name, fn in runs.items():
            t = time_fn(fn, warmup=0, reps=1, group=group).median
            if rep:  # the first round warms up
                times[name].append(t)
    ddp.close()
    return out | {name: statistics.median(ts) for name, ts in times.items()}


def measure(p: int = 2, *, cfg: GPTConfig = LOOP_CONFIG, microbatch: int = 2, m: int = 8, reps: int = 5) -> dict:
    """Everything above in one spawn of p ranks: rank 0's matmul rate, the allreduce samples and
    the slowest rank's median step times (single, dp, pp)."""
    if cfg.n_layer % p:
        raise ValueError(f"measure: n_layer={cfg.n_layer} must divide among p={p} pipeline stages")
    return spawn(_measure_rank, p, cfg, microbatch, m, reps, timeout_s=300)[0]


def local_cluster(measured: dict, p: int, *, cfg: GPTConfig = LOOP_CONFIG, microbatch: int = 2) -> ClusterSpec:
    """The ClusterSpec of this machine from `measure`'s output."""
    link = fit(Sample(algorithm="ring", world_size=p, nbytes=n, seconds=s) for n, s in measured["allreduce"])
    spec = model_spec(cfg)
    achieved = iteration_flops(spec, microbatch, recompute="none") / measured["single_s"]
    return ClusterSpec(name="this machine (gloo)", gpus_per_node=p, peak_flops=measured["matmul_flops"],
                       hbm_bytes=10 ** 12, hbm_bandwidth=float("inf"), intra=fp32_link(link), inter=fp32_link(link),
                       efficiency=GemmEfficiency(a=measured["matmul_flops"] / achieved))


@dataclass(frozen=True)
class LoopRow:
    run: str
    layout: str
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def close_the_loop(p: int = 2, *, cfg: GPTConfig = LOOP_CONFIG, microbatch: int = 2, m: int = 8,
                   reps: int = 5) -> tuple[ClusterSpec, list[LoopRow]]:
    """Measure this machine and the runs, predict the runs: (cluster, rows)."""
    measured = measure(p, cfg=cfg, microbatch=microbatch, m=m, reps=reps)
    cluster = local_cluster(measured, p, cfg=cfg, microbatch=microbatch)
    spec, rows = model_spec(cfg), []
    for run, lay in (("DP", Layout(tp=1, pp=1, dp=p, microbatch=microbatch, global_batch=p * microbatch,
                                   recompute="none", overlap_dp=False)),
                     ("PP 1F1B", Layout(tp=1, pp=p, dp=1, microbatch=microbatch, global_batch=m * microbatch,
                                        recompute="none"))):
        pred = predict(spec, cluster, lay)
        rows.append(LoopRow(run, lay.describe(), measured[f"{run[:2].lower()}_s"], pred.iteration_s))
    return cluster, rows
