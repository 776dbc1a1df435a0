"""`python -m scaletrain.bench`: benchmarks are discovered from their files (issue 33), not listed by hand."""

import ast

import pytest

from scaletrain import bench_cli

# the hand-kept list the discovery replaced: every one of these is still found, under its module
KNOWN = {"kernels": "scaletrain.ops.benchmark", "attention": "scaletrain.ops.attention_benchmark",
         "allreduce": "scaletrain.comm.benchmark", "ddp": "scaletrain.dp.benchmark",
         "pipeline": "scaletrain.pipeline.benchmark", "zero": "scaletrain.zero.benchmark",
         "tp": "scaletrain.tp.benchmark", "memory": "scaletrain.checkpointing.benchmark",
         "compression": "scaletrain.compression.benchmark", "moe": "scaletrain.moe.benchmark"}
SPAWNING = {"allreduce", "ddp", "pipeline", "zero", "tp", "compression", "moe"}


def test_every_benchmark_is_found_under_its_name():
    found = bench_cli.benchmarks()
    assert KNOWN.items() <= found.items()
    assert list(found) == sorted(found)


def test_the_benchmarks_that_spawn_ranks_say_so():
    assert SPAWNING <= set(bench_cli.distributed()) and not {"kernels", "attention", "memory"} & set(
        bench_cli.distributed())


@pytest.mark.parametrize("source,expected", [("DISTRIBUTED = True\n", True), ("DISTRIBUTED = False\n", False),
                                             ("def f():\n    DISTRIBUTED = True\n", False), ("X = True\n", False)])
def test_only_a_module_level_true_marks_a_distributed_benchmark(source, expected):
    assert bench_cli._declares_distributed(ast.parse(source)) is expected


def test_an_unknown_name_is_refused_with_the_list(capsys):
    assert bench_cli.main(["nope"]) == 2
    assert "unknown benchmark 'nope'" in capsys.readouterr().err
