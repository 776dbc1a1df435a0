"""Public tests of a9: each task against a reference nobody wrote for it (the schedules' own
in-flight counts, Korthikanti's table, the seminar's eq. 5, the pipeline simulator, Narayanan et
al.'s Table 1). The grader runs more: held-out models, clusters and layouts for every function.
Run one task with `pytest assignments/a9_planning -m task9_2`.
"""

from dataclasses import replace

import pytest

from autograder.checks import student_module
from scaletrain.comm.cost_model import AlphaBeta
from scaletrain.pipeline import interleaved_1f1b, one_f_one_b, peak_in_flight, simulate
from scaletrain.plan.clusters import CLUSTERS
from scaletrain.plan.flops import iteration_flops
from scaletrain.plan.published import GPT3_175B, TABLE1
from scaletrain.plan.specs import Layout, ModelSpec
from scaletrain.testing import assert_close, expect_equal

pm = student_module("plan_memory", default=__file__)
pt = student_module("plan_time", default=__file__)
ps = student_module("plan_search", default=__file__)
A100 = CLUSTERS["a100-80gb"]
M72 = ModelSpec(layers=72, hidden=6144, heads=48, seq=2048, vocab=51200)


@pytest.mark.task9_1
@pytest.mark.parametrize("p,m,v", [(4, 8, 1), (4, 2, 1), (4, 8, 2), (3, 6, 3)])
def test_task9_1_in_flight_equals_the_schedule(p, m, v):
    from scaletrain.pipeline import gpipe
    schedule = interleaved_1f1b(p, m, v) if v > 1 else one_f_one_b(p, m) if m >= p else gpipe(p, m)
    expect_equal(pm.in_flight_microbatches(pp=p, num_microbatches=m, interleave=v), peak_in_flight(schedule[0]),
                 what=f"in_flight_microbatches(pp={p}, num_microbatches={m}, interleave={v}) against the "
                      f"schedule's own peak on rank 0")


@pytest.mark.task9_1
def test_task9_1_layer_activations_are_korthikanti():
    s, b, h, a, t = 2048, 2, 12288, 96, 8
    lay = Layout(tp=t, pp=8, dp=16, microbatch=b, global_batch=1536, recompute="none")
    korthikanti = {  # (recompute, sequence parallel) -> bytes per layer (§4-5, e = 2)
        ("none", False): s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
        ("none", True): s * b * h * (34 / t + 5 * a * s / (h * t)),
        ("selective", False): s * b * h * (10 + 24 / t),
        ("full", False): 2 * s * b * h}
    for (recompute, sp), want in korthikanti.items():
        got = pm.layer_activation_bytes(GPT3_175B, replace(lay, recompute=recompute, sequence_parallel=sp))
        expect_equal(got, want, what=f"layer_activation_bytes(GPT-3 175B, t={t}, b={b}, recompute={recompute!r}, "
                                     f"sequence_parallel={sp}), Korthikanti et al. 2022")


@pytest.mark.task9_1
def test_task9_1_gpt3_on_rank_zero():
    mem = pm.memory_per_gpu(GPT3_175B, A100, Layout(tp=8, pp=8, dp=16, microbatch=1, global_batch=1536))
    where = "memory_per_gpu(GPT-3 175B, A100 80GB, t=8, p=8, d=16, b=1, batch 1536, full recompute)"
    # 12 layers and the embedding, 1/8 of each weight: 2.82 G parameters at 2 + 2 + 12 bytes
    expect_equal((mem.params, mem.grads, mem.optimizer), (5_645_463_552, 5_645_463_552, 33_872_781_312),
                 what=f"{where}: (params, grads, optimizer) bytes")
    # 8 microbatches in flight × 12 layer inputs of 2·s·h bytes, plus one layer recomputed whole
    expect_equal(mem.activations, 8 * 12 * 2 * 2048 * 12288 + 2048 * 12288 * (10 + 24 // 8 + 5 * 96 * 2048 // (12288 * 8)),
                 what=f"{where}: activation bytes")
    assert mem.total < 80e9, f"{where}: total {mem.total:,} bytes; Table 1 ran this on 80 GB GPUs"


@pytest.mark.task9_2
def test_task9_2_tp_traffic_is_eq5():
    # seminar notes §1.2.5.1, eq. 5: 8·b·s·h·(t-1)/t elements per layer for one forward and backward
    beta = 1 / 100e9
    cluster = replace(A100, intra=AlphaBeta(alpha_s=0.0, beta_s_per_byte=beta))
    st = pt.stage_times(M72, cluster, Layout(tp=4, pp=1, dp=1, microbatch=3, global_batch=3, recompute="none"))
    per_layer = (st.tp_forward_s + st.tp_backward_s) / 72
    where = "stage_times(72 layers, h=6144, t=4, p=1, b=3, recompute='none', α=0, 100 GB/s)"
    assert_close(per_layer, 8 * 3 * 2048 * 6144 * 3 / 4 * 2 * beta, rtol=1e-9,
                 what=f"{where}: TP seconds per layer (tp_forward_s + tp_backward_s) / 72, eq. 5")
    expect_equal(st.message_s, 0, what=f"{where}.message_s (no pipeline, no messages)")


@pytest.mark.task9_3
@pytest.mark.parametrize("p,m,v", [(4, 8, 1), (3, 6, 3)])
def test_task9_3_pipeline_makespan_equals_the_simulator(p, m, v):
    lay = Layout(tp=2, pp=p, dp=1, microbatch=1, global_batch=m, interleave=v)
    st = pt.stage_times(M72, A100, lay)
    schedule = one_f_one_b(p, m) if v == 1 else interleaved_1f1b(p, m, v)
    makespan = simulate(schedule, t_f=st.forward_action_s, t_b=st.backward_action_s).makespan
    t = pt.time_breakdown(M72, A100, lay)
    assert_close(t.compute_s + t.tp_comm_s + t.pp_comm_s + t.bubble_s, makespan, rtol=1e-6,
                 what=f"time_breakdown(72 layers, t=2, p={p}, m={m}, v={v}): compute + TP + PP + bubble "
                      f"against simulate's makespan of the schedule")


@pytest.mark.task9_3
def test_task9_3_table1_145b_within_7_percent():
    run = TABLE1[6]  # 145.6B, t = 8, p = 8, 1536 GPUs, batch 2304: 148 TFLOP/s per GPU
    lay = Layout(tp=8, pp=8, dp=24, microbatch=4, global_batch=2304, interleave=10, overlap_dp=False)
    seconds = pt.time_breakdown(run.model, A100, lay).iteration_s
    tflops = iteration_flops(run.model, 2304, recompute="full") / (seconds * 1536) / 1e12
    assert_close(tflops, run.tflops_per_gpu, rtol=0.07,
                 what="TFLOP/s per GPU of Table 1, row 7 (145.6B, t=8, p=8, d=24, b=4, v=10) from your time model")


@pytest.mark.task9_4
def test_task9_4_search_gpt3_on_1024_gpus():
    call = "search(GPT-3 175B, A100 80GB, 1024 GPUs, batch 1536, top=5)"
    best = ps.search(GPT3_175B, A100, 1024, 1536, top=5)
    expect_equal(len(best), 5, what=f"{call}: number of layouts returned")
    too_big = [p.layout.describe() for p in best if not p.fits]
    assert not too_big, f"{call} returned layouts that do not fit in memory: {too_big}"
    expect_equal([p.iteration_s for p in best], sorted(p.iteration_s for p in best),
                 what=f"{call}: iteration_s of the layouts, fastest first")
    assert best[0].layout.tp <= A100.gpus_per_node, (  # the paper's takeaway: TP inside a node
        f"{call}: the best layout {best[0].layout.describe()} has t = {best[0].layout.tp} > "
        f"{A100.gpus_per_node} GPUs per node (Narayanan et al. 2021 §3.3 keeps it inside a node)")
    layouts = ps.candidate_layouts(GPT3_175B, A100, 1024, 1536)
    invalid = [lay for lay in layouts if lay.gpus != 1024 or 96 % (lay.pp * lay.interleave)]
    assert not invalid, (f"candidate_layouts(GPT-3 175B, 1024 GPUs, batch 1536): {len(invalid)} layouts do not use "
                         f"1024 GPUs or do not split the 96 layers, e.g. {invalid[0]}")
    with pytest.raises(ValueError):  # 7 GPUs can't split batch 1536 or 96 layers
        ps.candidate_layouts(GPT3_175B, A100, 7, 1536)
