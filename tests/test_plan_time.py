"""The time model against independent references: the pipeline simulator run on the generated
schedule (module 4), the seminar's eq. 5 for TP traffic, the α–β ring of module 2."""

from dataclasses import replace

import pytest

from scaletrain.comm.cost_model import AlphaBeta, predict as ring_seconds
from scaletrain.pipeline import interleaved_1f1b, one_f_one_b, simulate
from scaletrain.plan import CLUSTERS, Layout, ModelSpec, stage_times, time_breakdown
from scaletrain.plan.memory import params_on_first_rank
from scaletrain.plan.published import GPT3_175B
from scaletrain.plan.time_model import OPTIMIZER_BYTES_PER_PARAM

A100 = CLUSTERS["a100-80gb"]
M72 = ModelSpec(layers=72, hidden=6144, heads=48, seq=2048, vocab=51200)


@pytest.mark.parametrize("p,m,v", [(2, 2, 1), (4, 8, 1), (3, 7, 1), (4, 8, 2), (3, 6, 3), (6, 12, 2)])
def test_pipeline_makespan_equals_the_simulator(p, m, v):
    lay = Layout(tp=2, pp=p, dp=1, microbatch=1, global_batch=m, interleave=v)
    st = stage_times(M72, A100, lay)
    schedule = one_f_one_b(p, m) if v == 1 else interleaved_1f1b(p, m, v)
    sim = simulate(schedule, t_f=st.forward_action_s, t_b=st.backward_action_s)
    t = time_breakdown(M72, A100, lay)
    assert t.compute_s + t.tp_comm_s + t.pp_comm_s + t.bubble_s == pytest.approx(sim.makespan, rel=1e-9)
    busy = m * v * (st.forward_action_s + st.backward_action_s)
    assert t.bubble_s == pytest.approx(sim.makespan - busy, rel=1e-9)


def test_no_pipeline_no_bubble_no_messages():
    t = time_breakdown(M72, A100, Layout(tp=8, pp=1, dp=4, microbatch=2, global_batch=64))
    assert t.bubble_s == 0 and t.pp_comm_s == 0 and t.compute_s > 0


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tp_traffic_is_the_seminars_eq5(t):
    # eq. 5: 8·b·s·h·(t-1)/t elements per layer for a forward and a backward; at 2 bytes and
    # α = 0 that is time · bandwidth
    beta = 1 / 100e9
    cluster = replace(A100, intra=AlphaBeta(alpha_s=0.0, beta_s_per_byte=beta))
    lay = Layout(tp=t, pp=1, dp=1, microbatch=3, global_batch=3, recompute="none")
    st = stage_times(M72, cluster, lay)
    per_layer = (st.tp_forward_s + st.tp_backward_s) / M72.layers
    assert per_layer == pytest.approx(8 * 3 * 2048 * 6144 * (t - 1) / t * 2 * beta, rel=1e-12)
    # full recomputation redoes the forward's two allreduces
    full = stage_times(M72, cluster, replace(lay, recompute="full"))
    assert full.tp_backward_s == pytest.approx(2 * full.tp_forward_s, rel=1e-12)


def test_tp_beyond_a_node_runs_on_infiniband():
    inside = stage_times(GPT3_175B, A100, Layout(tp=8, pp=1, dp=1, microbatch=1, global_batch=1))
    across = stage_times(GPT3_175B, A100, Layout(tp=16, pp=1, dp=1, microbatch=1, global_batch=1))
    link = A100.inter
    want = 2 * 96 * ring_seconds(link, "ring", 16, 2 * 2048 * 12288)
    assert across.tp_forward_s == pytest.approx(want, rel=1e-12)
    assert across.tp_forward_s > 5 * inside.tp_forward_s


def test_dp_reduction_and_its_overlap():
    lay = Layout(tp=8, pp=4, dp=8, microbatch=1, global_batch=256, overlap_dp=False)
    t = time_breakdown(M72, A100, lay)
    psi = params_on_first_rank(M72, lay)
    assert t.dp_comm_s == pytest.approx(ring_seconds(A100.inter, "ring", 8, 2 * psi), rel=1e-12)
    assert t.dp_overlap_s == 0
    hidden = time_breakdown(M72, A100, replace(lay, overlap_dp=True))
    window = stage_times(M72, A100, lay).backward_s
    assert hidden.dp_overlap_s == pytest.approx(min(t.dp_comm_s, window))
    assert hidden.iteration_s < t.iteration_s
    # ZeRO-3 gathers the weights for every microbatch: far more traffic than one allreduce
    z3 = time_breakdown(M72, A100, replace(lay, zero=3))
    assert z3.dp_comm_s > 10 * t.dp_comm_s


def test_optimizer_step_reads_and_writes_what_the_rank_owns():
    lay = Layout(tp=8, pp=4, dp=8, microbatch=1, global_batch=256)
    psi = params_on_first_rank(M72, lay)
    t0 = time_breakdown(M72, A100, lay)
    assert t0.optimizer_s == pytest.approx(OPTIMIZER_BYTES_PER_PARAM * psi / A100.hbm_bandwidth)
    t1 = time_breakdown(M72, A100, replace(lay, zero=1))
    assert t1.optimizer_s == pytest.approx(t0.optimizer_s / 8, rel=1e-6)


def test_iteration_is_the_sum_of_its_parts():
    t = time_breakdown(GPT3_175B, A100, Layout(tp=8, pp=8, dp=16, microbatch=2, global_batch=1536, interleave=2))
    parts = t.compute_s + t.tp_comm_s + t.pp_comm_s + t.bubble_s + t.dp_comm_s - t.dp_overlap_s + t.optimizer_s
    assert t.iteration_s == pytest.approx(parts)
    assert 0 <= t.dp_overlap_s <= t.dp_comm_s
