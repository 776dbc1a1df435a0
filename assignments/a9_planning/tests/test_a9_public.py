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
from scaletrain.plan.prediction import predict
from scaletrain.plan.specs import Layout, ModelSpec
from scaletrain.testing import assert_close, expect_equal

pm = student_module("plan_memory", default=__file__)
pt = student_module("plan_time", default=__file__)
ps = student_module("plan_search", default=__file__)
A100 = CLUSTERS["a100-80gb"]
M72 = ModelSpec(layers=72, hidden=6144, heads=48, seq=2048, vocab=51200)


@pytest.mark.task9_1
@pytest.mark.parametrize("phase,p,m,v,rank", [
    ("1F1B warm-up", 4, 8, 1, 0), ("GPipe fill, m < p", 4, 2, 1, 0), ("interleaved warm-up", 4, 8, 2, 0),
    ("interleaved warm-up", 3, 6, 3, 0), ("interleaved, v·m below the warm-up", 4, 4, 3, 0),
    ("a rank past 0, 1F1B", 4, 8, 1, 2), ("a rank past 0, interleaved", 4, 8, 2, 3)])
def test_task9_1_in_flight_equals_the_schedule(phase, p, m, v, rank):
    """One case per check of the grader (each phase is graded on its own)."""
    from scaletrain.pipeline import gpipe
    schedule = interleaved_1f1b(p, m, v) if v > 1 else one_f_one_b(p, m) if m >= p else gpipe(p, m)
    expect_equal(pm.in_flight_microbatches(pp=p, num_microbatches=m, interleave=v, rank=rank),
                 peak_in_flight(schedule[rank]),
                 what=f"{phase}: in_flight_microbatches(pp={p}, num_microbatches={m}, interleave={v}, rank={rank}) "
                      f"against the schedule's own peak on rank {rank}")


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
def test_task9_1_layer_activations_llama_flash_cp():
    """Properties the Llama-style, flash-attention and context-parallel checks grade: fewer K/V
    heads keep fewer bytes; flash attention keeps none of the s² scores (as selective
    recomputation); c context-parallel ranks each keep 1/c."""
    llama = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, gated_ffn=True,
                      tied_embeddings=False, biases=False, learned_positions=False, seq=8192, vocab=128256)
    lay = Layout(tp=4, pp=1, dp=1, microbatch=1, global_batch=1, recompute="none")
    where = "layer_activation_bytes(Llama-3-8B, t=4, b=1"
    gqa, mha = pm.layer_activation_bytes(llama, lay), pm.layer_activation_bytes(replace(llama, kv_heads=None), lay)
    assert gqa < mha, f"{where}): {gqa:,} B with 8 K/V heads, {mha:,} B with 32: GQA keeps K and V 4× narrower"
    flash = pm.layer_activation_bytes(llama, replace(lay, flash_attention=True))
    expect_equal(flash, pm.layer_activation_bytes(llama, replace(lay, recompute="selective")),
                 what=f"{where}, flash attention) against recompute='selective': neither keeps the s² scores")
    for c in (2, 4):
        expect_equal(pm.layer_activation_bytes(llama, replace(lay, flash_attention=True, cp=c)), flash // c,
                     what=f"{where}, flash attention, cp={c}): each rank keeps 1/{c} of the tokens")


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


def _brute_force(model, gpus, batch, **space):
    """Every layout of `gpus` GPUs, by trying every t, c, p, d up to gpus (slow, independent)."""
    from itertools import product
    from scaletrain.plan.specs import check_layout
    found = set()
    for tp, cp, pp in product(range(1, gpus + 1), space.get("cps", (1,)), range(1, gpus + 1)):
        if gpus % (tp * cp * pp):
            continue
        for b, v in product(space.get("microbatches", (1, 2, 4, 8, 16)), range(1, model.layers + 1)):
            try:
                lay = Layout(tp=tp, cp=cp, pp=pp, dp=gpus // tp // cp // pp, microbatch=b, global_batch=batch,
                             interleave=v)
                check_layout(model, lay, gpus=gpus)
            except ValueError:
                continue
            found.add(lay)
    return found


@pytest.mark.task9_4
@pytest.mark.parametrize("gpus,batch,cps", [(12, 24, (1,)), (16, 32, (1, 2, 4))])
def test_task9_4_candidates_are_every_valid_split(gpus, batch, cps):
    model = ModelSpec(layers=12, hidden=768, heads=12, seq=1024, vocab=50304)
    call = f"candidate_layouts(12 layers, 12 heads, gpus={gpus}, global_batch={batch}, cps={cps})"
    got = ps.candidate_layouts(model, A100, gpus, batch, cps=cps)
    want = _brute_force(model, gpus, batch, cps=cps)
    expect_equal(len(got), len(set(got)), what=f"{call}: layouts listed (each once)")
    missing, extra = want - set(got), set(got) - want
    assert not missing and not extra, (f"{call}: {len(missing)} valid layouts missing (e.g. "
                                       f"{next(iter(missing)).describe() if missing else None}), {len(extra)} that "
                                       f"can't run (e.g. {next(iter(extra)).describe() if extra else None})")
    with pytest.raises(ValueError):  # 7 GPUs can't split batch 1536 or 96 layers
        ps.candidate_layouts(GPT3_175B, A100, 7, 1536)


@pytest.mark.task9_4
def test_task9_4_candidates_uneven_stages_and_scale():
    import time
    from scaletrain.plan.stages import stage_options
    model = ModelSpec(layers=14, hidden=768, heads=12, seq=1024, vocab=50304)
    got = ps.candidate_layouts(model, A100, 16, 64, microbatches=(1,), uneven_stages=True)
    maps = {(lay.pp, lay.stages) for lay in got if lay.stages is not None}
    want = {(p, m) for p in (2, 4, 8, 16) for m in stage_options(model, p) if m is not None}
    expect_equal(maps, want, what="candidate_layouts(14 layers, 16 GPUs, uneven_stages=True): the (p, stage map) "
                                  "pairs with uneven stages, against stages.stage_options")
    start = time.perf_counter()
    n = len(ps.candidate_layouts(GPT3_175B, A100, 6144, 6144))
    seconds = time.perf_counter() - start
    assert seconds < 20, f"candidate_layouts(GPT-3 175B, 6144 GPUs) took {seconds:.0f} s for {n} layouts (< 20 s)"


@pytest.mark.task9_4
def test_task9_4_search_gpt3_on_1024_gpus():
    call = "search(GPT-3 175B, A100 80GB, 1024 GPUs, batch 1536, top=5)"
    best = ps.search(GPT3_175B, A100, 1024, 1536, top=5)
    expect_equal(len(best), 5, what=f"{call}: number of layouts returned")
    too_big = [p.layout.describe() for p in best if not p.fits]
    assert not too_big, f"{call} returned layouts that do not fit in memory: {too_big}"
    preds = [predict(GPT3_175B, A100, lay) for lay in ps.candidate_layouts(GPT3_175B, A100, 1024, 1536)]
    exhaustive = sorted((p for p in preds if p.fits), key=lambda p: (p.iteration_s, p.memory_per_gpu_bytes))[:5]
    expect_equal([(p.iteration_s, p.memory_per_gpu_bytes) for p in best],
                 [(p.iteration_s, p.memory_per_gpu_bytes) for p in exhaustive],
                 what=f"{call}: (iteration_s, memory) of the layouts against an exhaustive ranking of every candidate")
    assert best[0].layout.tp <= A100.gpus_per_node, (  # the paper's takeaway: TP inside a node
        f"{call}: the best layout {best[0].layout.describe()} has t = {best[0].layout.tp} > "
        f"{A100.gpus_per_node} GPUs per node (Narayanan et al. 2021 §3.3 keeps it inside a node)")


@pytest.mark.task9_5
def test_task9_5_context_parallelism_pays_for_long_sequences_only():
    from scaletrain.plan.software import SOFTWARE
    llama = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, gated_ffn=True,
                      tied_embeddings=False, biases=False, learned_positions=False, seq=8192, vocab=128256)
    h100, seqs, tokens = CLUSTERS["h100"], [2048, 8192, 32768, 131072], 2 ** 20
    space = SOFTWARE["megatron-2024"].space()
    space.pop("cps")
    call = f"context_parallel_break_even(Llama-3-8B, H100, 64 GPUs, {tokens} tokens, seqs={seqs}, cps=(2, 4, 8))"
    got = ps.context_parallel_break_even(llama, h100, 64, tokens, seqs, cps=(2, 4, 8), microbatches=(1,), **space)
    assert got in seqs, f"{call} = {got!r}: at 128K tokens context parallelism pays on this planner"

    def best(s, cps):
        return ps.search(replace(llama, seq=s), h100, 64, tokens // s, top=1, cps=cps, microbatches=(1,),
                         **space)[0].iteration_s
    for s in seqs:
        pays = best(s, (2, 4, 8)) < best(s, (1,))
        expect_equal(pays, s >= got, what=f"{call} = {got}: does CP pay at s = {s} (strictly faster than c = 1)?")
    expect_equal(ps.context_parallel_break_even(llama, h100, 64, tokens, [2048], cps=(2,), microbatches=(1,), **space),
                 None, what="context_parallel_break_even at 2048 tokens only: CP never pays there")
