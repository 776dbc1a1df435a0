"""Every command-line entry point answers a 0 or negative count, and `--device cuda` without a GPU, with
argparse's one-line usage error (exit 2, naming the option), never a traceback or a silent wrong run.
Each case runs in this process as `python -m` runs it.

The entry points and their numeric options are discovered, not listed: every benchmark `python -m
scaletrain.bench NAME` finds, every `__main__.py` and module run as `__main__` under lib/scaletrain, each
with the options of the parser its `main` builds (caught at `parse_args`). An option may take 0 only where
its parser says so (`nonnegative_int`, or 0 among its choices); -1 is refused everywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import runpy
import sys
import tempfile
import warnings
from unittest import mock

import pytest
import torch

from scaletrain.bench_cli import ROOT, benchmarks, nonnegative_int

class _Parsed(Exception):
    """Raised in place of parsing: carries the parser an entry point's `main` built."""


def _entry_points() -> list[tuple[str, ...]]:
    """`python -m` argv prefixes: each benchmark, each package's __main__.py, each module run as __main__."""
    points = [("scaletrain.bench", name) for name in benchmarks()]
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(("scaletrain", *path.relative_to(ROOT).with_suffix("").parts))
        if path.name == "__main__.py":
            points.append((module.removesuffix(".__main__"),))
        elif 'if __name__ == "__main__":' in path.read_text() and module != "scaletrain.bench":  # bench: above
            points.append((module,))
    return points


def _parser(entry: tuple[str, ...]) -> argparse.ArgumentParser:
    """The parser the entry point's `main` builds, caught where it would parse `sys.argv`."""
    def caught(parser, *args, **kwargs):
        raise _Parsed(parser)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", caught), \
            mock.patch.object(sys, "argv", list(entry)), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is already imported (by discovery)
        try:
            runpy.run_module(entry[0], run_name="__main__")
        except _Parsed as parsed:
            return parsed.args[0]
    raise AssertionError(f"python -m {' '.join(entry)} never parsed its arguments")


def _refused(action: argparse.Action) -> tuple[str, ...]:
    """The values of a numeric option its parser must refuse: -1, and 0 unless it declares 0 meaningful."""
    zero_ok = action.type is nonnegative_int or 0 in (action.choices or ())
    return ("-1",) if zero_ok else ("0", "-1")


def _numeric(action: argparse.Action) -> bool:
    """An option taking numbers: a plain int/float or one of bench_cli's checked types."""
    return bool(action.option_strings) and (action.type in (int, float) or
                                             getattr(action.type, "__module__", None) == "scaletrain.bench_cli")


def _cases(entry: tuple[str, ...]) -> list[tuple[tuple[str, ...], str, str]]:
    """(entry, option, value) for each value the entry point must refuse; `--device cuda` where it has one."""
    cases = []
    for action in _parser(entry)._actions:
        if _numeric(action):
            cases += [(entry, action.option_strings[-1], value) for value in _refused(action)]
        elif "cuda" in (action.choices or ()):
            cases.append((entry, action.option_strings[-1], "cuda"))
    return cases


CASES = [case for entry in _entry_points() for case in _cases(entry)]
ON_CPU = not torch.cuda.is_available()


def _run(entry: tuple[str, ...], option: str, value: str) -> tuple[object, str, list[str]]:
    """`python -m ENTRY OPTION=VALUE` run in this process as `-m` runs it (a parse error comes before any
    work: a process per case would cost a torch import each, a minute in all): its exit code, its
    stderr, and what it wrote where benchmarks write."""
    err, threads = io.StringIO(), torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="cliargs_") as out, \
            mock.patch.dict(os.environ, {"SCALETRAIN_BENCH_OUT": out}), \
            mock.patch.object(sys, "argv", [*entry, f"{option}={value}"]), \
            contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is already imported (by discovery)
        try:
            runpy.run_module(entry[0], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code
        finally:
            torch.set_num_threads(threads)  # a main that sets it must not slow the tests after it
        return code, err.getvalue(), os.listdir(out)


@pytest.mark.parametrize(("entry", "option", "value"), [
    pytest.param(*case, id=f"{'-'.join(case[0])}{case[1]}={case[2]}",
                 marks=[] if case[2] != "cuda" or ON_CPU else [pytest.mark.skip(reason="this machine has CUDA")])
    for case in CASES])
def test_a_bad_value_is_a_usage_error(entry, option, value):
    code, stderr, written = _run(entry, option, value)
    assert code == 2, stderr
    assert "error:" in stderr and option in stderr, stderr
    assert not written, "nothing is written before the arguments are checked"
