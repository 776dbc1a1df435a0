"""`python -m scaletrain.bench infer [--quick] [--reps N] [--compile]`

Tables, each against a baseline measured in the same run (bench.compare_many: round-robin,
the median of per-rep ratios with p20-p80, the baseline's own row 1.00), and one of memory:

  1. decoding     greedy generation of n tokens by the tiny GPT (batch 4, an 8-token prompt), with
                  the KV cache (prefill, then one token a step) vs the full forward over the whole
                  prefix every step (the baseline); tokens/s, and the positions each runs through the
                  model: Σ_t t = O(n²) uncached vs n cached (the argument measured beside its count)
  2. beam top-k   one beam-search selection over (k beams, V) log-probabilities: LightSeq's retrieve
                  and re-rank (rerank.beam_topk) and torch.topk of the k·V scores, against sorting all
                  k·V (the baseline); the elements re-ranked vs k·V
  3. memory       the KV cache by 2·L·b·s·h·bytes (counted from a KVCache where the dtype exists) and
                  the block weights at 32/16/8/4 bits (codes packed, fp16 scales per group), for the
                  tiny GPT and GPT-2 small's shape
  4. accuracy     held-out loss of the tiny GPT trained on the course corpus (demo.train_tiny) with
                  its blocks' Linears quantized: bits × per-tensor / per-channel / group sizes
  5. distillation held-out loss of a 5x smaller student (demo.STUDENT_CFG) distilled from that model
                  (T = 2, α = 0.5) against the same student trained on the labels alone (the baseline),
                  same batches and steps, on transfer sets of 1 KiB, 4 KiB and fresh batches; the
                  median over seeds and of the per-seed perplexity ratios
  6. pruning      held-out loss of that model pruned (global, per-layer, per-row) at sparsities 0 to
                  0.9, against the dense model (sparsity 0, the baseline)
  7. compiled     time per token of the cached loop eager (the baseline), with its step compiled by
                  torch.compile, and of the uncached loop on the compiled model (on a GPU; `--compile`
                  runs it on a CPU too)

Plots: bench_out/infer.png (1-4), bench_out/infer_compression.png (5-6). On a CPU the figures are
ratios of two runs on the same cores; the retrieve-and-re-rank's win is a GPU kernel's (fewer elements
through shared memory); in torch on a CPU its gathers cost more than the sort they save, and the
table says so.
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

from scaletrain import bench
from scaletrain.bench_cli import positive_int
from scaletrain.infer import demo
from scaletrain.infer.beam import flat_topk
from scaletrain.infer.decode import forward_cached, generate, generate_uncached
from scaletrain.infer.kv_cache import KVCache, cache_bytes
from scaletrain.infer.quant import QuantSpec, group_size_for
from scaletrain.infer.quant_linear import LINEAR_NAMES, packed_bytes
from scaletrain.infer.rerank import beam_topk, candidates
from scaletrain.infer.sampling import greedy
from scaletrain.models import GPT, GPTConfig

DECODE_BASELINE, TOPK_BASELINE, DISTILL_BASELINE, COMPILE_BASELINE = "uncached", "sort k·V", "scratch", "cached, eager"
DECODE_CFG = GPTConfig(vocab_size=256, block_size=256, n_layer=2, n_head=4, n_embd=64)
GPT2_SMALL = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
PROMPT, BATCH = 8, 4


def measure_decoding(lengths: list[int], reps: int) -> list[dict]:
    model = GPT(DECODE_CFG, seed=0).eval()
    prompt = torch.randint(0, DECODE_CFG.vocab_size, (BATCH, PROMPT), generator=torch.Generator().manual_seed(0))
    rows = []
    for n in lengths:
        steps = n - PROMPT
        assert torch.equal(generate(model, prompt, steps, greedy), generate_uncached(model, prompt, steps, greedy))
        cmps = bench.compare_many({"cached": lambda: generate(model, prompt, steps, greedy),
                                   DECODE_BASELINE: lambda: generate_uncached(model, prompt, steps, greedy)},
                                  DECODE_BASELINE, warmup=1, reps=reps)
        positions = {"cached": n - 1, DECODE_BASELINE: sum(range(PROMPT, n))}  # the last token is never fed
        for name, c in cmps.items():
            rows.append({"n": n, "impl": name, "ms": c.candidate.median * 1e3, "p20": c.candidate.p20 * 1e3,
                         "p80": c.candidate.p80 * 1e3, "tokens/s": BATCH * steps / c.candidate.median,
                         "vs uncached": c.ratio, "p20-p80": f"{c.ratio_p20:.2f}-{c.ratio_p80:.2f}",
                         "positions run": positions[name]})
    return rows


def measure_compiled(n: int, reps: int, device: str) -> list[dict]:
    """Time per generated token, n tokens in all: the cached loop eager (the baseline), the same loop
    with `forward_cached` compiled by `torch.compile` (inductor; dynamic shapes, as the cache grows
    a position per step), and the uncached loop on the compiled model: what a compiler does with
    and without the cache. All three give the same tokens (checked first)."""
    model = GPT(DECODE_CFG, seed=0).to(device).eval()
    prompt = torch.randint(0, DECODE_CFG.vocab_size, (BATCH, PROMPT),
                           generator=torch.Generator().manual_seed(0)).to(device)
    steps = n - PROMPT
    step, whole = torch.compile(forward_cached, dynamic=True), torch.compile(model, dynamic=True)
    variants = {COMPILE_BASELINE: lambda: generate(model, prompt, steps, greedy),
                "cached, compiled": lambda: generate(model, prompt, steps, greedy, step=step),
                "uncached, compiled": lambda: generate_uncached(whole, prompt, steps, greedy)}
    tokens = {name: fn() for name, fn in variants.items()}  # the compilations happen here, untimed
    if not all(torch.equal(t, tokens[COMPILE_BASELINE]) for t in tokens.values()):
        raise AssertionError("compiled decoding gave other tokens than the eager cached loop")
    cmps = bench.compare_many(variants, COMPILE_BASELINE, warmup=1, reps=reps, device=device)
    return [{"n": n, "impl": name, "ms/token": c.candidate.median * 1e3 / steps, "vs eager cached": c.ratio,
             "p20-p80": f"{c.ratio_p20:.2f}-{c.ratio_p80:.2f}"} for name, c in cmps.items()]


def measure_topk(cases: list[tuple[int, int]], reps: int) -> list[dict]:
    rows = []
    for k, V in cases:
        scores = torch.randn(k, V, generator=torch.Generator().manual_seed(V)).log_softmax(-1)
        scores += torch.randn(k, 1, generator=torch.Generator().manual_seed(k))  # each beam's prefix score
        want = flat_topk(scores, k)
        assert torch.equal(beam_topk(scores, k)[0], want.values)
        cmps = bench.compare_many({"retrieve-rerank": lambda: beam_topk(scores, k),
                                   "torch.topk k·V": lambda: flat_topk(scores, k),
                                   TOPK_BASELINE: lambda: scores.flatten().sort(descending=True)},
                                  TOPK_BASELINE, warmup=2, reps=reps)
        ranked = {"retrieve-rerank": int(candidates(scores, k).sum()), "torch.topk k·V": k * V, TOPK_BASELINE: k * V}
        for name, c in cmps.items():
            rows.append({"k": k, "V": V, "impl": name, "µs": c.candidate.median * 1e6, "p20": c.candidate.p20 * 1e6,
                         "p80": c.candidate.p80 * 1e6, "vs sort": c.ratio,
                         "p20-p80": f"{c.ratio_p20:.2f}-{c.ratio_p80:.2f}",
                         "re-ranked": ranked[name], "of k·V": ranked[name] / (k * V)})
    return rows


def _block_weight_bytes(cfg: GPTConfig, bits: int, granularity: str, group_size: int = 128) -> int:
    """Bytes of every block Linear's weight at `bits` (32/16: plain floats; else codes + fp16 scales)."""
    h = cfg.n_embd
    shapes = [(3 * h, h), (h, h), (4 * h, h), (h, 4 * h)]  # LINEAR_NAMES' weights, in order
    assert len(shapes) == len(LINEAR_NAMES)
    total = 0
    for shape in shapes:
        numel = shape[0] * shape[1]
        if bits >= 16:
            total += numel * bits // 8
        else:
            g = group_size_for(shape, QuantSpec(bits=bits, granularity=granularity, group_size=group_size))
            total += packed_bytes(numel, numel // g, bits=bits, symmetric=True)
    return total * cfg.n_layer


def memory_rows() -> list[dict]:
    rows = []
    for name, cfg, b in (("tiny GPT", DECODE_CFG, BATCH), ("GPT-2 small", GPT2_SMALL, 8)):
        for bits in (32, 16, 8):
            formula = cache_bytes(n_layer=cfg.n_layer, batch=b, seq_len=cfg.block_size, n_embd=cfg.n_embd,
                                  bytes_per_element=bits // 8)
            dtype = {32: torch.float32, 16: torch.float16}.get(bits)
            counted = "" if dtype is None or name != "tiny GPT" else KVCache(
                n_layer=cfg.n_layer, batch=b, n_head=cfg.n_head, head_dim=cfg.n_embd // cfg.n_head,
                max_len=cfg.block_size, dtype=dtype).nbytes
            rows.append({"model": name, "what": f"KV cache b={b} s={cfg.block_size}", "bits": bits,
                         "MiB (formula)": formula / 2**20, "counted B": counted, "B formula": formula})
        for bits, gran in ((32, "tensor"), (16, "tensor"), (8, "channel"), (4, "channel"), (4, "group")):
            nbytes = _block_weight_bytes(cfg, bits, gran)
            rows.append({"model": name, "what": f"block weights, {gran if bits < 16 else 'float'}"
                         + (" g128" if gran == "group" else ""), "bits": bits, "MiB (formula)": nbytes / 2**20,
                         "counted B": "", "B formula": nbytes})
    return rows


def accuracy_rows(model: GPT, group_sizes: tuple[int, ...]) -> list[dict]:
    rows = []
    for bits in (8, 4, 3):
        for row in demo.quant_sweep(model, {"float": None, **demo.group_specs(bits, group_sizes)} if bits == 8
                                    else demo.group_specs(bits, group_sizes)):
            rows.append({"bits": 32 if row["weights"] == "float" else bits, **row})
    base = rows[0]["loss"]
    return [{**r, "Δ loss vs float": f"{r['loss'] - base:+.5f}"} for r in rows]  # the effect is in the 3rd decimal


def distill_rows(teacher: GPT, steps: int, seeds: int, transfers: tuple[int | None, ...]) -> list[dict]:
    rows = []
    for transfer in transfers:
        runs = [demo.distill_vs_scratch(teacher, transfer=transfer, steps=steps, seed=seed) for seed in range(seeds)]
        ratios = [math.exp(r["distilled"] - r["scratch"]) for r in runs]  # perplexity, distilled / scratch
        for student in ("teacher", DISTILL_BASELINE, "distilled"):
            losses = [r[student] for r in runs]
            rows.append({"transfer set": runs[0]["transfer set"], "model": student,
                         "params": runs[0]["teacher params" if student == "teacher" else "student params"],
                         "held-out loss": statistics.median(losses), "p20": bench.quantile(losses, 0.2),
                         "p80": bench.quantile(losses, 0.8),
                         "ppl vs scratch": "" if student == "teacher" else
                         1.0 if student == DISTILL_BASELINE else statistics.median(ratios)})
    return rows


def prune_rows(model: GPT, sparsities: tuple[float, ...]) -> list[dict]:
    rows = demo.prune_sweep(model, sparsities)
    dense = next(r["loss"] for r in rows if r["sparsity"] == 0)
    return [{**r, "Δ loss vs dense": r["loss"] - dense, "ppl vs dense": math.exp(r["loss"] - dense)} for r in rows]


def _decimals(rows: list[dict], digits: int = 4) -> list[dict]:
    """Floats as fixed decimals: these tables' differences sit in the 2nd-4th decimal of a loss near 3."""
    return [{k: f"{v:.{digits}f}" if isinstance(v, float) else v for k, v in r.items()} for r in rows]


def plot(decoding: list[dict], topk: list[dict], accuracy: list[dict]):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for impl in ("cached", DECODE_BASELINE):
        pts = [r for r in decoding if r["impl"] == impl]
        axes[0].plot([r["n"] for r in pts], [r["tokens/s"] for r in pts], marker="o", label=impl)
    axes[0].set(xlabel="sequence length n", ylabel="tokens/s", xscale="log", yscale="log",
                title="greedy decoding, batch 4")
    axes[0].legend()
    cases = list(dict.fromkeys((r["k"], r["V"]) for r in topk))
    impls = list(dict.fromkeys(r["impl"] for r in topk))
    for i, impl in enumerate(impls):
        axes[1].bar([j + 0.25 * i for j in range(len(cases))],
                    [next(r["vs sort"] for r in topk if (r["k"], r["V"]) == c and r["impl"] == impl) for c in cases],
                    0.25, label=impl)
    axes[1].set_xticks([j + 0.25 for j in range(len(cases))], [f"k={k} V={V}" for k, V in cases])
    axes[1].set(ylabel=f"time / {TOPK_BASELINE}", title="one beam-search selection")
    axes[1].legend(fontsize=8)
    for bits in (8, 4, 3):
        pts = [r for r in accuracy if r["bits"] == bits]
        axes[2].plot([r["weights"] for r in pts], [r["loss"] for r in pts], marker="o", label=f"int{bits}")
    base = next(r["loss"] for r in accuracy if r["bits"] == 32)
    axes[2].axhline(base, color="k", lw=0.8, label="float")
    axes[2].set(xlabel="granularity", ylabel="held-out loss (nats/byte)", title="weight quantization")
    axes[2].legend()
    fig.tight_layout()
    return bench.save_figure(fig, "infer.png", dpi=110)


def plot_compression(distill: list[dict], pruning: list[dict]):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    sets = list(dict.fromkeys(r["transfer set"] for r in distill))
    for i, student in enumerate((DISTILL_BASELINE, "distilled")):
        axes[0].bar([j + 0.4 * i for j in range(len(sets))],
                    [next(r["held-out loss"] for r in distill if r["transfer set"] == t and r["model"] == student)
                     for t in sets], 0.4, label=f"student, {student}")
    axes[0].axhline(distill[0]["held-out loss"], color="k", lw=0.8, label="teacher")
    axes[0].set_xticks([j + 0.2 for j in range(len(sets))], sets)
    axes[0].set(xlabel="transfer set", ylabel="held-out loss (nats/byte)", title="distillation, median over seeds")
    axes[0].set_ylim(bottom=min(r["held-out loss"] for r in distill) - 0.3)
    axes[0].legend(fontsize=8)
    for kind in dict.fromkeys(r["kind"] for r in pruning):
        pts = [r for r in pruning if r["kind"] == kind]
        axes[1].plot([r["zeros"] for r in pts], [r["loss"] for r in pts], marker="o", label=kind)
    axes[1].set(xlabel="share of block weights zeroed", ylabel="held-out loss (nats/byte)",
                title="magnitude pruning, no retraining")
    axes[1].legend()
    fig.tight_layout()
    return bench.save_figure(fig, "infer_compression.png", dpi=110)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.bench infer", description=__doc__.splitlines()[2])
    parser.add_argument("--quick", action="store_true",
                        help="n up to 64, V up to 8000, 60 training steps, 1 distillation seed, 3 reps")
    parser.add_argument("--reps", type=positive_int, default=None, help="timed reps per variant (default 10, quick 3)")
    parser.add_argument("--compile", action="store_true",
                        help="table 7 (torch.compile'd decoding) on a CPU too; on a GPU it always runs")
    args = parser.parse_args(argv)
    reps = args.reps or (3 if args.quick else 10)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a second thread on a shared 2-core box only adds noise to the ratios
    try:
        return _run(args.quick, reps, args.compile or torch.cuda.is_available())
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool, reps: int, compiled: bool) -> int:
    decoding = measure_decoding([16, 32, 64] if quick else [16, 32, 64, 128, 256], reps)
    print(f"1. greedy decoding, tiny GPT L={DECODE_CFG.n_layer} h={DECODE_CFG.n_embd}, batch {BATCH}, prompt "
          f"{PROMPT}, n tokens in all; {reps} reps; ratio = time / uncached (both give the same tokens)")
    print(bench.format_table(decoding))
    topk = measure_topk([(4, 8000)] if quick else [(4, 8000), (4, 50257), (8, 50257)], reps)
    print(f"\n2. one beam-search selection of k survivors from (k, V) log-probabilities, fp32; {reps} reps; "
          "ratio = time / sorting k·V")
    print(bench.format_table(topk))
    print("\n3. memory: KV cache 2·L·b·s·h·bytes (counted = KVCache.nbytes) and the blocks' weights "
          "(codes packed, fp16 scale per group)")
    print(bench.format_table(memory_rows()))
    steps = 60 if quick else 300
    model, _ = demo.train_tiny(steps=steps)
    accuracy = accuracy_rows(model, (16,) if quick else (64, 16))
    print(f"\n4. held-out loss of the tiny GPT ({steps} steps on the course corpus), blocks' Linears fake-quantized "
          "(symmetric, min-max)")
    print(bench.format_table(accuracy))
    seeds = 1 if quick else 3
    distill = distill_rows(model, steps, seeds, (1, None) if quick else (1, 4, None))
    print(f"\n5. distillation of that model into a student of {distill[1]['params']} parameters, {steps} steps, "
          f"T = 2, α = 0.5, against the same student on the labels alone; median of {seeds} seeds")
    print(bench.format_table(_decimals(distill)))
    pruning = prune_rows(model, (0.0, 0.25, 0.5, 0.75, 0.9))
    print("\n6. magnitude pruning of that model's blocks' Linears, one shot (no retraining); zeros = share reached")
    print(bench.format_table(_decimals(pruning)))
    if compiled:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        n = 64 if quick else 256
        print(f"\n7. time per token on {device}, {n} tokens, batch {BATCH}: the cached loop eager (1.00), with "
              "forward_cached compiled, and the uncached loop on the compiled model (torch.compile, inductor)")
        print(bench.format_table(measure_compiled(n, reps, device)))
    else:
        print("\n7. torch.compile'd decoding: GPU only (`--compile` runs it here; inductor compiles for tens of seconds on a CPU)")
    print(f"\nplots: {plot(decoding, topk, accuracy)}, {plot_compression(distill, pruning)}")
    return 0
