"""`python -m scaletrain.bench_gpu [--budget-s S] [--out DIR]` (`make gpu-bench`): every benchmark
whose figures need a GPU, one command, one folder.

`make gpu-check` says whether the GPU half is *right*; this says how *fast* it is: the figures the
README and docs/measured.md quote from a GPU, reproduced on the reader's own card.  Each benchmark
runs in its own process (a crash or a hang costs that one only), in the order of STEPS (the kernel
grid first: most of the course's speed claims are there), with its log and plots in `--out`
(default bench_out/gpu_bench), and `summary.md` listing each step's exit code and seconds, written
again after every step.  `--budget-s` bounds the whole run (a lent GPU with a time limit): each step
gets at most what is left, and a step that cannot start with MIN_START_S left is listed as not run.

Where this interpreter's torch sees no GPU it says so and exits 0, having run nothing (a CPU's
figures are about the CPU: run `python -m scaletrain.bench <name>` there).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from scaletrain.bench_cli import positive_float

__all__ = ["STEPS", "MIN_START_S", "plan", "main"]

BENCH = ("-m", "scaletrain.bench")
# (name, arguments of `python` ("{out}": the output folder), the most seconds it may take)
STEPS = (
    ("kernels", (*BENCH, "kernels"), 300),                          # softmax / LayerNorm grid and ceilings
    ("attention", (*BENCH, "attention", "--quick"), 180),            # FlashAttention: Triton, CUDA mma, SDPA
    ("attention-causal", (*BENCH, "attention", "--quick", "--causal"), 180),
    ("kernels-variants", (*BENCH, "kernels", "--quick", "--variants", "--sizes", "512,1024,4096,16384",
                          "--dtype", "fp32,bf16"), 240),             # which launch (warps, rows a program)
    ("cross_entropy", (*BENCH, "cross_entropy", "--quick", "--variants"), 150),  # fused CE, its chunks, the LM head
    ("profile-gpt2", ("-m", "scaletrain.profile", "--device", "cuda", "--out", "{out}"), 240),  # where a GPT-2 small step's time goes
    ("profile-variants", (*BENCH, "profile", "--part", "variants"), 300),    # eager, fused, compiled
    ("profile-fused", ("-m", "scaletrain.profile", "--device", "cuda", "--model", "fused", "--out", "{out}"), 240),
    ("infer", (*BENCH, "infer", "--quick"), 240),                    # KV cache, re-rank, compiled decoding
)
MIN_START_S = 30


def plan(budget_s: float | None, elapsed_s: float, cap_s: float) -> float | None:
    """Seconds step may take, or None when it should not start: the budget left (budget_s minus
    elapsed_s) caps cap_s, and under MIN_START_S left nothing useful can finish."""
    if budget_s is None:
        return cap_s
    left = budget_s - elapsed_s
    return min(cap_s, left) if left >= MIN_START_S else None


def _run(name: str, args: tuple[str, ...], limit_s: float, out: Path) -> tuple[int, float]:
    """(exit code, seconds) of one step; 124 when past limit_s (killed)."""
    start = time.monotonic()
    env = {**os.environ, "SCALETRAIN_BENCH_OUT": str(out)}
    with open(out / f"{name}.log", "w") as log:
        try:
            code = subprocess.run([sys.executable, *(a.format(out=out) for a in args)], stdout=log,
                                  stderr=subprocess.STDOUT, env=env, timeout=limit_s).returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, time.monotonic() - start


def _summary(rows: list[dict], out: Path) -> None:
    from scaletrain.bench import format_table

    gpu = torch.cuda.get_device_name()
    head = f"# GPU benchmarks on {gpu}: torch {torch.__version__}, CUDA {torch.version.cuda}\n\n"
    (out / "summary.md").write_text(head + format_table(rows, ["step", "command", "exit", "seconds", "log"]) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.bench_gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=positive_float, default=None,
                        help="seconds for the whole run (default: no bound)")
    parser.add_argument("--out", default="bench_out/gpu_bench")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"gpu-bench: the torch of {sys.executable} sees no CUDA GPU; nothing was run. On a GPU machine "
              "name the interpreter whose torch does (make gpu-bench GPU_PY=...); on a CPU, each benchmark "
              "runs alone: python -m scaletrain.bench <name>.")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start, rows, worst = time.monotonic(), [], 0
    for name, bench_args, cap_s in STEPS:
        limit = plan(args.budget_s, time.monotonic() - start, cap_s)
        row = {"step": name, "command": "python " + " ".join(bench_args), "log": f"{name}.log"}
        if limit is None:
            rows.append({**row, "exit": "not run (budget)", "seconds": 0, "log": ""})
        else:
            print(f"gpu-bench: {row['command']} (at most {limit:.0f} s)", flush=True)
            code, seconds = _run(name, bench_args, limit, out)
            print(f"  exit {code} after {seconds:.0f} s (log: {out / row['log']})", flush=True)
            rows.append({**row, "exit": code, "seconds": round(seconds)})
            worst = max(worst, code)
        _summary(rows, out)
    print((out / "summary.md").read_text())
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
