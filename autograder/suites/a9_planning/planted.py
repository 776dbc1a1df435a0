"""a9's planted submissions: each a small edit of the solution and the outcome it must get. The
slips are sized to the split checks: one wrong phase of the in-flight count, one field of a
stage time, one property of the search costs that check, not the task."""

from __future__ import annotations

from autograder.attacks import function_attacks
from autograder.manifest import REPO, Planted

from .names import (C_CAND_DEGREES, C_CAND_OPTIONS, C_CAND_SCALE, C_CAND_STAGES, C_CP_NEVER, C_CP_PAYS,
                    C_FLIGHT_1F1B, C_FLIGHT_CAP, C_FLIGHT_GPIPE, C_FLIGHT_INTERLEAVED, C_FLIGHT_RANKS, C_LAYER_GPT,
                    C_LAYER_LLAMA, C_MEM_ACT, C_MEM_BUFFERS, C_MEM_STATES, C_PUBLISHED_MEM, C_SEARCH_FITS,
                    C_SEARCH_OPT, C_SIM, C_STAGE_COMPUTE, C_STAGE_MSG_CP, C_STAGE_TP, C_TABLE1, C_TIME_DP,
                    C_TIME_OPT, C_TIME_PIPE, MF, SF, SOURCES, TF)

_INTERLEAVED = "    return min(2 * (p - 1 - r) + (v - 1) * p + 1, v * m)"
_ONE_F_ONE_B = "        return m if m < p else p - r\n"


def _attacks() -> tuple[Planted, ...]:
    """Attacks on the grader itself (autograder/attacks.py), each in place of the interleaved branch
    of `in_flight_microbatches`: under the trusted split they earn nothing."""
    call = "in_flight_microbatches(pp=pp, num_microbatches=num_microbatches, interleave=interleave, rank=rank)"
    attacks = function_attacks(checks=[C_FLIGHT_INTERLEAVED, C_FLIGHT_CAP, C_MEM_ACT], module="scaletrain.plan.memory",
                               source=str(REPO / SOURCES[MF]), call=call, keys=("want", "expected", "ref", "peak"))
    return tuple(Planted(name, MF, (_INTERLEAVED, body), groups=("memory",),
                         expect={C_FLIGHT_INTERLEAVED: outcome, C_FLIGHT_CAP: outcome, C_FLIGHT_1F1B: "passed",
                                 C_LAYER_GPT: "passed"})
                 for name, (body, outcome) in attacks.items())


_TABLE1_LOOKUP = (
    "    from scaletrain.plan.flops import iteration_flops\n"
    "    from scaletrain.plan.published import TABLE1\n"
    "    for run in TABLE1:\n"
    "        if run.model == model and run.gpus == layout.gpus:  # the paper's row: its measured TFLOP/s\n"
    "            flops = iteration_flops(model, layout.global_batch, recompute=layout.recompute)\n"
    "            return TimeBreakdown(compute_s=flops / (run.tflops_per_gpu * 1e12 * run.gpus), tp_comm_s=0.0,\n"
    "                                 pp_comm_s=0.0, bubble_s=0.0, dp_comm_s=0.0, dp_overlap_s=0.0, optimizer_s=0.0)\n"
    "    raise NotImplementedError('a9 task 9.3')\n")
_STAGE_ANCHOR = "    layer, core = layer_forward_flops(model, b), attention_core_forward_flops(model, b)\n"

_MEMORY = (
    Planted("activations of one microbatch instead of the ones in flight", MF,
            ("    activations = pairs * layers_per_chunk * layer_activation_bytes(model, layout)\n",
             "    activations = layers_per_chunk * layer_activation_bytes(model, layout)\n"), groups=("memory",),
            expect={C_MEM_ACT: "failed", C_PUBLISHED_MEM: "failed", C_MEM_STATES: "passed", C_MEM_BUFFERS: "passed",
                    C_FLIGHT_1F1B: "passed", C_LAYER_GPT: "passed"}),
    Planted("in-flight pairs: p - r even when m < p (GPipe's fill forgotten)", MF,
            (_ONE_F_ONE_B, "        return p - r\n"), groups=("memory",),
            expect={C_FLIGHT_GPIPE: "failed", C_FLIGHT_1F1B: "passed", C_FLIGHT_INTERLEAVED: "passed",
                    C_FLIGHT_CAP: "passed", C_LAYER_GPT: "passed"}),
    Planted("in-flight pairs: the interleaved warm-up one too long (+1)", MF,
            (_INTERLEAVED, "    return min(2 * (p - 1 - r) + (v - 1) * p + 2, v * m)"), groups=("memory",),
            expect={C_FLIGHT_INTERLEAVED: "failed", C_FLIGHT_1F1B: "passed", C_FLIGHT_GPIPE: "passed",
                    C_FLIGHT_CAP: "passed"}),
    Planted("in-flight pairs: every rank counted as rank 0 under 1F1B", MF,
            (_ONE_F_ONE_B, "        return m if m < p else p\n"), groups=("memory",),
            expect={C_FLIGHT_RANKS: "failed", C_FLIGHT_1F1B: "passed", C_FLIGHT_GPIPE: "passed",
                    C_FLIGHT_INTERLEAVED: "passed"}),
    Planted("K and V as wide as Q (grouped-query attention ignored)", MF,
            ("    split = 4 * tokens * h + 4 * tokens * model.kv_hidden + mlp",
             "    split = 4 * tokens * h + 4 * tokens * h + mlp"), groups=("memory",),
            expect={C_LAYER_LLAMA: "failed", C_LAYER_GPT: "passed", C_FLIGHT_1F1B: "passed"}),
    Planted("imports torch in the memory model", MF,
            ("from dataclasses import dataclass, replace", "from dataclasses import dataclass, replace\nimport torch"),
            groups=("memory",), expect={C_LAYER_GPT: "flagged", C_MEM_STATES: "flagged"}),
)

_TIME = (
    Planted("bubble ignored (throughput too high)", TF,
            ("    bubble = (compute + tp_comm + cp_comm + pp_comm) * f / (1 - f)\n", "    bubble = 0.0\n"),
            groups=("time",), expect={C_TIME_PIPE: "failed", C_SIM: "failed", C_TIME_DP: "passed", C_TIME_OPT: "passed",
                                      C_STAGE_COMPUTE: "passed"}),
    Planted("tensor-parallel allreduces never leave NVLink", TF,
            ("    tp_link = _link(cluster, layout.tp_crosses_node(cluster))\n", "    tp_link = cluster.intra\n"),
            groups=("time",), expect={C_STAGE_TP: "failed", C_STAGE_COMPUTE: "passed", C_STAGE_MSG_CP: "passed",
                                      C_TIME_PIPE: "passed", C_TABLE1: "failed"}),
    Planted("flash attention's backward does not redo Q·Kᵀ", TF,
            ('    if layout.flash_attention and layout.recompute != "selective":\n        recompute += core / 2\n', ""),
            groups=("time",), expect={C_STAGE_COMPUTE: "failed", C_STAGE_TP: "passed", C_STAGE_MSG_CP: "passed"}),
    Planted("the context-parallel ring never hides behind attention", TF,
            ("    hidden = core_s if layout.overlap_cp else 0.0\n", "    hidden = 0.0\n"), groups=("time",),
            expect={C_STAGE_MSG_CP: "failed", C_STAGE_COMPUTE: "passed", C_STAGE_TP: "passed"}),
    Planted("time_breakdown looks up Table 1's TFLOP/s; no model for anything else", TF,
            ("    st = stage_times(model, cluster, layout)\n    p, m, v, d = ",
             _TABLE1_LOOKUP + "    st = stage_times(model, cluster, layout)\n    p, m, v, d = "),
            groups=("time",), expect={C_TABLE1: "failed", C_TIME_PIPE: "failed", C_STAGE_COMPUTE: "passed"}),
    Planted("os._exit in stage_times", TF, (_STAGE_ANCHOR, "    import os; os._exit(3)\n"), groups=("time",),
            expect={C_STAGE_COMPUTE: "error", C_TIME_PIPE: "passed", C_SIM: "passed", C_TABLE1: "error"}),
)

_SEARCH = (
    Planted("search ranks by TFLOP/s per GPU (recompute counted as useful work)", SF,
            ("fitting.sort(key=lambda pred: (pred.iteration_s, pred.memory_per_gpu_bytes))",
             "fitting.sort(key=lambda pred: -pred.tflops_per_gpu)"), groups=("search",),
            expect={C_SEARCH_OPT: "failed", C_SEARCH_FITS: "passed", C_CAND_OPTIONS: "passed"}),
    Planted("search keeps layouts that do not fit", SF,
            ("for layout in layouts) if pred.fits]", "for layout in layouts)]"), groups=("search",),
            expect={C_SEARCH_FITS: "failed", C_CAND_OPTIONS: "passed", C_CAND_DEGREES: "passed"}),
    Planted("uneven stage maps never generated", SF,
            ("                for stages in (stage_options(model, pp) if uneven_stages else [None]):",
             "                for stages in [None]:"), groups=("search",),
            expect={C_CAND_STAGES: "failed", C_CAND_DEGREES: "passed", C_CAND_OPTIONS: "passed"}),
    # quadratic, as a product over the degrees grows: 6144 GPUs sleep 24 s, past judge_search.SCALE_SECONDS
    # (20) on the first model (one wait, not two); the public search's 1024 GPUs, 0.7 s
    Planted("enumeration whose time grows with the GPU count (a sleep standing in for a product over all t, p, d)",
            SF, ("    switches = dict(", "    import time\n    time.sleep(24 * (gpus / 6144) ** 2)\n    switches = dict("),
            groups=("search",), expect={C_CAND_SCALE: "failed", C_CAND_DEGREES: "passed", C_SEARCH_OPT: "passed"}),
    Planted("infinite loop in candidate_layouts", SF,
            ("                dp = gpus // (tp * cp * pp)\n",
             "                dp = gpus // (tp * cp * pp)\n                while True:\n                    pass\n"),
            groups=("search",), timeout_s=12, expect={C_CAND_DEGREES: "timeout", C_SEARCH_OPT: "timeout"}),
    Planted("syntax error in the search", SF, ("def search(", "def search(,"),
            expect={C_CAND_DEGREES: "error", C_SEARCH_OPT: "error", C_CP_PAYS: "error", C_LAYER_GPT: "passed",
                    C_STAGE_COMPUTE: "passed"}),
)

_CONTEXT = (
    Planted("context parallelism 'pays' on a tie", SF,
            ("(flat is None or split.iteration_s < flat.iteration_s)",
             "(flat is None or split.iteration_s <= flat.iteration_s)"), groups=("context",),
            expect={C_CP_NEVER: "failed"}),
    Planted("the longest length at which CP pays, not the shortest", SF,
            ("    for s in seqs:\n        shaped = replace(model, seq=s)",
             "    for s in reversed(seqs):\n        shaped = replace(model, seq=s)"), groups=("context",),
            expect={C_CP_PAYS: "failed", C_CP_NEVER: "passed"}),
)

PLANTED = (*_MEMORY, *_attacks(), *_TIME, *_SEARCH, *_CONTEXT)
