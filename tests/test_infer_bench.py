"""`python -m scaletrain.bench infer` is discovered by name, its memory table's counted cache bytes
equal the formula, and its distillation and pruning tables hold their baselines (the timed sections
and the trained model run in the benchmark, not here: `make test`'s budget)."""

import math

import pytest

from scaletrain import bench_cli
from scaletrain.infer import benchmark, demo
from scaletrain.infer.prune import KINDS
from scaletrain.models import GPT


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


def test_pruning_table_is_relative_to_the_dense_model_of_the_same_run():
    model = GPT(demo.DEMO_CFG, seed=0).eval()
    rows = benchmark.prune_rows(model, (0.0, 0.5))
    assert [(r["kind"], r["sparsity"]) for r in rows] == [(k, s) for k in KINDS for s in (0.0, 0.5)]
    dense = [r for r in rows if r["sparsity"] == 0.0]
    assert all(r["ppl vs dense"] == 1.0 and r["loss"] == dense[0]["loss"] for r in dense)
    assert all(r["ppl vs dense"] == pytest.approx(math.exp(r["loss"] - dense[0]["loss"])) for r in rows)


def test_distillation_table_has_teacher_baseline_and_student_per_transfer_set():
    teacher = GPT(demo.DEMO_CFG, seed=0).eval()
    rows = benchmark.distill_rows(teacher, steps=2, seeds=2, transfers=(1, None))
    assert [(r["transfer set"], r["model"]) for r in rows] == [
        (t, m) for t in ("1024 B", "fresh batches") for m in ("teacher", benchmark.DISTILL_BASELINE, "distilled")]
    assert all(r["ppl vs scratch"] == 1.0 for r in rows if r["model"] == benchmark.DISTILL_BASELINE)
    assert all(r["params"] == demo.num_params(GPT(demo.STUDENT_CFG)) for r in rows if r["model"] != "teacher")


@pytest.mark.gpu
def test_gpu_compiled_decoding_gives_the_same_tokens_and_a_row_each():
    """Table 7 on a GPU (on a CPU inductor compiles for tens of seconds: `bench infer --compile` runs it by hand)."""
    rows = benchmark.measure_compiled(16, reps=2, device="cuda")
    assert [r["impl"] for r in rows] == [benchmark.COMPILE_BASELINE, "cached, compiled", "uncached, compiled"]
    assert rows[0]["vs eager cached"] == 1.0 and all(r["ms/token"] > 0 for r in rows)
