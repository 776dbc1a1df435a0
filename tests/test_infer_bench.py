"""`python -m scaletrain.bench infer` is discovered by name, and its memory table's counted cache bytes
equal the formula (the timed sections run in the benchmark, not here: `make test`'s budget)."""

from scaletrain import bench_cli
from scaletrain.infer import benchmark


def test_the_benchmark_is_discovered_as_infer():
    assert bench_cli.benchmarks()["infer"] == "scaletrain.infer.benchmark"
    assert "infer" not in bench_cli.distributed()


def test_memory_table_counts_what_the_formula_says():
    rows = benchmark.memory_rows()
    counted = [r for r in rows if r["counted B"] != ""]
    assert len(counted) == 2 and all(r["counted B"] == r["B formula"] for r in counted)
    gpt2 = {(r["what"], r["bits"]): r["B formula"] for r in rows if r["model"] == "GPT-2 small"}
    assert gpt2[("KV cache b=8 s=1024", 16)] == 2 * 12 * 8 * 1024 * 768 * 2  # 288 MiB
    assert gpt2[("block weights, float", 32)] == 12 * 12 * 768 * 768 * 4  # 12·h² per layer
