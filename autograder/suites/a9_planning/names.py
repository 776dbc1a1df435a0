"""a9's names: the submitted files, the library sources they are generated from, every check's name."""

MF, TF, SF = "plan_memory.py", "plan_time.py", "plan_search.py"
SOURCES = {MF: "lib/scaletrain/plan/memory.py", TF: "lib/scaletrain/plan/time_model.py",
           SF: "lib/scaletrain/plan/layouts.py"}
PROBE = "autograder.probes.a9_planning:"

# 9.1: the bytes one layer keeps, by model family and option
C_LAYER_GPT = "bytes one layer keeps, GPT-style: every recomputation, with and without SP (hidden shapes)"
C_LAYER_LLAMA = "bytes one layer keeps, Llama-style: grouped-query attention and SwiGLU"
C_LAYER_FLASH_CP = "bytes one layer keeps with flash attention and context parallelism"
# 9.1: pairs in flight, by phase of the schedule
C_FLIGHT_1F1B = "pairs in flight, 1F1B with m >= p: the warm-up depth on rank 0"
C_FLIGHT_GPIPE = "pairs in flight, m < p: every microbatch in flight (GPipe's fill)"
C_FLIGHT_INTERLEAVED = "pairs in flight, interleaved on rank 0: the longer warm-up"
C_FLIGHT_CAP = "pairs in flight, interleaved with v·m below the warm-up: capped by the work"
C_FLIGHT_RANKS = "pairs in flight on pipeline ranks past 0 (1F1B and interleaved)"
# 9.1: memory per GPU, by field
C_MEM_STATES = "memory per GPU: params, grads, optimizer (ZeRO 0-3 over d·c, uneven stages)"
C_MEM_ACT = "memory per GPU: activations (pairs in flight × chunk layers, the recomputed layer)"
C_MEM_BUFFERS = "memory per GPU: buffers (reserved, the last stage's logits, ZeRO-3's gathered layer)"
C_PUBLISHED_MEM = "every published Table 1 configuration fits in 80 GB by your memory model"
# 9.2: stage times, by field
C_STAGE_COMPUTE = "stage times: forward_s and backward_s (recompute, flash, the logit layer, uneven stages)"
C_STAGE_TP = "stage times: tp_forward_s and tp_backward_s (inside and across nodes)"
C_STAGE_MSG_CP = "stage times: message_s and the context-parallel ring (cp_forward_s, cp_backward_s)"
# 9.3: the iteration, by part
C_TIME_PIPE = "iteration: compute, TP, CP, PP and the bubble on held-out configurations"
C_TIME_DP = "iteration: data-parallel traffic and its overlap (ZeRO 0-3, d·c ranks)"
C_TIME_OPT = "iteration: the optimizer step"
C_SIM = "compute + TP + PP + bubble equals the simulated makespan of the schedule"
C_TABLE1 = "your time model reproduces Table 1 rows 1-7 within ±7% (Narayanan et al. 2021)"
# 9.4: the search, by property
C_CAND_DEGREES = "candidates: every (t, c, p, d) split, nothing invalid (hidden models, GPU counts)"
C_CAND_OPTIONS = "candidates: every microbatch, interleaving, ZeRO, recompute and SP option"
C_CAND_STAGES = "candidates: the uneven stage maps when uneven_stages is on"
C_CAND_SCALE = "candidates of 6144 and 12288 GPUs within the group's time"
C_SEARCH_FITS = "search never returns a layout that does not fit"
C_SEARCH_OPT = "search returns exactly the exhaustive search's ranking (time, then memory; top-k)"
# 9.5: where context parallelism pays
C_CP_PAYS = "the shortest length at which CP pays equals the exhaustive answer (hidden models, clusters)"
C_CP_NEVER = "None where CP never pays, and a tie is not a gain"
