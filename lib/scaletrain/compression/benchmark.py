"""`python -m scaletrain.bench compression`: what gradient compression saves in bytes and costs in
loss and step time, measured on the same run.

The tiny GPT on the bundled corpus (the course handouts, scaletrain.data.corpus), data-parallel
over p ranks (gloo, one thread per rank), the same seeds, batches and Adam for every method; only
the gradient synchronization differs:

  adam (DP)     DataParallel, fp32 ring allreduce of every bucket        (the uncompressed baseline)
  powersgd r=1  PowerSGD rank 1 with error feedback, warm-started Q,     (powersgd.py)
                plain allreduces for the first 10 % of the steps (the seminar's default)
  powersgd r=4  PowerSGD rank 4, the same
  1-bit EF      signs + one fp32 scale per bucket, error feedback        (onebit.py)
  1-bit Adam    no DataParallel: OneBitAdam exchanges fp32 gradients for the first 20 % of the
                steps (warm-up), then its 1-bit compressed momentum        (onebit_adam.py)
                (with torch Adam's bias correction, so its warm-up is the baseline's Adam step for
                step and the gap to Adam is the compression's alone; the authors' code has none,
                which after 30 warm-up steps makes every step ≈ 5.6× Adam's)

Printed per method: the loss (mean of the last 5 steps, every rank's loss averaged), its gap to
Adam's at the same step, bytes one rank sent per step (comm_counter, max over ranks; the median
step, a compressed one) beside the
formula (PowerSGD: ring bytes of its [uncompressed, P, Q] payloads; 1-bit: (p−1)·4·(⌈n/32⌉+1) per
bucket; 1-bit Adam after warm-up: 2(p−1)·4·(⌈⌈n/p⌉/32⌉+1)), the total sent over the run, the reduction versus Adam, and the step time (forward + backward + synchronization +
optimizer) median / p20 / p80 with the ratio to uncompressed DataParallel from steps timed
alternately in one run (slowest rank). Plot: bench_out/compression_loss.png, loss vs step and
loss vs cumulative bytes.

On a CPU machine the compressor's matrix products and bit packing run on the same cores as the
model, and the loopback "network" is fast: the step-time ratio shows the compute compression adds,
not the transfer time it would save on a slow link (see the α–β model of module 2 for when it pays).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
import torch.distributed as dist

from scaletrain import bench
from scaletrain.bench_cli import positive_int
from scaletrain.comm import comm_counter, ring_allreduce
from scaletrain.compression.hook import compressed_data_parallel
from scaletrain.compression.onebit import OneBitEF, onebit_bytes
from scaletrain.compression.onebit_adam import (CompressedAllreduceState, OneBitAdam, compressed_allreduce,
                                                compressed_allreduce_bytes)
from scaletrain.compression.powersgd import PowerSGD, powersgd_payloads
from scaletrain.data import corpus, windows
from scaletrain.dp.data_parallel import DataParallel
from scaletrain.dp.naive import broadcast_module
from scaletrain.launch import spawn
from scaletrain.models import GPT, GPTConfig

DISTRIBUTED = True  # spawns ranks: `python -m scaletrain.bench all` runs it under torchrun
CFG = GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=64)
BATCH_PER_RANK = 8
CAP_MB = 1.0
LR = 3e-3
METHODS = ("adam (DP)", "powersgd r=1", "powersgd r=4", "1-bit EF", "1-bit Adam")
# PowerSGD runs plain allreduces for the first 10 % of the steps: "the beginning of training can be
# sensitive to inaccurate gradients and deferring for 10% is suggested default" (seminar §1.2.8);
# 1-bit Adam's fp32 warm-up is its counterpart. At p = 4, rank 4 from step 0 ended 10.7 % above Adam
# after 150 steps, deferred 1.3 %.
DEFER = 0.1
# the compression hooks by method name and run length; the "no EF" pairs show what error feedback is
# for (notebook 08)
HOOKS = {"powersgd r=1": lambda steps: PowerSGD(rank=1, start_iter=int(DEFER * steps)),
         "powersgd r=4": lambda steps: PowerSGD(rank=4, start_iter=int(DEFER * steps)),
         "powersgd r=1, no EF": lambda steps: PowerSGD(rank=1, error_feedback=False, start_iter=int(DEFER * steps)),
         "1-bit EF": lambda steps: OneBitEF(), "1-bit EF, 64/scale": lambda steps: OneBitEF(chunk_numel=64),
         "1-bit, 64/scale, no EF": lambda steps: OneBitEF(chunk_numel=64, error_feedback=False)}


def _make(method: str, steps: int):
    """(model, optimizer) of a method."""
    module = GPT(CFG, seed=0)
    if method == "1-bit Adam":
        broadcast_module(module)
        return module, OneBitAdam(module.parameters(), lr=LR, warmup_steps=max(2, steps // 5), bias_correction=True)
    if method == "adam (DP)":
        model = DataParallel(module, bucket_cap_mb=CAP_MB, allreduce="ring")
        return model, torch.optim.Adam(model.parameters(), lr=LR)
    if method not in HOOKS:
        raise ValueError(f"unknown method {method!r}; choose from adam (DP), 1-bit Adam, {', '.join(HOOKS)}")
    model = compressed_data_parallel(module, HOOKS[method](steps), bucket_cap_mb=CAP_MB)
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def batch(tokens: torch.Tensor, step: int, rank: int, p: int):
    """Rank `rank`'s share of step `step`'s batch: the same sequences for every method (seeded by step)."""
    gen = torch.Generator().manual_seed(10_007 * step + 1)
    starts = torch.randint(0, len(tokens) - CFG.block_size - 1, (p * BATCH_PER_RANK,), generator=gen)
    return windows(tokens, starts[rank * BATCH_PER_RANK:(rank + 1) * BATCH_PER_RANK].tolist(), CFG.block_size)


def _formula_bytes(model, method: str, p: int) -> int:
    if method == "1-bit Adam":
        return compressed_allreduce_bytes(sum(q.numel() for q in model.parameters()), p)
    total = 0
    for b in model.buckets:
        shapes, n = [q.shape for q in b.params], b.buffer.numel()
        if method == "adam (DP)":
            total += 2 * (p - 1) * -(-n // p) * 4
        elif isinstance(model.compression_hook, PowerSGD):
            total += sum(2 * (p - 1) * -(-k // p) * 4 for k in powersgd_payloads(shapes, model.compression_hook.rank))
        else:
            total += onebit_bytes(n, p)
    return total


def _step(model, opt, tokens, step: int, rank: int, p: int) -> tuple[float, int, float]:
    x, y = batch(tokens, step, rank, p)
    t0 = time.perf_counter()
    with comm_counter() as c:
        loss = model(x, y)[1]
        loss.backward()
        if hasattr(model, "finish_gradient_synchronization"):
            model.finish_gradient_synchronization()
        opt.step()  # 1-bit Adam communicates here
    opt.zero_grad(set_to_none=True)
    return loss.item(), c.bytes_sent, time.perf_counter() - t0


def _sync(model, method: str):
    """f(flat gradients) running one step's gradient synchronization of `method` alone."""
    if method == "1-bit Adam":
        state = CompressedAllreduceState()
        return lambda flat: compressed_allreduce(flat, state)
    hook = getattr(model, "compression_hook", None)
    jobs = [(b.index, b.buffer.numel(), [q.shape for q in b.params]) for b in model.buckets]

    def sync(flat):
        o = 0
        for index, n, shapes in jobs:
            if hook is None:
                ring_allreduce(flat[o:o + n])
            else:
                hook.reduce(index, flat[o:o + n], shapes)
            o += n
    return sync


def _rank(rank: int, p: int, steps: int, reps: int, methods: tuple[str, ...] = METHODS,
          ring_sizes: tuple[int, ...] = ()) -> dict[str, Any]:
    tokens = corpus()
    out: dict[str, Any] = {"methods": {}}
    models = {}
    for method in methods:
        model, opt = _make(method, steps)
        losses, sent = [], []
        for step in range(steps):
            loss, nbytes, _ = _step(model, opt, tokens, step, rank, p)
            both = torch.tensor([loss, float(nbytes)])
            dist.all_reduce(both[:1])
            dist.all_reduce(both[1:], op=dist.ReduceOp.MAX)
            losses.append(both[0].item() / p)
            sent.append(int(both[1].item()))
        models[method] = (model, opt)
        out["methods"][method] = dict(losses=losses, sent=sent, formula=_formula_bytes(model, method, p),
                                      buckets=len(getattr(model, "buckets", ())),
                                      bucket_shapes=[[tuple(q.shape) for q in b.params]
                                                     for b in getattr(model, "buckets", ())])
    times = {m: [] for m in methods}
    for rep in range(reps):  # alternate: every method's step i beside the baseline's step i
        for method in methods:
            model, opt = models[method]
            t = torch.tensor([_step(model, opt, tokens, steps + rep, rank, p)[2]])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times[method].append(t.item())
    # the synchronization alone, timed alternately with DataParallel's ring allreduce on the same
    # gradient copies: what a compressor adds besides its (loopback) transfer is its compute
    baseline = _sync(models[methods[0]][0], methods[0])
    n = out["n_params"] = sum(q.numel() for q in models[methods[0]][0].parameters())
    gen = torch.Generator().manual_seed(rank)
    for method in methods:
        out["methods"][method]["times"] = times[method]
        if reps:
            sync = bench.compare(_sync(models[method][0], method), baseline, warmup=1, reps=2 * reps,
                                 setup=lambda: (torch.randn(n, generator=gen),), group=dist.group.WORLD)
            out["methods"][method]["sync"] = (sync.candidate.median, sync.baseline.median)
        if hasattr(models[method][0], "close"):
            models[method][0].close()
    # (bytes, seconds) of our ring allreduce (slowest rank): the samples of module 2's α–β fit
    out["ring"] = [(n * 4, bench.time_fn(ring_allreduce, setup=lambda n=n: (torch.ones(n),), warmup=1, reps=5,
                                         group=dist.group.WORLD).median) for n in ring_sizes]
    return out


def run(world_size: int = 2, *, steps: int = 30, reps: int = 5, methods: tuple[str, ...] = METHODS,
        ring_sizes: tuple[int, ...] = ()) -> dict[str, Any]:
    """One spawn: every method trained `steps` steps on the same batches, then `reps` steps of each
    timed alternately, each method's synchronization alone timed against the first method's (DataParallel's
    ring allreduce, on the same gradients), then our ring allreduce timed at `ring_sizes` elements.
    Returns rank 0's {"methods": {name: {losses, sent, formula, bucket_shapes, times, sync}}, "n_params",
    "ring"}, sync = (median seconds of the method's synchronization, of the baseline's beside it).
    The first method is the baseline of the benchmark's ratios."""
    return spawn(_rank, world_size, steps, reps, tuple(methods), tuple(ring_sizes),
                 timeout_s=120 + 6 * len(methods) * (steps + reps))[0]


def _plot(results: dict[int, dict], name: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for p, res in results.items():
        for method, r in res["methods"].items():
            label = f"{method}, p={p}"
            axes[0].plot(range(1, len(r["losses"]) + 1), r["losses"], label=label)
            cum = torch.tensor(r["sent"], dtype=torch.float64).cumsum(0) / 2**20
            axes[1].plot(cum.tolist(), r["losses"], label=label)
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("MiB sent by one rank (cumulative, comm_counter)")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.set_ylabel("training loss")
        ax.legend(fontsize=7)
    fig.suptitle("Gradient compression on the tiny GPT (Adam on every method, gloo on CPU)", fontsize=9)
    fig.tight_layout()
    return bench.save_figure(fig, name)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.bench compression", description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", default=None, help="comma-separated, default 2; under torchrun: its WORLD_SIZE")
    parser.add_argument("--steps", type=positive_int, default=150, help="training steps per method")
    parser.add_argument("--reps", type=positive_int, default=15, help="alternately timed steps per method")
    parser.add_argument("--quick", action="store_true", help="p = 2, 8 steps, 3 timed reps")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.reps = 8, 3
    try:
        world_sizes = bench.world_sizes(args.world_sizes, "2")
    except ValueError as exc:
        parser.error(str(exc))
    print(f"tiny GPT L={CFG.n_layer} h={CFG.n_embd} s={CFG.block_size}, {BATCH_PER_RANK} sequences per rank, "
          f"Adam lr {LR}, bucket cap {CAP_MB} MiB, {args.steps} steps, {args.reps} timed reps, gloo, 1 thread per rank")
    results = {p: run(p, steps=args.steps, reps=args.reps) for p in world_sizes}
    rows = []
    for p, res in results.items():
        base = res["methods"][METHODS[0]]
        base_loss = sum(base["losses"][-5:]) / len(base["losses"][-5:])
        for method, r in res["methods"].items():
            loss = sum(r["losses"][-5:]) / len(r["losses"][-5:])
            per_step = bench.quantile(r["sent"], 0.5)
            ratios = [t / b for t, b in zip(r["times"], base["times"])]
            rows.append({"p": p, "method": method, "loss": loss, "vs_adam_%": 100 * (loss / base_loss - 1),
                         "bytes/step": int(per_step), "formula": r["formula"], "total_MiB": sum(r["sent"]) / 2**20,
                         "fewer_bytes_x": bench.quantile(base["sent"], 0.5) / per_step,
                         "fewer_total_x": sum(base["sent"]) / sum(r["sent"]),
                         "step_ms": 1e3 * bench.quantile(r["times"], 0.5),
                         "p20_ms": 1e3 * bench.quantile(r["times"], 0.2), "p80_ms": 1e3 * bench.quantile(r["times"], 0.8),
                         "vs_DP": bench.quantile(ratios, 0.5), "vs_DP_p20": bench.quantile(ratios, 0.2),
                         "vs_DP_p80": bench.quantile(ratios, 0.8)})
    print(bench.format_table(rows))
    print("loss: mean of the last 5 steps; vs_adam_%: gap to uncompressed Adam at the same step; "
          "bytes/step: one rank, median over steps (= formula; 1-bit Adam: after warm-up);\nvs_DP: median of paired step-time ratios "
          "to uncompressed DataParallel (CPU: the compressor's compute shares the cores; no slow link to save on)")
    path = _plot(results, "compression_loss.png")
    if path:
        print(f"plot: {path}")
    return 0
