"""`python -m scaletrain.bench moe [--quick] [--world-sizes 2,4] [--reps N] [--steps N]`

Four tables, each against the real baseline measured in the same run (bench.compare_many: timed
round-robin, the median of per-rep ratios with p20-p80, the baseline's own row 1.00):

  1. all-to-all   ours (all_to_all.py, isend/irecv) vs gloo's `all_to_all_single`, equal and
                  variable split sizes (seeded, zeros included), p ranks, sizes per rank; beside
                  it the bytes comm_counter saw and the formula (p-1)/p·n (variable: Σ_{j≠r} + the
                  split exchange), and one expert-parallel step of the tiny MoE GPT: bytes counted
                  vs cost.ep_step_bytes. Slowest rank's time, a barrier before every call.
  2. grouped GEMM forward + backward of one expert matrix over E variable-size groups: grouped
                  (one mm per group into one buffer, and torch's grouped-GEMM kernel) vs the loop of
                  E matmuls (the baseline) and the padded bmm, for uniform and skewed (Zipf)
                  routing; useful GFLOP/s and the padded version's wasted FLOPs.
  3. dense vs MoE the tiny GPT with every MLP dense (the baseline) or an MoE layer of E = 8 experts
                  at equal active FLOPs per token (top-1 with f = 4h; top-2 with f = 2h): one
                  training step (forward, backward, AdamW), tokens/s, parameters, active
                  parameters per token, parameter+gradient+AdamW bytes, saved activations.
  4. load balance the demo's tiny MoE GPT trained on the course corpus with α = 0, 10⁻², 10⁻¹
                  (demo.train_load): max expert share × E and dropped fraction at cf 1.25, early
                  (first 10 steps) and late (last 25), and the final cross-entropy.

Plot: bench_out/moe.png. On a CPU the all-to-all ratio compares two implementations of the same
loopback transfers; the GEMM, dense-vs-MoE and load sections run on one thread (as each rank does).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from scaletrain import bench
from scaletrain.bench_cli import positive_int
from scaletrain.comm.counter import comm_counter
from scaletrain.launch import spawn
from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.moe import demo
from scaletrain.moe.all_to_all import all_to_all, all_to_all_bytes, all_to_all_v, all_to_all_v_bytes
from scaletrain.moe.cost import active_params, layer_params
from scaletrain.moe.gpt import MoEGPT, moe_block_indices
from scaletrain.moe.grouped_gemm import grouped_mm, grouped_mm_loop, grouped_mm_padded
from scaletrain.moe.layer import MoEConfig

DISTRIBUTED = True  # spawns ranks: `python -m scaletrain.bench all` runs it under torchrun
A2A_BASELINE, GEMM_BASELINE, MODEL_BASELINE = "gloo all_to_all_single", "loop", "dense"
HIDDEN = 256  # all-to-all rows of 256 fp32: 1 KiB, a token's hidden vector at h = 256
GEMM_CASES = [(8, 4096, 128, 512), (32, 4096, 128, 512)]  # E, N rows, K, F
QUICK_GEMM = [(8, 1024, 64, 256)]
CFG = GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=64)
QUICK_CFG = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=32)
BATCH = 8


# 1. all-to-all ----------------------------------------------------------------------------------

def _splits(rank: int, p: int, rows: int, rep: int) -> list[int]:
    """Variable sizes around rows/p per peer (0 to 2·rows/p), seeded by (rank, rep)."""
    g = torch.Generator().manual_seed(7919 * rep + rank)
    return torch.randint(0, 2 * rows // p + 1, (p,), generator=g).tolist()


def _a2a_rank(rank: int, p: int, sizes: tuple[int, ...], reps: int) -> list[dict[str, Any]]:
    group, out = dist.group.WORLD, []
    for nbytes in sizes:
        rows = nbytes // (HIDDEN * 4) // p * p
        x = torch.randn(rows, HIDDEN)
        ref = torch.empty_like(x)
        with comm_counter() as c:
            got = all_to_all(x)
        dist.all_to_all_single(ref, x)
        assert torch.equal(got, ref), "our all-to-all differs from gloo's"  # correct before timed
        cmps = bench.compare_many({"ours": lambda: all_to_all(x), A2A_BASELINE: lambda: dist.all_to_all_single(ref, x)},
                                  A2A_BASELINE, warmup=2, reps=reps, group=group)
        out.append({"p": p, "form": "equal", "KiB/rank": rows * HIDDEN * 4 / 1024, "cmp": cmps["ours"],
                    "base": cmps[A2A_BASELINE], "counted": c.bytes_sent,
                    "formula": all_to_all_bytes(rows=rows, row_bytes=HIDDEN * 4, world_size=p)})
        send = _splits(rank, p, rows, 0)
        y = torch.randn(sum(send), HIDDEN)
        with comm_counter() as c:
            got, recv = all_to_all_v(y, send)
        ref_v = y.new_empty(sum(recv), HIDDEN)
        dist.all_to_all_single(ref_v, y, output_split_sizes=recv, input_split_sizes=send)
        assert torch.equal(got, ref_v), "our variable all-to-all differs from gloo's"
        # timed with the receive sizes known on both sides, as expert parallelism does
        cmps = bench.compare_many({"ours": lambda: all_to_all_v(y, send, recv),
                                   A2A_BASELINE: lambda: dist.all_to_all_single(ref_v, y, recv, send)},
                                  A2A_BASELINE, warmup=2, reps=reps, group=group)
        out.append({"p": p, "form": "variable", "KiB/rank": y.numel() * 4 / 1024, "cmp": cmps["ours"],
                    "base": cmps[A2A_BASELINE], "counted": c.bytes_sent,
                    "formula": all_to_all_v_bytes(send, rank=rank, row_bytes=HIDDEN * 4)})
    step = demo.alltoall_rank(rank, p, (), 32, demo.DEMO_MOE)["step"]
    for row in out:
        row["step"] = step
    return out


def measure_alltoall(p: int, sizes: tuple[int, ...], reps: int) -> list[dict[str, Any]]:
    per_rank = spawn(_a2a_rank, p, sizes, reps, timeout_s=240 + 10 * reps * len(sizes))
    rows = per_rank[0]
    for i, row in enumerate(rows):  # bytes: the busiest rank's, and whether every rank met its formula
        row["counted_max"] = max(r[i]["counted"] for r in per_rank)
        row["exact"] = all(r[i]["counted"] == r[i]["formula"] for r in per_rank)
        row["step_exact"] = all(r[i]["step"]["counted"] == r[i]["step"]["formula"] for r in per_rank)
    return rows


def alltoall_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"p": r["p"], "form": r["form"], "KiB/rank": r["KiB/rank"], "ours ms": r["cmp"].candidate.median * 1e3,
             "p20": r["cmp"].candidate.p20 * 1e3, "p80": r["cmp"].candidate.p80 * 1e3,
             "gloo ms": r["base"].candidate.median * 1e3, "ratio": r["cmp"].ratio,
             "ratio p20-p80": f"{r['cmp'].ratio_p20:.2f}-{r['cmp'].ratio_p80:.2f}",
             "KB sent (rank 0)": r["counted"] / 1e3, "KB formula": r["formula"] / 1e3,
             "all ranks = formula": "yes" if r["exact"] else "NO"} for r in rows]


# 2. grouped GEMM --------------------------------------------------------------------------------

def _counts(e: int, n: int, skew: bool, seed: int = 0) -> list[int]:
    """n rows over e experts: uniform draws, or Zipf-like (weight 1/(i+1)) for a skewed router."""
    weights = 1.0 / torch.arange(1, e + 1, dtype=torch.float64) if skew else torch.ones(e, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    return torch.multinomial(weights, n, replacement=True, generator=g).bincount(minlength=e).tolist()


def measure_gemm(cases, reps: int) -> list[dict[str, Any]]:
    rows = []
    for e, n, k, f in cases:
        for skew in (False, True):
            counts = _counts(e, n, skew)
            x = torch.randn(n, k, requires_grad=True)
            w = torch.randn(e, k, f, requires_grad=True)
            dy = torch.randn(n, f)
            impls = {"grouped (mm per group)": lambda: grouped_mm(x, w, counts, kernel="mm").backward(dy),
                     "grouped (torch kernel)": lambda: grouped_mm(x, w, counts, kernel="torch").backward(dy),
                     GEMM_BASELINE: lambda: grouped_mm_loop(x, w, counts).backward(dy),
                     "padded bmm": lambda: grouped_mm_padded(x, w, counts).backward(dy)}
            cmps = bench.compare_many(impls, GEMM_BASELINE, warmup=2, reps=reps)
            useful = 3 * 2 * n * k * f  # forward, dX, dW
            for name, cmp in cmps.items():
                padded = name == "padded bmm"
                vs_padded = bench.Comparison(cmp.candidate, cmps["padded bmm"].candidate)
                rows.append({"E": e, "N": n, "K×F": f"{k}×{f}", "routing": "Zipf" if skew else "uniform",
                             "max/mean rows": max(counts) * e / n, "impl": name, "ms": cmp.candidate.median * 1e3,
                             "p20": cmp.candidate.p20 * 1e3, "p80": cmp.candidate.p80 * 1e3,
                             "vs loop": cmp.ratio, "vs loop p20-p80": f"{cmp.ratio_p20:.2f}-{cmp.ratio_p80:.2f}",
                             "vs padded": vs_padded.ratio, "useful GFLOP/s": useful / cmp.candidate.median / 1e9,
                             "FLOPs / useful": max(counts) * e / n if padded else 1.0})
    return rows


# 3. dense vs MoE at equal active FLOPs -----------------------------------------------------------

def measure_models(cfg: GPTConfig, reps: int) -> list[dict[str, Any]]:
    from scaletrain.memory_measure import measure_training_step

    h = cfg.n_embd
    variants = {MODEL_BASELINE: None,
                "MoE E=8 top-1 f=4h cf 1.25": MoEConfig(num_experts=8, top_k=1, every=1),
                "MoE E=8 top-1 f=4h dropless": MoEConfig(num_experts=8, top_k=1, every=1, routing="dropless"),
                "MoE E=8 top-2 f=2h dropless": MoEConfig(num_experts=8, top_k=2, ffn_hidden=2 * h, every=1,
                                                       routing="dropless")}
    idx, targets = make_batch(cfg, BATCH, seed=0)
    steps, facts = {}, {}
    for name, moe in variants.items():
        def build(moe=moe):
            return GPT(cfg, seed=0) if moe is None else MoEGPT(cfg, moe, seed=0)
        model = build()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(model=model, opt=opt):
            opt.zero_grad(set_to_none=True)
            model(idx, targets)[1].backward()
            opt.step()
        steps[name] = step
        mem = measure_training_step(build(), batch_size=BATCH, optimizer="adamw")
        total = active = sum(p.numel() for p in model.parameters())
        if moe is not None:  # each MoE layer: all its experts stored, k of them (and the router) used per token
            shape = dict(hidden=h, ffn_hidden=moe.ffn_hidden or 4 * h, num_experts=moe.num_experts)
            active -= len(moe_block_indices(cfg.n_layer, moe.every)) * (
                layer_params(**shape) - active_params(top_k=moe.top_k, **shape))
        facts[name] = {"params": total, "active": active, "states MB": (mem.params + mem.grads + mem.optimizer) / 1e6,
                       "act MB": mem.activations / 1e6}
    cmps = bench.compare_many(steps, MODEL_BASELINE, warmup=2, reps=reps)
    tokens = idx.numel()
    return [{"model": name, "params": facts[name]["params"], "active/token": facts[name]["active"],
             "ms": c.candidate.median * 1e3, "p20": c.candidate.p20 * 1e3, "p80": c.candidate.p80 * 1e3,
             "tokens/s": tokens / c.candidate.median, "ratio": c.ratio, "ratio p20-p80": f"{c.ratio_p20:.2f}-{c.ratio_p80:.2f}",
             "states MB": facts[name]["states MB"], "act MB": facts[name]["act MB"]} for name, c in cmps.items()]


# 4. load balance --------------------------------------------------------------------------------

def measure_load(steps: int, coefs=(0.0, 0.01, 0.1)) -> tuple[list[dict[str, Any]], dict]:
    histories = demo.train_load(coefs, steps=steps)
    late = max(1, min(25, steps // 4))
    rows = [{"α": c, "imbalance first 10": h.imbalance[:10].mean().item(), f"imbalance last {late}": h.imbalance[-late:].mean().item(),
             f"dropped last {late}": sum(h.dropped[-late:]) / late, "final CE": sum(h.ce[-late:]) / late}
            for c, h in histories.items()]
    return rows, histories


def plot(a2a: list[dict], gemm: list[dict], models: list[dict], histories: dict, name: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    ax = axes[0][0]
    for key in sorted({(r["p"], r["form"]) for r in a2a}):
        pts = [r for r in a2a if (r["p"], r["form"]) == key]
        ax.plot([r["KiB/rank"] for r in pts], [r["ratio"] for r in pts], marker="o", label=f"p={key[0]} {key[1]}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(xscale="log", xlabel="KiB per rank", ylabel=f"time / {A2A_BASELINE}", title="all-to-all: ours vs gloo")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    cases = list(dict.fromkeys((r["E"], r["routing"]) for r in gemm))
    impls = list(dict.fromkeys(r["impl"] for r in gemm))
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        vals = [next(r["ms"] for r in gemm if (r["E"], r["routing"]) == case and r["impl"] == impl) for case in cases]
        ax.bar([j + i * width for j in range(len(cases))], vals, width, label=impl)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], [f"E={e} {r}" for e, r in cases])
    ax.set(ylabel="ms, forward + backward", title="one expert matrix over E groups")
    ax.legend(fontsize=8)
    ax = axes[1][0]
    for coef, h in histories.items():
        ax.plot(range(1, len(h.ce) + 1), h.imbalance.tolist(), label=f"α = {coef:g}")
    ax.set(xlabel="step", ylabel="max expert share × E (1 = balanced)", title="load of the first MoE layer")
    ax.legend()
    ax = axes[1][1]
    names = [r["model"] for r in models]
    ax.bar(range(len(names)), [r["tokens/s"] for r in models], color=["k"] + ["C1"] * (len(names) - 1), alpha=0.7)
    for i, r in enumerate(models):
        ax.text(i, r["tokens/s"], f"{r['params'] / 1e6:.2f}M params\n{r['active/token'] / 1e6:.2f}M active",
                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), [n.replace(" f=", "\nf=") for n in names], fontsize=8)
    ax.set(ylabel="tokens/s (one training step)", title="dense vs MoE at equal active FLOPs")
    fig.tight_layout()
    return bench.save_figure(fig, name, dpi=110)


def main(argv: list[str]) -> int:
    def training_steps(parser):
        parser.add_argument("--steps", type=positive_int, default=None,
                            help="training steps per α (default 100, quick 30)")

    args, sizes, reps = bench.distributed_args(
        argv, "moe", __doc__, quick_help="p = 2, small sizes, 30 training steps, 3 reps",
        sizes_help="all-to-all ranks, comma-separated (default 2,4; quick 2)",
        sizes="2,4", quick_sizes="2", reps=10, quick_reps=3, more=training_steps)
    steps = args.steps or (30 if args.quick else 100)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like each rank: a second thread on a shared 2-core box only adds noise
    try:
        return _run(args, sizes, reps, steps)
    finally:
        torch.set_num_threads(threads)


def _run(args, sizes: tuple[int, ...], reps: int, steps: int) -> int:
    nbytes = (64 << 10, 1 << 20) if args.quick else (64 << 10, 1 << 20, 8 << 20)
    a2a = [row for p in sizes for row in measure_alltoall(p, nbytes, reps)]
    print(f"1. all-to-all: rows of {HIDDEN} fp32, slowest rank, {reps} reps; ratio = ours / gloo's all_to_all_single")
    print(bench.format_table(alltoall_table(a2a)))
    print("   (small sizes: each of our isend/irecv waits can stall ~3.3 ms on this 2-vCPU VM, docs/measured.md's "
          "allreduce --latency row; gloo's all_to_all_single waits once, in C++)")
    for p in sizes:
        step = next(r["step"] for r in a2a if r["p"] == p)
        exact = all(r["step_exact"] for r in a2a if r["p"] == p)
        print(f"   expert-parallel step, ep = {p} (demo GPT, {step['tokens']} tokens/rank, {step['dropped']} pairs "
              f"dropped): {step['counted']:,} B sent by rank 0, formula {step['formula']:,} B; every rank exact: "
              f"{'yes' if exact else 'NO'}")
    gemm = measure_gemm(QUICK_GEMM if args.quick else GEMM_CASES, reps)
    print(f"\n2. grouped GEMM, forward + backward of one (E, K, F) expert weight, fp32, {reps} reps; "
          "ratios: median of per-rep time ratios")
    print(bench.format_table(gemm, ["E", "N", "K×F", "routing", "max/mean rows", "impl", "ms", "p20", "p80", "vs loop",
                                    "vs loop p20-p80", "vs padded", "useful GFLOP/s", "FLOPs / useful"]))
    cfg = QUICK_CFG if args.quick else CFG
    models = measure_models(cfg, reps)
    print(f"\n3. dense vs MoE, tiny GPT L={cfg.n_layer} h={cfg.n_embd} s={cfg.block_size} b={BATCH}, every MLP replaced; "
          "one AdamW step; ratio = step time / dense")
    print(bench.format_table(models))
    load, histories = measure_load(steps)
    print(f"\n4. load balance: demo GPT (h={demo.DEMO_CFG.n_embd}, E={demo.DEMO_MOE.num_experts}, top-1, cf "
          f"{demo.DEMO_MOE.capacity_factor}) on the course corpus, {steps} steps, lr {demo.LR}; "
          "imbalance = max expert share × E (1 balanced, E collapsed)")
    print(bench.format_table(load))
    path = plot(alltoall_table(a2a), gemm, models, histories, "moe.png")
    print(f"\nplot: {path}")
    return 0

