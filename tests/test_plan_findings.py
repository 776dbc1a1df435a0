"""The paper's qualitative findings, rediscovered by `search` and `predict` (Narayanan et al. 2021,
§3 takeaways and §5.4-5.7; the seminar notes "Large-scale DL optimizations", §1.2.5). Nothing in
the planner encodes them: they follow from the bubble, the α–β links and the roofline efficiency.
"""

import pytest

from scaletrain.plan import CLUSTERS, Layout, predict, search
from scaletrain.plan.published import GPT3_175B, MODELS, table1_model

A100 = CLUSTERS["a100-80gb"]


def test_throughput_falls_when_tensor_parallelism_crosses_a_node():
    """§5.4.1, Figure 13: 64 GPUs, t·p = 64. Beyond t = 8 the allreduces leave NVLink for InfiniBand."""
    best = {}
    for pred in search(GPT3_175B, A100, 64, 128, overlap_dp=False):  # fastest first
        if pred.layout.dp == 1:
            best.setdefault(pred.layout.tp, pred.tflops_per_gpu)
    inside = max(v for t, v in best.items() if t <= A100.gpus_per_node)
    assert best[16] < 0.5 * inside
    assert best[32] < best[16]


def test_interleaving_helps_at_small_batch():
    """§5.3.2, Figure 12: 175B on 96 GPUs (t = 8, p = 12), microbatch 1. v = 2 cuts the bubble by
    two at the price of twice the pipeline messages: a clear gain at batch 12, a small one at 192."""
    def speedup(batch):
        t = [predict(GPT3_175B, A100, Layout(tp=8, pp=12, dp=1, microbatch=1, global_batch=batch, interleave=v,
                                             overlap_dp=False)).iteration_s for v in (1, 2)]
        return t[0] / t[1]
    gains = [speedup(b) for b in (12, 24, 48, 96, 192)]
    assert gains[0] > 1.2
    assert all(a > b for a, b in zip(gains, gains[1:]))  # the gap closes as the batch grows
    assert gains[-1] < 1.05


def test_larger_microbatches_help_until_memory_runs_out():
    """§5.7 / the seminar's §1.2.5.3: a larger b never runs a layer slower and costs memory. With
    the element-wise traffic counted (`rates.py`), Table 1's fit finds GEMMs of b·s >= 2048 tokens
    at full speed (kappa = 0), so without a pipeline b only trades memory; on a roofline with a
    slope (kappa > 0, e.g. the fit without the traffic term) a larger b is strictly faster."""
    from dataclasses import replace

    from scaletrain.plan.efficiency import GemmEfficiency

    model = table1_model(1.7)
    for cluster in (A100, replace(A100, efficiency=GemmEfficiency(a=1.62, kappa=216.0))):
        preds = [predict(model, cluster, Layout(tp=1, pp=1, dp=32, microbatch=b, global_batch=512, recompute="none"))
                 for b in (1, 2, 4, 8)]
        fits = [p for p in preds if p.fits]
        assert 1 <= len(fits) < len(preds)
        assert all(a.tflops_per_gpu <= b.tflops_per_gpu * (1 + 1e-12) for a, b in zip(preds, preds[1:]))
        if cluster.efficiency.kappa:  # strictly faster with b, up to the last that fits
            assert all(a.tflops_per_gpu < b.tflops_per_gpu for a, b in zip(preds, preds[1:]))
            best = search(model, cluster, 32, 512, recompute=("none",))[0]
            assert best.layout.microbatch == fits[-1].layout.microbatch
    # with a pipeline a larger b also means fewer microbatches and a larger bubble (Figure 8): on
    # the sloped roofline the best b at batch 512 is neither the smallest nor the largest that
    # fits; on the preset, whose GEMMs gain nothing from b, the bubble makes b = 1 the best
    for cluster, interior in ((replace(A100, efficiency=GemmEfficiency(a=1.62, kappa=216.0)), True), (A100, False)):
        piped = {b: predict(table1_model(145.6), cluster, Layout(tp=8, pp=8, dp=1, microbatch=b, global_batch=512,
                                                                  overlap_dp=False)) for b in (1, 2, 4, 8, 16)}
        fitting = [b for b, p in piped.items() if p.fits]
        winner = max(fitting, key=lambda b: piped[b].tflops_per_gpu)
        assert (fitting[0] < winner < fitting[-1]) if interior else winner == fitting[0]


@pytest.mark.parametrize("name,gpus,batch", [("175B", 1024, 1536), ("39.1B", 512, 1536), ("310.1B", 1920, 2160),
                                              ("1008B", 3072, 3072), ("18.4B", 256, 1024)])
@pytest.mark.parametrize("cluster", ["a100-80gb", "h100"])
def test_the_best_layout_keeps_tensor_parallelism_inside_a_node(name, gpus, batch, cluster):
    """§3.3, takeaway #1: t up to the GPUs of a node, then pipeline across nodes."""
    best = search(MODELS[name], CLUSTERS[cluster], gpus, batch, top=1)[0]
    assert best.layout.tp <= CLUSTERS[cluster].gpus_per_node
