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
    assert pm.in_flight_microbatches(pp=p, num_microbatches=m, interleave=v) == peak_in_flight(schedule[0])


@pytest.mark.task9_1
def test_task9_1_layer_activations_are_korthikanti():
    s, b, h, a, t = 2048, 2, 12288, 96, 8
    lay = Layout(tp=t, pp=8, dp=16, microbatch=b, global_batch=1536, recompute="none")
    assert pm.layer_activation_bytes(GPT3_175B, lay) == s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert pm.layer_activation_bytes(GPT3_175B, replace(lay, sequence_parallel=True)) == \
        s * b * h * (34 / t + 5 * a * s / (h * t))
    assert pm.layer_activation_bytes(GPT3_175B, replace(lay, recompute="selective")) == s * b * h * (10 + 24 / t)
    assert pm.layer_activation_bytes(GPT3_175B, replace(lay, recompute="full")) == 2 * s * b * h


@pytest.mark.task9_1
def test_task9_1_gpt3_on_rank_zero():
    mem = pm.memory_per_gpu(GPT3_175B, A100, Layout(tp=8, pp=8, dp=16, microbatch=1, global_batch=1536))
    # 12 layers and the embedding, 1/8 of each weight: 2.82 G parameters at 2 + 2 + 12 bytes
    assert (mem.params, mem.grads, mem.optimizer) == (5_645_463_552, 5_645_463_552, 33_872_781_312)
    # 8 microbatches in flight × 12 layer inputs of 2·s·h bytes, plus one layer recomputed whole
    assert mem.activations == 8 * 12 * 2 * 2048 * 12288 + 2048 * 12288 * (10 + 24 // 8 + 5 * 96 * 2048 // (12288 * 8))
    assert mem.total < 80e9


@pytest.mark.task9_2
def test_task9_2_tp_traffic_is_eq5():
    # seminar notes §1.2.5.1, eq. 5: 8·b·s·h·(t-1)/t elements per layer for one forward and backward
    beta = 1 / 100e9
    cluster = replace(A100, intra=AlphaBeta(alpha_s=0.0, beta_s_per_byte=beta))
    st = pt.stage_times(M72, cluster, Layout(tp=4, pp=1, dp=1, microbatch=3, global_batch=3, recompute="none"))
    per_layer = (st.tp_forward_s + st.tp_backward_s) / 72
    assert per_layer == pytest.approx(8 * 3 * 2048 * 6144 * 3 / 4 * 2 * beta, rel=1e-9)
    assert st.message_s == 0  # no pipeline, no messages


@pytest.mark.task9_3
@pytest.mark.parametrize("p,m,v", [(4, 8, 1), (3, 6, 3)])
def test_task9_3_pipeline_makespan_equals_the_simulator(p, m, v):
    lay = Layout(tp=2, pp=p, dp=1, microbatch=1, global_batch=m, interleave=v)
    st = pt.stage_times(M72, A100, lay)
    schedule = one_f_one_b(p, m) if v == 1 else interleaved_1f1b(p, m, v)
    makespan = simulate(schedule, t_f=st.forward_action_s, t_b=st.backward_action_s).makespan
    t = pt.time_breakdown(M72, A100, lay)
    assert t.compute_s + t.tp_comm_s + t.pp_comm_s + t.bubble_s == pytest.approx(makespan, rel=1e-6)


@pytest.mark.task9_3
def test_task9_3_table1_145b_within_7_percent():
    run = TABLE1[6]  # 145.6B, t = 8, p = 8, 1536 GPUs, batch 2304: 148 TFLOP/s per GPU
    lay = Layout(tp=8, pp=8, dp=24, microbatch=4, global_batch=2304, interleave=10, overlap_dp=False)
    seconds = pt.time_breakdown(run.model, A100, lay).iteration_s
    tflops = iteration_flops(run.model, 2304, recompute="full") / (seconds * 1536) / 1e12
    assert tflops == pytest.approx(run.tflops_per_gpu, rel=0.07)


@pytest.mark.task9_4
def test_task9_4_search_gpt3_on_1024_gpus():
    best = ps.search(GPT3_175B, A100, 1024, 1536, top=5)
    assert len(best) == 5 and all(p.fits for p in best)
    assert [p.iteration_s for p in best] == sorted(p.iteration_s for p in best)
    assert best[0].layout.tp <= A100.gpus_per_node  # the paper's takeaway: TP inside a node
    layouts = ps.candidate_layouts(GPT3_175B, A100, 1024, 1536)
    assert all(lay.gpus == 1024 and 96 % (lay.pp * lay.interleave) == 0 for lay in layouts)
    with pytest.raises(ValueError):
        ps.candidate_layouts(GPT3_175B, A100, 7, 1536)  # 7 GPUs can't split batch 1536 or 96 layers
