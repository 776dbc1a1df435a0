"""`python -m scaletrain.bench zero [--quick] [--world-sizes 2,4] [--reps N]`

One training step (zero_grad, forward, backward, step) of a small GPT with AdamW on p ranks, for
our stages 0-3 and torch's own: DDP, DDP + `ZeroRedundancyOptimizer` (ZeRO-1, which broadcasts
each rank's updated partition after DDP's allreduce) and FSDP2 `fully_shard` (ZeRO-3, one unit
per block), and our ZeRO-3 with `prefetch=1` (the next unit gathered on a communication thread
while the current one computes), and our ZeRO-3 with the whole model as one unit: the same bytes in
3 collectives a step instead of 3 per block, so the difference between the two ZeRO-3 rows is what
the extra collectives' latency (α) costs. All variants are timed round-robin on the same ranks, one step of each per rep
(bench.compare_many: barrier before every step, slowest rank's time); "ratio" is the median of
per-rep ratios to DDP + ZeroRedundancyOptimizer's step of the same rep (< 1: faster), so every row
of a p uses one baseline measurement and the baseline's own row reads 1.00.

Bytes per rank per step are *measured* for every variant from the kernel's count of bytes this
process wrote (`wchar` in /proc/self/io: gloo's TCP sends; it sees torch's collectives, which
`comm_counter` cannot), and for ours also counted by `comm_counter`. Beside them, the ZeRO
paper's volume: 2Ψ'(p-1)/p elements for DP and stages 1-2, 3Ψ'(p-1)/p for stage 3, FSDP and
ZeroRedundancyOptimizer + DDP (allreduce 2Ψ + broadcast Ψ). Model-state bytes per rank (params,
grads, optimizer state, from storages) sit beside the formula 16Ψ, 8Ψ+8Ψ/p, 4Ψ+12Ψ/p, 16Ψ/p.
Plot: bench_out/zero.png.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from scaletrain import bench
from scaletrain.launch import spawn
from scaletrain.memory import zero_memory_per_rank
from scaletrain.memory_measure import storage_bytes
from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.zero.engine import ZeRO
from scaletrain.zero.stages import stage_facts

DISTRIBUTED = True  # spawns ranks: `python -m scaletrain.bench all` runs it under torchrun
CFG = GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128)
QUICK_CFG = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=64)
BASELINE = "torch ZeRO-1+DDP"
PREFETCH = "ours ZeRO-3 + prefetch"  # the target we hold it to: within 1.3x of "ours ZeRO-1"
PREFETCH_TARGET = 1.3
ONE_UNIT = "ours ZeRO-3, one unit"  # the same bytes in 3 collectives a step, not 3 per block: what α costs
LR = 1e-3
COLUMNS = ["p", "variant", "ms", "p20", "p80", "ratio", "ratio p20-p80", "MB sent/rank", "MB counted",
           "MB formula", "state MB/rank", "state MB formula"]


def _wchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar"))


@dataclass(kw_only=True)
class _Variant:
    """One contender: `step(idx, targets)` runs a training step; `states()` counts model-state bytes;
    `counted()` is our comm_counter total (None for torch's); `sent` = (wchar, counted) per step."""
    name: str
    step: Callable
    states: Callable[[], int]
    counted: Callable[[], int] | None = None
    sent: tuple[float, float] = (0.0, 0.0)


def _ours(stage: int, cfg: GPTConfig, prefetch: int = 0, one_unit: bool = False) -> _Variant:
    model = GPT(cfg, seed=0)
    # stage 3 gathers one block at a time and the rest with the root: FSDP2's units below;
    # `one_unit`: the whole model is the root's unit (same bytes in 3 collectives instead of 3 per unit)
    units = ([] if one_unit else list(model.blocks)) if stage == 3 else None
    zero = ZeRO(model, optimizer_class=torch.optim.AdamW, stage=stage, lr=LR, prefetch=prefetch, unit_modules=units)

    def step(idx, targets):
        zero.zero_grad()
        model(idx, targets)[1].backward()
        zero.step()

    name = ("ours DP (stage 0)" if stage == 0 else ONE_UNIT if one_unit
            else f"ours ZeRO-{stage}" + (" + prefetch" if prefetch else ""))
    return _Variant(name=name, step=step,
                    states=lambda: zero.memory_report().total, counted=lambda: zero.sent.bytes_sent)


def _torch_ddp(zero1: bool, cfg: GPTConfig) -> _Variant:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = GPT(cfg, seed=0)
    ddp = DDP(model)
    opt = (ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=LR) if zero1
           else torch.optim.AdamW(ddp.parameters(), lr=LR))
    inner = opt.optim if zero1 else opt  # ZeroRedundancyOptimizer keeps this rank's partition here

    def step(idx, targets):
        opt.zero_grad()
        ddp(idx, targets)[1].backward()
        opt.step()

    def states():
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        state = [v for s in inner.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim()]
        return storage_bytes(list(model.parameters()) + grads + state)

    return _Variant(name=BASELINE if zero1 else "torch DDP", step=step, states=states)


def _torch_fsdp2(cfg: GPTConfig) -> _Variant:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = GPT(cfg, seed=0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)

    def step(idx, targets):
        opt.zero_grad()
        model(idx, targets)[1].backward()
        opt.step()

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    def states():
        params = list(model.parameters())
        tensors = [local(p) for p in params] + [local(p.grad) for p in params if p.grad is not None]
        tensors += [local(v) for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim()]
        return storage_bytes(tensors)

    return _Variant(name="torch FSDP2", step=step, states=states)


def _measure_rank(rank: int, world_size: int, reps: int, quick: bool) -> list[dict[str, Any]]:
    cfg = QUICK_CFG if quick else CFG
    psi = sum(p.numel() for p in GPT(cfg).parameters())
    idx, targets = make_batch(cfg, 4, seed=rank)
    variants = ([_ours(s, cfg) for s in range(4)] + [_ours(3, cfg, prefetch=1), _ours(3, cfg, one_unit=True)]
                + [_torch_ddp(False, cfg), _torch_fsdp2(cfg)])
    baseline = _torch_ddp(True, cfg)
    group, rows = dist.group.WORLD, []
    for v in variants + [baseline]:
        v.step(idx, targets)  # warm-up: DDP rebuilds its buckets, optimizers allocate state
        dist.barrier()
        w0, c0 = _wchar(), v.counted() if v.counted else 0
        v.step(idx, targets)
        sent = torch.tensor([_wchar() - w0, (v.counted() - c0) if v.counted else -1], dtype=torch.float64)
        dist.all_reduce(sent)  # mean over ranks below
        v.sent = (sent / world_size).tolist()
    # one round-robin over all variants: every row's ratio uses the same baseline samples (its own row: 1.00)
    cmps = bench.compare_many({v.name: v.step for v in variants + [baseline]}, BASELINE,
                              setup=lambda: (idx, targets), warmup=2, reps=reps, group=group)
    for v in variants + [baseline]:
        rows.append(dict(p=world_size, variant=v.name, cmp=cmps[v.name], sent=v.sent, states=v.states(),
                         formula=_formula(v.name, psi, world_size)))
    return rows


def _formula(name: str, psi: int, p: int) -> tuple[float, int]:
    """(bytes sent per rank per step, model-state bytes per rank) from the ZeRO paper (fp32 AdamW)."""
    stage = {"ours DP (stage 0)": 0, "torch DDP": 0, "ours ZeRO-1": 1, BASELINE: 1, "ours ZeRO-2": 2,
             "ours ZeRO-3": 3, PREFETCH: 3, ONE_UNIT: 3, "torch FSDP2": 3}[name]
    volume = 3 if name == BASELINE else stage_facts(stage).comm_factor  # ZeroRedundancyOptimizer: + broadcast Ψ
    return volume * psi * (p - 1) / p * 4, zero_memory_per_rank(psi, p, stage).total


def measure(world_sizes: tuple[int, ...], reps: int, quick: bool) -> list[dict[str, Any]]:
    rows = []
    for p in world_sizes:
        rows += spawn(_measure_rank, p, reps, quick, timeout_s=180 + 30 * reps * p)[0]
    return rows


def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        cmp, (wchar, counted), (formula_bytes, formula_states) = r["cmp"], r["sent"], r["formula"]
        out.append({"p": r["p"], "variant": r["variant"], "ms": cmp.candidate.median * 1e3,
                    "p20": cmp.candidate.p20 * 1e3, "p80": cmp.candidate.p80 * 1e3, "ratio": cmp.ratio,
                    "ratio p20-p80": f"{cmp.ratio_p20:.2f}-{cmp.ratio_p80:.2f}",
                    "MB sent/rank": wchar / 1e6, "MB counted": counted / 1e6 if counted >= 0 else "-",
                    "MB formula": formula_bytes / 1e6, "state MB/rank": r["states"] / 1e6,
                    "state MB formula": formula_states / 1e6})
    return out


def plot(rows: list[dict[str, Any]], name: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["p"] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, key, label in zip(axes, ("MB sent/rank", "state MB/rank", "ratio"),
                              ("MB sent per rank per step (measured)", "model-state MB per rank",
                               f"step time / {BASELINE}")):
        names = [r["variant"] for r in rows if r["p"] == sizes[0]]
        width = 0.8 / len(sizes)
        for i, p in enumerate(sizes):
            vals = [next(r[key] for r in rows if r["p"] == p and r["variant"] == n) for n in names]
            ax.bar([j + i * width for j in range(len(names))], vals, width, label=f"p = {p}")
        ax.set_xticks([j + width * (len(sizes) - 1) / 2 for j in range(len(names))], names, rotation=35, ha="right")
        ax.set_title(label)
        ax.legend()
    fig.tight_layout()
    return bench.save_figure(fig, name, dpi=110)


def main(argv: list[str]) -> int:
    args, world_sizes, reps = bench.distributed_args(
        argv, "zero", __doc__, quick_help="a smaller GPT and fewer reps",
        sizes_help="comma-separated p values (default 2,4)", sizes="2,4", quick_sizes="2,4", reps=10, quick_reps=4)
    rows = table(measure(world_sizes, reps, args.quick))
    print(bench.format_table(rows, COLUMNS))
    path = plot(rows, "zero.png")
    for p in world_sizes:
        ms = {r["variant"]: r["ms"] for r in rows if r["p"] == p}
        print(f"p = {p}: ours ZeRO-3 / ours ZeRO-1 = {ms['ours ZeRO-3'] / ms['ours ZeRO-1']:.2f}, with prefetch "
              f"{ms[PREFETCH] / ms['ours ZeRO-1']:.2f} (target <= {PREFETCH_TARGET}); one unit "
              f"{ms[ONE_UNIT] / ms['ours ZeRO-1']:.2f}; FSDP2 / ours ZeRO-1 = "
              f"{ms['torch FSDP2'] / ms['ours ZeRO-1']:.2f}")
        extra = 3 * (QUICK_CFG if args.quick else CFG).n_layer  # 3 collectives per block unit
        print(f"        per extra collective: {(ms['ours ZeRO-3'] - ms[ONE_UNIT]) / extra:.2f} ms "
              f"(ZeRO-3 per block minus one unit, over its {extra} more collectives of the same total bytes)")
    print(f"\nratio: step time / {BASELINE} (median of per-rep ratios; one round-robin per p, so every row "
          f"of a p divides by the same {BASELINE} samples and its own row is 1.00); MB sent: mean over ranks "
          f"of bytes written to gloo's sockets (/proc/self/io wchar); plot: {path}")
    return 0
