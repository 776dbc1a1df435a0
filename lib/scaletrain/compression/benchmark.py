"""`python -m scaletrain.bench compression`: what gradient compression saves in bytes and costs in
loss and step time, measured on the same run.

The tiny GPT on the bundled corpus (the course handouts, scaletrain.train.corpus), data-parallel
over p ranks (gloo, one thread per rank), the same seeds, batches and Adam for every method; only
the gradient synchronization differs:

  adam (DP)     DataParallel, fp32 ring allreduce of every bucket        (the uncompressed baseline)
  powersgd r=1  PowerSGD rank 1 with error feedback, warm-started Q     (powersgd.py)
  powersgd r=4  PowerSGD rank 4
  1-bit EF      signs + one fp32 scale per bucket, error feedback        (onebit.py)
  1-bit Adam    no DataParallel: OneBitAdam exchanges fp32 gradients for the first 20 % of the
                steps (warm-up), then its 1-bit compressed momentum        (onebit_adam.py)
                (no bias correction, as in the paper's code: its warm-up differs from torch Adam)

Printed per method: the loss (mean of the last 5 steps, every rank's loss averaged), its gap to
Adam's at the same step, bytes one rank sent per step (comm_counter, max over ranks) beside the
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
from scaletrain.comm import comm_counter
from scaletrain.compression.hook import compressed_data_parallel
from scaletrain.compression.onebit import OneBitEF, onebit_bytes
from scaletrain.compression.onebit_adam import OneBitAdam, compressed_allreduce_bytes
from scaletrain.compression.powersgd import PowerSGD, powersgd_payloads
from scaletrain.dp.data_parallel import DataParallel
from scaletrain.dp.naive import broadcast_module
from scaletrain.launch import spawn
from scaletrain.models import GPT, GPTConfig

CFG = GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=64)
BATCH_PER_RANK = 8
CAP_MB = 1.0
LR = 3e-3
METHODS = ("adam (DP)", "powersgd r=1", "powersgd r=4", "1-bit EF", "1-bit Adam")


def _make(method: str, steps: int):
    """(model, optimizer) of a method."""
    module = GPT(CFG, seed=0)
    if method == "1-bit Adam":
        broadcast_module(module)
        return module, OneBitAdam(module.parameters(), lr=LR, warmup_steps=max(2, steps // 5))
    if method == "adam (DP)":
        model = DataParallel(module, bucket_cap_mb=CAP_MB, allreduce="ring")
        return model, torch.optim.Adam(model.parameters(), lr=LR)
    hook = {"powersgd r=1": lambda: PowerSGD(rank=1), "powersgd r=4": lambda: PowerSGD(rank=4),
            "1-bit EF": lambda: OneBitEF()}[method]()
    model = compressed_data_parallel(module, hook, bucket_cap_mb=CAP_MB)
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def _batch(tokens: torch.Tensor, step: int, rank: int, p: int):
    gen = torch.Generator().manual_seed(10_007 * step + 1)
    starts = torch.randint(0, len(tokens) - CFG.block_size - 1, (p * BATCH_PER_RANK,), generator=gen)
    mine = starts[rank * BATCH_PER_RANK:(rank + 1) * BATCH_PER_RANK].tolist()
    rows = torch.stack([tokens[s:s + CFG.block_size + 1] for s in mine])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def _formula_bytes(model, method: str, p: int) -> int:
    if method == "1-bit Adam":
        return compressed_allreduce_bytes(sum(q.numel() for q in model.parameters()), p)
    total = 0
    for b in model.buckets:
        shapes, n = [q.shape for q in b.params], b.buffer.numel()
        if method == "adam (DP)":
            total += 2 * (p - 1) * -(-n // p) * 4
        elif method.startswith("powersgd"):
            total += sum(2 * (p - 1) * -(-k // p) * 4 for k in powersgd_payloads(shapes, int(method[-1])))
        else:
            total += onebit_bytes(n, p)
    return total


def _step(model, opt, tokens, step: int, rank: int, p: int) -> tuple[float, int, float]:
    x, y = _batch(tokens, step, rank, p)
    t0 = time.perf_counter()
    with comm_counter() as c:
        loss = model(x, y)[1]
        loss.backward()
        if hasattr(model, "finish_gradient_synchronization"):
            model.finish_gradient_synchronization()
        opt.step()  # 1-bit Adam communicates here
    opt.zero_grad(set_to_none=True)
    return loss.item(), c.bytes_sent, time.perf_counter() - t0


def _rank(rank: int, p: int, steps: int, reps: int) -> dict[str, Any]:
    from scaletrain.train import corpus

    tokens = corpus()
    out: dict[str, Any] = {"methods": {}}
    models = {}
    for method in METHODS:
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
                                      buckets=len(getattr(model, "buckets", ())))
    times = {m: [] for m in METHODS}
    for rep in range(reps):  # alternate: every method's step i beside the baseline's step i
        for method in METHODS:
            model, opt = models[method]
            t = torch.tensor([_step(model, opt, tokens, steps + rep, rank, p)[2]])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times[method].append(t.item())
    for method in METHODS:
        out["methods"][method]["times"] = times[method]
        if hasattr(models[method][0], "close"):
            models[method][0].close()
    out["n_params"] = sum(q.numel() for q in models[METHODS[0]][0].parameters())
    return out


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
    parser.add_argument("--steps", type=int, default=150, help="training steps per method")
    parser.add_argument("--reps", type=int, default=15, help="alternately timed steps per method")
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
    results = {p: spawn(_rank, p, args.steps, args.reps, timeout_s=120 + 6 * (args.steps + args.reps))[0]
               for p in world_sizes}
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
