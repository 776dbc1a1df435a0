"""`python -m scaletrain.bench memory [--quick] [--reps N] [--steps N]`

Module 7's techniques beside torch's own, measured in the same run (DESIGN.md, "Performance
evidence"):

1. Activation checkpointing, for a tiny GPT and a deeper one (dropout on; attention as the
   unfused core of `selective.explicit_attention`, so the a·s² matrices exist as in Megatron):
   none / full (every block) / selective (the attention core) / √n segments / Rotor's plan at
   three budgets. Every variant runs twice, with our `checkpoint` Function and with
   `torch.utils.checkpoint` (reentrant mode, which saves its inputs where the tracker sees
   them), on the same plan: peak saved bytes of both (`track_saved_tensors`) beside the plan's
   prediction, and the step time (forward + backward) as the median of per-rep ratios, ours /
   torch's (`bench.compare`, alternating). Target: the same bytes, time within 1.05×.
2. Mixed precision: `steps` training steps of the tiny GPT on the same batches, torch.amp
   autocast + GradScaler against (a) autocast with our DynamicLossScaler (the scaler alone:
   identical losses and skipped steps expected), (b) our 16-bit model + fp32 master copy, fp16
   and bf16, (c) the fp16 one with ZeRO-Offload's split (a simulated device tier on CPU) against
   (b): the largest relative loss difference, the skipped steps, and the step-time ratio;
   offload's bytes per step beside 4Ψ.

Plot: bench_out/memory.png.
"""

from __future__ import annotations

import argparse
import copy
import functools
from typing import Any, Callable

import torch
import torch.utils.checkpoint as torch_ckpt

from scaletrain import bench
from scaletrain.bench_cli import positive_int
from scaletrain.checkpointing.chain import gpt_stages, profile_chain
from scaletrain.checkpointing.executor import run_plan
from scaletrain.checkpointing.function import checkpoint
from scaletrain.checkpointing.planner import min_peak, plan_rotor, plan_sqrt, store_all_peak
from scaletrain.checkpointing.schedule import Split, Store, simulate, store_all
from scaletrain.checkpointing.selective import explicit_attention
from scaletrain.memory_measure import track_saved_tensors
from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.offload import OffloadOptimizer
from scaletrain.precision import DynamicLossScaler, MixedPrecision

MODELS = {"tiny GPT (L=4)": (GPTConfig(n_layer=4, block_size=64, n_embd=64, n_head=4, dropout=0.1), 8),
          "deep GPT (L=16)": (GPTConfig(n_layer=16, block_size=64, n_embd=32, n_head=2, dropout=0.1), 8)}
QUICK = {"tiny GPT (L=2)": (GPTConfig(n_layer=2, block_size=16, n_embd=16, n_head=2, dropout=0.1), 2),
         "deep GPT (L=6)": (GPTConfig(n_layer=6, block_size=16, n_embd=16, n_head=2, dropout=0.1), 2)}
CKPT_COLUMNS = ["model", "variant", "budget MB", "peak MB ours", "peak MB torch", "peak MB plan", "recompute %",
                "ms ours", "p20", "p80", "ratio", "ratio p20-p80"]
AMP_COLUMNS = ["variant", "baseline", "max rel dloss", "skipped", "skipped baseline", "ms", "ratio",
               "ratio p20-p80", "bytes/step", "4Ψ"]


def torch_checkpoint(fn: Callable, *args):
    """torch.utils.checkpoint, reentrant, given the same empty anchor as ours when no input needs
    grad (token ids), so both build a backward for the parameters inside."""
    if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        return torch_ckpt.checkpoint(fn, *args, use_reentrant=True)
    anchor = torch.empty(0, requires_grad=True)
    return torch_ckpt.checkpoint(lambda *a: fn(*a[:-1]), *args, anchor, use_reentrant=True)


def every_block(n: int) -> Store:
    """Full checkpointing, one block at a time: the embedding stored, each block a Split recomputed
    alone, head and loss stored (what memory_measure.CheckpointedBlock does)."""
    node = store_all(n, n - 2)
    for i in range(n - 3, 0, -1):
        node = Split(i, i + 1, Store(i), node)
    return Store(0, node)


def _checkpoint_rows(name: str, cfg: GPTConfig, batch: int, reps: int) -> list[dict[str, Any]]:
    model = GPT(cfg, seed=0).train()
    idx, tgt = make_batch(cfg, batch)
    stages, names = gpt_stages(model, tgt)
    params = list(model.parameters())
    with explicit_attention(model):
        chain = profile_chain(stages, idx, names=names)
    with explicit_attention(model, recompute=True):
        selective_peak = store_all_peak(profile_chain(stages, idx, names=names))
    lo, hi = min_peak(chain), store_all_peak(chain)
    sqrt_plan = plan_sqrt(chain.n)
    plans = [("none", store_all(chain.n), None), ("full (every block)", every_block(chain.n), None),
             ("√n segments", sqrt_plan, None)]
    for label, budget in (("at √n's peak", simulate(sqrt_plan, chain).peak_bytes), ("at ½ store-all", hi // 2),
                          ("at min peak", lo)):
        plans.append((f"planned {label}", plan_rotor(chain, max(budget, lo)), max(budget, lo)))

    def step(fn):
        model.zero_grad(set_to_none=True)
        fn().backward()

    def variants():
        for label, plan, budget in plans:
            sim = simulate(plan, chain)
            yield label, budget, sim.peak_bytes, sim.recompute_s, *(
                functools.partial(_with_core, model, False, functools.partial(run_plan, plan, stages, idx, checkpoint_fn=c))
                for c in (checkpoint, torch_checkpoint))
        yield "selective (attention core)", None, selective_peak, None, *(
            functools.partial(_with_core, model, True, lambda: model(idx, tgt)[1], checkpoint_fn=c)
            for c in (checkpoint, torch_checkpoint))

    rows = []
    total = sum(chain.forward_s) + sum(chain.backward_s)
    for label, budget, predicted, recompute, ours, theirs in variants():
        peaks = []
        for fn in (ours, theirs):
            with track_saved_tensors(params) as tracker:
                step(fn)
            peaks.append(tracker.peak)
        cmp = bench.compare(lambda: step(ours), lambda: step(theirs), warmup=2, reps=reps)
        rows.append({"model": name, "variant": label, "budget MB": budget / 1e6 if budget else "-",
                     "peak MB ours": peaks[0] / 1e6, "peak MB torch": peaks[1] / 1e6, "peak MB plan": predicted / 1e6,
                     "recompute %": 100 * recompute / total if recompute is not None else "-",
                     "ms ours": cmp.candidate.median * 1e3, "p20": cmp.candidate.p20 * 1e3,
                     "p80": cmp.candidate.p80 * 1e3, "ratio": cmp.ratio,
                     "ratio p20-p80": f"{cmp.ratio_p20:.2f}-{cmp.ratio_p80:.2f}",
                     "_exact": peaks[0] == peaks[1] == predicted})
    return rows


def _with_core(model, recompute: bool, fn: Callable, checkpoint_fn: Callable = checkpoint):
    with explicit_attention(model, recompute=recompute, checkpoint_fn=checkpoint_fn):
        return fn()


# ---------------------------------------------------------------- mixed precision

SCALER = dict(init_scale=2.0**16, growth_interval=10)


class _Amp:
    """torch.amp autocast with a scaler: torch's GradScaler, or our DynamicLossScaler driven the same way."""

    def __init__(self, model, dtype, ours: bool):
        self.model, self.dtype = model, dtype
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        enabled = dtype == torch.float16
        self.scaler = (DynamicLossScaler(**SCALER, enabled=enabled) if ours
                       else torch.amp.GradScaler("cpu", **SCALER, enabled=enabled))
        self.skipped: list[int] = []
        self.steps = 0

    def __call__(self, idx, tgt) -> float:
        with torch.autocast("cpu", dtype=self.dtype):
            loss = self.model(idx, tgt)[1]
        if isinstance(self.scaler, DynamicLossScaler):
            self.scaler.scale_loss(loss).backward()
            found = self.scaler.unscale_(p.grad for p in self.model.parameters())
            if not found:
                self.opt.step()
            self.scaler.update(found)
        else:
            before = self.scaler.get_scale()
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
            found = self.scaler.is_enabled() and self.scaler.get_scale() < before
        if found:
            self.skipped.append(self.steps)
        self.steps += 1
        self.opt.zero_grad(set_to_none=True)
        return loss.item()


class _Master:
    """Our MixedPrecision (or OffloadOptimizer) as a step function."""

    def __init__(self, model, dtype, cls=MixedPrecision):
        self.engine = cls(model, torch.optim.AdamW, dtype=dtype, scaler=SCALER, lr=1e-3)

    @property
    def skipped(self):
        return self.engine.skipped_steps

    def __call__(self, idx, tgt) -> float:
        loss = self.engine.model(idx, tgt)[1]
        self.engine.backward(loss)
        self.engine.step()
        return loss.item()


def _precision_rows(cfg: GPTConfig, batch: int, steps: int, reps: int) -> list[dict[str, Any]]:
    base = GPT(cfg, seed=0)
    batches = [make_batch(cfg, batch, seed=i) for i in range(steps)]
    psi = sum(p.numel() for p in base.parameters())
    one_tier = "ours: fp16 model + fp32 master"
    cases = [("autocast fp16 + our DynamicLossScaler", torch.float16, lambda m: _Amp(m, torch.float16, True), None),
             (one_tier, torch.float16, lambda m: _Master(m, torch.float16), None),
             ("ours: bf16 model + fp32 master", torch.bfloat16, lambda m: _Master(m, torch.bfloat16), None),
             ("ours: fp16 + offload (simulated tier)", torch.float16,
              lambda m: _Master(m, torch.float16, OffloadOptimizer), one_tier)]
    makers = {label: make for label, _, make, _ in cases}
    for dt in (torch.float16, torch.bfloat16):
        makers[f"torch autocast {'fp16 + GradScaler' if dt == torch.float16 else 'bf16'}"] = \
            functools.partial(lambda m, dt: _Amp(m, dt, ours=False), dt=dt)
    trajectory = {}

    def run(label):
        if label not in trajectory:
            torch.manual_seed(0)                  # the same dropout masks in every run
            engine = makers[label](copy.deepcopy(base))
            trajectory[label] = ([engine(*b) for b in batches], engine)
        return trajectory[label]

    rows = []
    for label, dt, make, baseline in cases:
        baseline = baseline or f"torch autocast {'fp16 + GradScaler' if dt == torch.float16 else 'bf16'}"
        (losses, engine), (ref_losses, ref_engine) = run(label), run(baseline)
        cmp = bench.compare(make(copy.deepcopy(base)), makers[baseline](copy.deepcopy(base)),
                            setup=lambda: batches[0], warmup=2, reps=reps)
        sent = "-"
        if isinstance(getattr(engine, "engine", None), OffloadOptimizer):
            off = engine.engine   # gradients go down every step, parameters come back after applied steps
            sent = off.transfers.d2h / off.steps + off.transfers.h2d / (off.steps - len(off.skipped_steps))
        rows.append({"variant": label, "baseline": baseline,
                     "max rel dloss": max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
                     "skipped": str(engine.skipped), "skipped baseline": str(ref_engine.skipped),
                     "ms": cmp.candidate.median * 1e3, "ratio": cmp.ratio,
                     "ratio p20-p80": f"{cmp.ratio_p20:.2f}-{cmp.ratio_p80:.2f}",
                     "bytes/step": sent, "4Ψ": 4 * psi if sent != "-" else "-"})
    return rows


def plot(rows: list[dict[str, Any]], name: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):  # not `name`: that is the file to write
        mine = [r for r in rows if r["model"] == model]
        xs = range(len(mine))
        ax.bar([x - 0.2 for x in xs], [r["peak MB ours"] for r in mine], 0.4, label="measured (ours)")
        ax.bar([x + 0.2 for x in xs], [r["peak MB plan"] for r in mine], 0.4, label="plan's prediction")
        ax2 = ax.twinx()
        ax2.plot(list(xs), [r["ms ours"] for r in mine], "ko-", label="step ms")
        ax.set_xticks(list(xs), [r["variant"] for r in mine], rotation=35, ha="right")
        ax.set_ylabel("peak saved MB")
        ax2.set_ylabel("ms per step (forward + backward)")
        ax.set_title(model)
        ax.legend(loc="upper right")
    fig.tight_layout()
    return bench.save_figure(fig, name, dpi=110)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.bench memory", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller models, fewer reps and steps")
    parser.add_argument("--reps", type=positive_int, default=None, help="timed reps per variant (default 10, quick 2)")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="training steps compared (default 50, quick 6)")
    args = parser.parse_args(argv)
    reps = args.reps or (2 if args.quick else 10)
    steps = args.steps or (6 if args.quick else 50)
    torch.manual_seed(0)
    torch.set_num_threads(1)   # a shared 2-core machine: one thread each keeps ours and torch's comparable
    models = QUICK if args.quick else MODELS
    rows = [r for name, (cfg, batch) in models.items() for r in _checkpoint_rows(name, cfg, batch, reps)]
    print(bench.format_table(rows, CKPT_COLUMNS))
    exact = all(r["_exact"] for r in rows)
    print(f"\npeak MB: saved-for-backward bytes measured by track_saved_tensors (ours, torch's reentrant "
          f"checkpoint) and predicted by the plan; all three equal: {exact}. ratio: ours / torch's step time "
          f"(median of per-rep ratios, same run, same plan; each row is its own pair, timed alternately, so rows "
          f"do not share a baseline measurement); recompute %: the plan's extra forward time / "
          f"(forward + backward) from the profiled chain.\n")
    cfg, batch = next(iter(models.values()))
    amp = _precision_rows(cfg, batch, steps, reps)
    print(bench.format_table(amp, AMP_COLUMNS))
    print(f"\n{steps} steps of AdamW on the same batches; ratio: step time / the baseline's (same run; each row "
          "is timed alternately with the baseline its 'baseline' column names, its own measurement). "
          "bytes/step: offload's device→host gradients + host→device parameters, beside 4Ψ.")
    path = plot(rows, "memory.png")
    print(f"plot: {path}")
    return 0 if exact else 1
