"""The memory model against independent references: the schedules' own in-flight counts
(`scaletrain.pipeline.peak_in_flight` on the generated schedules), Korthikanti et al. 2022's
per-layer formulas written out here, a0's parameter count and ZeRO's per-rank bytes."""

from dataclasses import replace

import pytest

from scaletrain.memory import zero_memory_per_rank
from scaletrain.pipeline import gpipe, interleaved_1f1b, one_f_one_b, peak_in_flight
from scaletrain.plan import CLUSTERS, Layout, ModelSpec, in_flight_microbatches, memory_per_gpu
from scaletrain.plan.memory import layer_activation_bytes, params_on_first_rank
from scaletrain.plan.published import GPT3_175B

A100 = CLUSTERS["a100-80gb"]
ODD = ModelSpec(layers=12, hidden=480, heads=12, seq=100, vocab=1003)   # irregular: h/a = 40, V odd


@pytest.mark.parametrize("p", range(1, 7))
def test_in_flight_equals_the_schedules_own_peak(p):
    checked = 0
    for m in sorted({1, p - 1, p, p + 1, 2 * p, 3 * p + 1} - {0}):
        schedule = one_f_one_b(p, m) if m >= p else gpipe(p, m)  # 1F1B with m < p is GPipe
        assert in_flight_microbatches(pp=p, num_microbatches=m) == peak_in_flight(schedule[0]), (p, m)
        checked += 1
        for v in (2, 3):
            if p > 1 and m % p == 0:
                sched = interleaved_1f1b(p, m, v)
                assert in_flight_microbatches(pp=p, num_microbatches=m, interleave=v) == peak_in_flight(sched[0])
                checked += 1
    assert checked >= 3


def test_in_flight_rejects_bad_input():
    with pytest.raises(ValueError, match="positive int"):
        in_flight_microbatches(pp=0, num_microbatches=4)


def _korthikanti(s, b, h, a, t, recompute, sp):
    """Korthikanti et al. 2022, Table 2 (bytes per layer, 16-bit activations, 1-byte masks)."""
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)
    attention = 0 if recompute == "selective" else 5 * a * s / (h * t)
    return s * b * h * ((34 / t if sp else 10 + 24 / t) + attention)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("t,b", [(1, 1), (2, 3), (4, 2), (12, 1)])
def test_layer_activations_are_korthikanti_table2(recompute, sp, t, b):
    lay = Layout(tp=t, pp=1, dp=1, microbatch=b, global_batch=b, recompute=recompute, sequence_parallel=sp)
    want = _korthikanti(ODD.seq, b, ODD.hidden, ODD.heads, t, recompute, sp)
    assert layer_activation_bytes(ODD, lay) == pytest.approx(want, rel=1e-12)


def test_parameters_on_rank_zero():
    one = Layout(tp=1, pp=1, dp=1, microbatch=1, global_batch=1)
    assert params_on_first_rank(ODD, one) == ODD.num_params  # the whole model, counted like a0
    # 4 stages: 3 layers and the embedding; 4 tensor ranks: a quarter of each weight
    staged = params_on_first_rank(ODD, replace(one, pp=4))
    assert staged == ODD.num_params - 9 * (12 * 480 ** 2 + 13 * 480) - 2 * 480
    split = params_on_first_rank(ODD, replace(one, tp=4))
    assert split == pytest.approx(ODD.num_params / 4, rel=0.01)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_model_states_are_zero_per_rank(zero):
    lay = Layout(tp=8, pp=8, dp=16, microbatch=1, global_batch=1536, zero=zero)
    mem = memory_per_gpu(GPT3_175B, A100, lay)
    want = zero_memory_per_rank(params_on_first_rank(GPT3_175B, lay), 16, zero, precision="mixed", optimizer="adam")
    assert (mem.params, mem.grads, mem.optimizer) == (want.params, want.grads, want.optimizer)


def test_activations_count_every_microbatch_in_flight():
    # 1F1B's rank 0 holds p microbatches of its l/p layers; with full recompute each keeps the
    # layer inputs (2sbh per layer), plus one layer recomputed whole
    lay = Layout(tp=8, pp=8, dp=16, microbatch=2, global_batch=1536)
    s, b, h, a, t = 2048, 2, 12288, 96, 8
    inputs = 8 * (96 // 8) * 2 * s * b * h
    working = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert memory_per_gpu(GPT3_175B, A100, lay).activations == pytest.approx(inputs + working, rel=1e-12)
    # interleaving keeps more chunks in flight (Narayanan et al. §2.2.2: a little more memory)
    more = memory_per_gpu(GPT3_175B, A100, replace(lay, interleave=2)).activations
    assert more > inputs + working


def test_memory_falls_with_each_technique():
    base = Layout(tp=8, pp=4, dp=4, microbatch=1, global_batch=64, recompute="none")
    total = lambda **kw: memory_per_gpu(GPT3_175B, A100, replace(base, **kw)).total  # noqa: E731
    assert total(recompute="full") < total(recompute="selective") < total()
    assert total(sequence_parallel=True) < total()
    assert total(zero=3) < total(zero=2) < total(zero=1) < total()
