"""scaletrain.plan's inputs: validation with messages that say what to change, Ψ and FLOPs against
the paper's closed forms (Narayanan et al. 2021, §5.1, eq. 3) and a0's 6·N·D."""

import pytest

from scaletrain.memory import training_flops
from scaletrain.plan import CLUSTERS, TABLE1, Layout, ModelSpec, check_layout, predict
from scaletrain.plan.efficiency import GemmEfficiency, roofline_overhead
from scaletrain.plan.flops import iteration_flops, layer_forward_flops, layer_gemms, model_flops
from scaletrain.plan.published import GPT3_175B

A100 = CLUSTERS["a100-80gb"]


def layout(**kw):
    return Layout(**{"tp": 8, "pp": 8, "dp": 16, "microbatch": 1, "global_batch": 1536} | kw)


@pytest.mark.parametrize("kw,message", [
    (dict(global_batch=1000), "not a multiple of microbatch·dp"),
    (dict(microbatch=5), "not a multiple of microbatch·dp"),
    (dict(interleave=2, pp=1, dp=128), "needs a pipeline"),
    (dict(interleave=2, global_batch=16 * 12), "multiple of pp=8"),
    (dict(recompute="some"), "recompute must be one of"),
    (dict(zero=4), "ZeRO stage"),
    (dict(tp=0), "positive int"),
])
def test_layout_rejects_what_cannot_run(kw, message):
    with pytest.raises(ValueError, match=message):
        layout(**kw)


def test_check_layout_against_the_model_and_the_gpu_count():
    check_layout(GPT3_175B, layout(), gpus=1024)
    with pytest.raises(ValueError, match="8·1·8·16 = 1024 GPUs, not the 512"):
        check_layout(GPT3_175B, layout(), gpus=512)
    with pytest.raises(ValueError, match="tp=5 must divide heads=96"):
        check_layout(GPT3_175B, layout(tp=5, dp=16))
    with pytest.raises(ValueError, match="divisible by pp·interleave = 8·5 = 40"):
        check_layout(GPT3_175B, layout(interleave=5, global_batch=16 * 8 * 3))
    with pytest.raises(ValueError, match="not the 512"):
        predict(GPT3_175B, A100, layout(), gpus=512)


def test_model_spec_rejects_bad_shapes():
    with pytest.raises(ValueError, match="divisible by heads"):
        ModelSpec(layers=2, hidden=100, heads=3, seq=8, vocab=10)
    with pytest.raises(ValueError, match="positive int"):
        ModelSpec(layers=0, hidden=64, heads=4, seq=8, vocab=10)


@pytest.mark.parametrize("run", TABLE1, ids=lambda r: f"{r.params_b:g}B")
def test_parameter_count_matches_table1(run):
    # the paper's P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)), printed to 0.1B (4 digits)
    assert run.model.num_params / 1e9 == pytest.approx(run.params_b, rel=1e-3, abs=0.05)


@pytest.mark.parametrize("run", TABLE1[::3], ids=lambda r: f"{r.params_b:g}B")
def test_iteration_flops_is_eq3(run):
    B, s, l, h, V = run.batch, 2048, run.layers, run.hidden, 51200
    eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    assert iteration_flops(run.model, B, recompute="full") == pytest.approx(eq3, rel=1e-12)
    # without recompute: 3 passes; the weight part is a0's 6·N·D over the layers' and logits' weights
    no_rc = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    assert model_flops(run.model, B) == pytest.approx(no_rc, rel=1e-12)
    # PaLM appendix B: 6·N·D over the weights that multiply (not biases, LayerNorms or the
    # position table, which do no GEMM), plus 12·l·h·s per token for attention
    gemm_params = run.model.num_params - l * 13 * h - 2 * h - s * h
    six_nd = training_flops(num_params=gemm_params, num_tokens=B * s)
    assert model_flops(run.model, B) == pytest.approx(six_nd + 12 * l * h * s * B * s, rel=1e-12)
    selective = iteration_flops(run.model, B, recompute="selective")
    assert no_rc < selective < eq3


def test_layer_gemms_add_up_to_the_layer_on_each_tensor_rank():
    for t in (1, 2, 8):
        gemms = layer_gemms(GPT3_175B, 3, t)
        assert sum(g[0] for g in gemms) == pytest.approx(layer_forward_flops(GPT3_175B, 3) / t, rel=1e-12)


def test_roofline_efficiency_grows_with_every_side():
    eff = GemmEfficiency(a=1.62, kappa=216.0)  # a roofline with a slope (the A100 preset's kappa is 0)
    base = eff(layer_gemms(GPT3_175B, 1, 8))
    assert eff(layer_gemms(GPT3_175B, 4, 8)) > base       # more tokens per GEMM
    assert eff(layer_gemms(GPT3_175B, 1, 4)) > base       # a wider slice of each weight
    assert 0 < base < 1 / eff.a <= 1                      # never past what a huge GEMM reaches
    # one square GEMM: O = 3/n exactly
    assert roofline_overhead([(2.0 * 64 ** 3, 64, 64, 64)]) == pytest.approx(3 / 64)
    with pytest.raises(ValueError):
        GemmEfficiency(a=-1.0)
