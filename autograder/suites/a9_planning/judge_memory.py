"""a9 task 9.1's verdicts: the bytes a layer keeps, the pairs in flight, the memory per GPU, each
split by property so that a slip in one case costs that case's share."""

from __future__ import annotations

import dataclasses

from autograder import checks
from scaletrain.testing import assert_close

from .inputs import TRIALS, config, flight_case, plan, public_configs
from .judge_common import args, as_dict, fields_of, same_fields, shown
from .names import (C_FLIGHT_1F1B, C_FLIGHT_CAP, C_FLIGHT_GPIPE, C_FLIGHT_INTERLEAVED, C_FLIGHT_RANKS,
                    C_LAYER_FLASH_CP, C_LAYER_GPT, C_LAYER_LLAMA, C_MEM_ACT, C_MEM_BUFFERS, C_MEM_STATES,
                    C_PUBLISHED_MEM, PROBE)

PUBLIC_FLIGHT = {C_FLIGHT_1F1B: [(4, 8, 1, 0)], C_FLIGHT_GPIPE: [(4, 2, 1, 0)],
                 C_FLIGHT_INTERLEAVED: [(4, 8, 2, 0), (3, 6, 3, 0)], C_FLIGHT_CAP: [], C_FLIGHT_RANKS: []}
FLIGHT_KIND = {C_FLIGHT_1F1B: "1f1b", C_FLIGHT_GPIPE: "gpipe", C_FLIGHT_INTERLEAVED: "interleaved",
               C_FLIGHT_CAP: "cap", C_FLIGHT_RANKS: "ranks"}
MEMORY_FIELDS = {C_MEM_STATES: ("params", "grads", "optimizer"), C_MEM_ACT: ("activations",),
                 C_MEM_BUFFERS: ("buffers",)}


def _plain(seed: int, salt: int, llama: bool):
    """A configuration without flash attention or context parallelism."""
    model, cluster, layout = config(seed * 7 + salt, llama=llama)
    return model, cluster, dataclasses.replace(layout, flash_attention=False, cp=1)


def _layer_configs(check: str) -> list:
    seeds = checks.trial_seeds(TRIALS, salt=1)
    if check == C_LAYER_GPT:
        return public_configs("layer") + [_plain(s, 0, llama=False) for s in seeds]
    if check == C_LAYER_LLAMA:
        return [_plain(s, 1, llama=True) for s in seeds]
    out = []
    for i, s in enumerate(seeds):
        model, cluster, layout = config(s * 7 + 2)
        cps = [c for c in (2, 4) if model.seq % (2 * c) == 0]
        out.append((model, cluster, dataclasses.replace(layout, flash_attention=i % 3 != 1,
                                                        cp=cps[i % len(cps)] if cps and i % 3 else 1)))
    return out


def _ranks(layout) -> list[int]:
    """The first and the last pipeline rank, and the first full stage when the stages are uneven."""
    return sorted({0, layout.pp - 1} | ({1 % layout.pp} if layout.stages else set()))


def _schedule_peak(p: int, m: int, v: int, rank: int) -> int:
    from scaletrain.pipeline import gpipe, interleaved_1f1b, one_f_one_b, peak_in_flight
    schedule = interleaved_1f1b(p, m, v) if v > 1 else one_f_one_b(p, m) if m >= p else gpipe(p, m)
    return peak_in_flight(schedule[rank])


def group_memory(ctx):
    from scaletrain.plan import memory as ref

    mem = ctx.remote("plan_memory", probe=PROBE + "call")
    for check in (C_LAYER_GPT, C_LAYER_LLAMA, C_LAYER_FLASH_CP):
        with ctx.check(check):
            for model, _cluster, layout in _layer_configs(check):
                got = mem.layer_activation_bytes(model=as_dict(model), layout=as_dict(layout))
                assert_close(got, ref.layer_activation_bytes(model, layout), rtol=1e-9,
                             what=f"layer_activation_bytes({shown(model, layout)})")
    for check, kind in FLIGHT_KIND.items():
        with ctx.check(check):
            cases = PUBLIC_FLIGHT[check] + [flight_case(s, kind) for s in checks.trial_seeds(TRIALS // 2, salt=2)]
            for p, m, v, rank in cases:
                peak = _schedule_peak(p, m, v, rank)
                got = mem.in_flight_microbatches(pp=p, num_microbatches=m, interleave=v, rank=rank)
                assert got == peak, (f"in_flight_microbatches(pp={p}, num_microbatches={m}, interleave={v}, "
                                     f"rank={rank}) = {got!r}; rank {rank} of the schedule holds {peak} "
                                     f"(chunk, microbatch) pairs at its peak")
    configs = public_configs("memory") + [config(s) for s in checks.trial_seeds(TRIALS, salt=3)]
    for check, names in MEMORY_FIELDS.items():  # each field its own check: the calls run in each
        with ctx.check(check):
            for model, cluster, layout in configs:
                for rank in _ranks(layout):  # rank by rank: a wrong field does not move another's rank
                    same_fields(mem.memory_per_gpu(**args(model, cluster, layout), rank=rank),
                                ref.memory_per_gpu(model, cluster, layout, rank=rank),
                                f"memory_per_gpu({shown(model, layout)}, rank={rank})", names, rtol=1e-9)
    with ctx.check(C_PUBLISHED_MEM):
        _published_memory(mem, ref)


def _published_memory(mem, ref) -> None:
    ref_plan = plan()
    a100 = ref_plan.CLUSTERS["a100-80gb"]
    for run in ref_plan.TABLE1:
        layout = ref_plan.Layout(tp=run.tp, pp=run.pp, dp=run.dp, microbatch=1, global_batch=run.batch,
                                 overlap_dp=False)
        call = f"memory_per_gpu(Table 1 {run.params_b:g}B, {layout.describe()})"
        got = mem.memory_per_gpu(**args(run.model, a100, layout))
        same_fields(got, ref.memory_per_gpu(run.model, a100, layout), call, rtol=1e-9)
        total = sum(fields_of(got, "MemoryEstimate", call)[f]
                    for f in ("params", "grads", "optimizer", "activations", "buffers"))
        assert total < 80e9, f"{call}: {total / 1e9:.1f} GB, but the paper ran it on 80 GB A100s"
