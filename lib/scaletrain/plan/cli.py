"""`python -m scaletrain.plan --model 175B --gpus 1024 --cluster a100-80gb`: the best layouts, and a plot.
`python -m scaletrain.plan validate`: every published run of 2021-2024 beside its prediction.

Prints the top layouts that fit (memory per GPU, TFLOP/s per GPU, MFU, where the time goes) and
writes bench_out/plan_<model>_<gpus>.png: the memory wall of every (t, p) and the time
breakdown of the best layouts. `--model` takes a Table 1 size (1.7B ... 1008B) or 175B (GPT-3),
or a shape: --model l=96,h=12288,a=96 (s = 2048, V = 51200 unless given as s=, V=).
"""

from __future__ import annotations

import argparse
import sys

from scaletrain.bench_cli import positive_int
from scaletrain.plan.clusters import CLUSTERS
from scaletrain.plan.demo import memory_wall, plan_figure, time_rows
from scaletrain.plan.published import BATCHES, MODELS, SEQ, VOCAB
from scaletrain.plan.published_runs import GPT3_FAMILY, LLAMA_FAMILY

PRESETS = GPT3_FAMILY | LLAMA_FAMILY
from scaletrain.plan.layouts import MICROBATCHES, candidate_layouts, search
from scaletrain.plan.software import SOFTWARE
from scaletrain.plan.specs import RECOMPUTE, ModelSpec

__all__ = ["main", "parse_model"]


def parse_model(text: str) -> ModelSpec:
    """A preset name, or 'l=..,h=..,a=..[,s=..][,V=..]'."""
    if text in MODELS:
        return MODELS[text]
    if text in PRESETS:
        return PRESETS[text]
    try:
        fields = dict(part.split("=") for part in text.split(","))
        shape = {"l": "layers", "h": "hidden", "a": "heads", "s": "seq", "V": "vocab"}
        kw = {"seq": SEQ, "vocab": VOCAB} | {shape[k.strip()]: int(v) for k, v in fields.items()}
        return ModelSpec(**kw, name=text)
    except (ValueError, KeyError, TypeError) as exc:
        raise argparse.ArgumentTypeError(f"--model {text!r}: not a preset ({', '.join([*MODELS, *PRESETS])}) nor "
                                         f"'l=..,h=..,a=..[,s=..][,V=..]' ({exc})") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["validate"]:  # python -m scaletrain.plan validate: the published runs, predicted
        from scaletrain.plan.validate import main as validate_main
        return validate_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m scaletrain.plan", description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=parse_model, default=MODELS["175B"], help="preset or l=..,h=..,a=..")
    ap.add_argument("--gpus", type=positive_int, required=True)
    ap.add_argument("--cluster", choices=sorted(CLUSTERS), default="a100-80gb")
    ap.add_argument("--batch", type=positive_int, help="global batch in sequences (default: the published one)")
    ap.add_argument("--top", type=positive_int, default=10)
    ap.add_argument("--zero", type=int, nargs="+", default=[0], choices=[0, 1, 2, 3])
    ap.add_argument("--recompute", nargs="+", default=["full"], choices=RECOMPUTE)
    ap.add_argument("--sp", action="store_true", help="also try sequence parallelism")
    ap.add_argument("--no-overlap", action="store_true", help="DP reduction after the backward (Megatron 2021)")
    ap.add_argument("--software", choices=sorted(SOFTWARE), help="search what this generation could run "
                    "(overrides --zero, --recompute, --sp, --no-overlap)")
    ap.add_argument("--cp", type=positive_int, nargs="+", default=[1],
                    help="context-parallel degrees to try (2024 software)")
    args = ap.parse_args(argv)
    from scaletrain.bench import format_table, out_dir  # torch: after the arguments, so a usage error is quick

    model, cluster = args.model, CLUSTERS[args.cluster]
    batch = args.batch or BATCHES.get(model.name)
    if batch is None:
        ap.error(f"--batch is needed for {model.name}")
    space = dict(zero=args.zero, recompute=args.recompute, sequence_parallel=(False, True) if args.sp else (False,),
                 overlap_dp=not args.no_overlap)
    if args.software:
        space = SOFTWARE[args.software].space(cps=tuple(args.cp))
    try:
        n = len(candidate_layouts(model, cluster, args.gpus, batch, **space))
        best = search(model, cluster, args.gpus, batch, **space)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{model.name}: l={model.layers} h={model.hidden} a={model.heads} s={model.seq} V={model.vocab}, "
          f"Ψ = {model.num_params / 1e9:.1f}B; {args.gpus} × {cluster.name}, batch {batch}")
    print(f"{n} layouts, {len(best)} fit in {cluster.hbm_bytes / 1e9:.0f} GB; the fastest {min(args.top, len(best))} "
          f"(seconds per iteration by part):\n")
    if not best:
        print("nothing fits: try --zero 1 2 3, --recompute full, --sp, or more GPUs")
        return 1
    print(format_table(time_rows(best[:args.top])))
    path = out_dir() / f"plan_{model.name.replace(',', '_').replace('=', '')}_{args.gpus}.png"
    wall = memory_wall(model, cluster, args.gpus, batch, microbatch=min(MICROBATCHES),
                       zero=args.zero[:1], recompute=args.recompute[:1])
    plan_figure(f"{model.name} on {args.gpus} × {cluster.name}, batch {batch}", best[:args.top], wall,
                cluster.hbm_bytes, path)
    print(f"\nplot: {path}")
    return 0
