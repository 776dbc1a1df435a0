"""`python -m scaletrain.profile [--device auto|cpu|cuda] [--steps N] [--quick] [--out DIR] [--model gpt|fused]`

Profiles training steps of a GPT-2-like model and prints where the time goes (training-speedup-
lecture.md, "GPT-2 Profiling: Time"): ms by category for the forward, the backward and the
optimizer step; the costliest priced ops against the roofline measured on this machine; the MFU;
the bytes of each tensor kind at the marks of a step ("GPT-2 Profiling: Memory", memory_timeline.py).
Writes `profile_bars.png`, `profile_roofline.png`, `profile_memory.png` and the Chrome trace
`profile_trace.json` (open in ui.perfetto.dev or chrome://tracing) under DIR (default ./bench_out);
`profile_fused_*` for `--model fused`.

`--model fused` (a GPU only) profiles the same step on the course's fused Triton kernels (fused.py):
each call of scaletrain.ops is a `scaletrain::<op>` range in the trace (ops/labels.py), so their
kernels' time has an operation to go to.  The first H200 run timed that step at 3.9x eager's
(`bench profile --part variants`), fp32 attention's exact dots the likely cause (kernels/attention_triton.py,
_precision: changed since); this says where the time goes.

Shapes: on a GPU, GPT-2 small as the seeds profile it (h = 768, 12 layers, s = 512, b = 8, V = 50257;
fp32; shapes.GPU_STATUS says what GPU runs have shown).  On a CPU, a scaled shape of the same form that runs
in seconds (h = 128, 4 layers, s = 128, b = 4, V = 256): what it says is about this CPU.
"""

from __future__ import annotations

import argparse
import sys

import torch

from scaletrain import bench
from scaletrain.bench_cli import positive_int
from scaletrain.models import GPT, make_batch
from scaletrain.profile.fused import FUSED_BACKEND, FusedGPT, fused_unavailable
from scaletrain.profile.memory_timeline import KINDS, memory_timeline
from scaletrain.profile.roofline import measure_machine
from scaletrain.profile.shapes import SHAPES, device_arg, device_note, pick_shape, resolve_device
from scaletrain.profile.tables import category_table, op_table, step_mfu
from scaletrain.profile.trace import profile_steps, training_step

TOP_OPS = 12


def profile_gpt(shape: str, device: str, *, steps: int, trace_name: str = "profile_trace.json",
                fused_backend: str | None = None):
    """The profile of `steps` AdamW steps of the GPT of `shape` on `device`, and its model and tokens;
    with `fused_backend`, the GPT on the course's fused kernels of that backend (fused.py)."""
    cfg, batch = SHAPES[shape]
    model = GPT(cfg, seed=0).to(device)
    if fused_backend:
        model = FusedGPT(model, fused_backend)
    idx, targets = (t.to(device) for t in make_batch(cfg, batch, seed=0))
    # foreach: one kernel per update over all tensors (torch's default on a GPU; the CPU default loops)
    step = training_step(model, (idx, targets), torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True))
    prof = profile_steps(step, steps=steps, warmup=1, device=device, trace_path=bench.out_dir() / trace_name)
    return prof, sum(p.numel() for p in model.parameters()), idx.numel()


def memory_marks(shape: str, device: str):
    """The memory timeline of two AdamW steps of a fresh GPT of `shape` (the second one is the steady state)."""
    cfg, batch = SHAPES[shape]
    model = GPT(cfg, seed=0).to(device)
    data = tuple(t.to(device) for t in make_batch(cfg, batch, seed=0))
    return memory_timeline(model, data, torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True))


def memory_table(marks) -> list[dict]:
    """MB of each kind at the marks of the last step."""
    last = [m for m in marks if m.step == marks[-1].step]
    return [{"phase": m.phase, "mark": m.label, **{f"{k} MB": m.bytes[k] / 1e6 for k in KINDS},
             "total MB": sum(m.bytes.values()) / 1e6} for m in last]


def figures(prof, rows, machine, marks, name: str = "profile"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scaletrain.profile.plot import category_bars, memory_timeline_plot, roofline_plot

    paths = []
    for suffix, draw in (("bars", lambda ax: category_bars(ax, prof)),
                         ("roofline", lambda ax: roofline_plot(ax, rows, machine)),
                         ("memory", lambda ax: memory_timeline_plot(ax, marks))):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        draw(ax)
        fig.tight_layout()
        paths.append(bench.save_figure(fig, f"{name}_{suffix}.png"))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.profile", description=__doc__.splitlines()[2])
    parser.add_argument("--device", type=device_arg, default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--steps", type=positive_int, default=3, help="profiled steps (after one warm-up step); "
                                                                "the tables show the median one")
    parser.add_argument("--quick", action="store_true", help="a tiny GPT and a small roofline measurement")
    parser.add_argument("--out", default=None, help="where figures and the trace go (default ./bench_out)")
    parser.add_argument("--model", choices=("gpt", "fused"), default="gpt",
                        help=f"gpt: torch's ops; fused: LayerNorm, attention and the loss on the course's "
                             f"{FUSED_BACKEND} kernels (a GPU only)")
    args = parser.parse_args(argv)
    if args.out:
        import os
        os.environ["SCALETRAIN_BENCH_OUT"] = args.out
    device = resolve_device(args.device)
    if args.model == "fused" and (why := fused_unavailable(device)):
        parser.error(f"--model fused on {device}: {why}")
    name = "profile" if args.model == "gpt" else "profile_fused"  # the files' prefix: both can sit in one DIR
    shape = pick_shape(device, quick=args.quick)
    cfg, batch = SHAPES[shape]
    print(f"device {device_note(device)}; "
          f"GPT h={cfg.n_embd} L={cfg.n_layer} s={cfg.block_size} b={batch} V={cfg.vocab_size}; "
          f"{args.steps} profiled steps", flush=True)
    threads = torch.get_num_threads()
    if device == "cpu":  # one thread: on a shared 2-core box a second one waits for a busy core (ms-long stalls)
        torch.set_num_threads(1)
    try:
        # the same thread count as the profile: the roofs it can reach
        machine = measure_machine(device, **(dict(matmul_n=384, copy_mb=16) if args.quick else {}))
        prof, num_params, tokens = profile_gpt(shape, device, steps=args.steps, trace_name=f"{name}_trace.json",
                                               fused_backend=FUSED_BACKEND if args.model == "fused" else None)
        marks = memory_marks(shape, device)
    finally:
        torch.set_num_threads(threads)
    totals = ", ".join(f"{sum(d.values()) * 1e3:.1f}" for d in prof.by_step)
    prof = prof.median_step()  # a preempted op on a shared machine inflates its step: read the median one
    print(f"\ntime by category, ms in the median step (steps took {totals} ms)\n"
          + bench.format_table(category_table(prof)))
    rows = op_table(prof, machine)
    print(f"\nthe {TOP_OPS} costliest priced ops, on the roofline (ridge {machine.ridge:.1f} FLOP/B)\n"
          + bench.format_table(rows[:TOP_OPS]))
    print("\nMFU\n" + bench.format_table([step_mfu(prof, machine, num_params=num_params, tokens=tokens)]))
    print("\nmemory by tensor kind at the marks of a step (the second: Adam's state already there)\n"
          + bench.format_table(memory_table(marks)))
    paths = figures(prof, rows, machine, marks, name)
    print(f"\nwrote {', '.join(str(p) for p in paths)}, {prof.trace_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
