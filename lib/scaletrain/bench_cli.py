"""`python -m scaletrain.bench <name|all> [options]`: every benchmark of the library, discovered.

A benchmark is a module `benchmark.py` or `*_benchmark.py` beside the code it measures, with
`main(argv: list[str]) -> int`. Its docstring's first line names it (`` `python -m scaletrain.bench
NAME ...` ``), and `DISTRIBUTED = True` at module level says it spawns ranks (what `all` runs under
torchrun). Both are read from the files, not imported (each benchmark imports what it measures), so
a new benchmark is registered by being written.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib
import math
import os
import re
import sys
from pathlib import Path

__all__ = ["benchmarks", "distributed", "main", "positive_int", "nonnegative_int", "positive_ints", "positive_float"]

ROOT = Path(__file__).resolve().parent
_NAMED = re.compile(r"`python -m scaletrain\.bench (\w+)")


@functools.cache
def _found() -> tuple[tuple[str, str, bool], ...]:
    """(name, module, distributed) of every benchmark module under the library, by name."""
    found = []
    for path in sorted([*ROOT.rglob("benchmark.py"), *ROOT.rglob("*_benchmark.py")]):
        tree = ast.parse(path.read_text())
        named = _NAMED.match(ast.get_docstring(tree) or "")
        if named is None:
            raise RuntimeError(f"{path}: a benchmark's docstring starts with `python -m scaletrain.bench NAME ...`")
        module = ".".join(("scaletrain", *path.relative_to(ROOT).with_suffix("").parts))
        found.append((named.group(1), module, _declares_distributed(tree)))
    names = [name for name, _, _ in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two benchmarks share a name: {sorted(n for n in names if names.count(n) > 1)}")
    return tuple(sorted(found))


def _declares_distributed(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DISTRIBUTED" for t in node.targets)
               and isinstance(node.value, ast.Constant) and node.value.value is True for node in tree.body)


def benchmarks() -> dict[str, str]:
    """name -> module with `main(argv) -> int`."""
    return {name: module for name, module, _ in _found()}


def distributed() -> tuple[str, ...]:
    """The benchmarks that spawn ranks: what `all` runs under torchrun."""
    return tuple(name for name, _, spawns in _found() if spawns)


# argparse `type=`s of every entry point's numeric options: a 0 or negative count is argparse's usage error
# naming the option (exit 2), not a traceback from deep in torch, a ZeroDivisionError or a silent default
# (`args.reps or 10`). Here, not in bench.py, so that the CLIs parse before torch is imported.
def positive_int(text: str) -> int:
    return _checked(int, text, lambda v: v >= 1, "a positive integer")


def nonnegative_int(text: str) -> int:
    return _checked(int, text, lambda v: v >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    return _checked(float, text, lambda v: v > 0 and math.isfinite(v), "a positive number")


def positive_ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(positive_int(v) for v in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"needs comma-separated integers, each positive, e.g. 4096,32768; "
                                         f"got {text!r}") from None


def _checked(kind, text: str, ok, what: str):
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"needs {what}, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """`python -m scaletrain.bench <name|all> [options]`. Under torchrun every rank runs the
    benchmark (its ranks are torchrun's processes); only rank 0 prints and writes plots."""
    argv = list(sys.argv[1:] if argv is None else argv)
    found = benchmarks()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in (*found, "all"):
        bad = f"unknown benchmark {argv[0]!r}. " if argv and argv[0] not in ("-h", "--help") else ""
        print(f"{bad}usage: python -m scaletrain.bench <{', '.join(found)}|all> [options]\n"
              "Each prints a table (median, p20, p80, ratio to the baseline measured in the same run)\n"
              "and saves a plot under ./bench_out (or $SCALETRAIN_BENCH_OUT). `all` runs each in turn,\n"
              "passing on the options (e.g. --quick); under torchrun, the distributed ones.", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    from scaletrain.launch import is_primary, under_torchrun

    names = [argv[0]] if argv[0] != "all" else [n for n in found if n in distributed() or not under_torchrun()]
    code = 0
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(sys.stdout if is_primary() else devnull):
        for name in names:
            if len(names) > 1:
                print(f"\n=== {name} ===", flush=True)
            code = max(code, int(importlib.import_module(found[name]).main(argv[1:]) or 0))
    return code
