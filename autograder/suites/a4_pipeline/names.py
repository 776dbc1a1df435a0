"""a4's names: the submitted files, the references they are generated from, the probe, the time
limits, and every check's name."""

S, V, E = "pp_schedules.py", "pp_validate.py", "pp_executor.py"
S_SRC, V_SRC, E_SRC = ("lib/scaletrain/pipeline/schedules.py", "lib/scaletrain/pipeline/validate.py",
                       "lib/scaletrain/pipeline/executor.py")
PROBE = "autograder.probes.a4_pipeline:"
CALL_LIMIT_S = 5.0     # one call of the student's generator or dry run
LOAD_LIMIT_S = 30.0    # starting the worker and importing the student's file (a loaded machine)
SPAWN_LIMIT_S = 40.0   # the executor's ranks, once started: a deadlock ends here
PREPARE_LIMIT_S = 60.0  # the executor's worker: importing torch, starting the ranks' fork server
EXECUTOR_GROUP_S = 150.0

# 4.1: 1F1B, one check per property (scaletrain.pipeline.schedule_rules)
C1_VALID = "1F1B is a valid schedule on hidden (p, m)"
C1_BUBBLE = "1F1B's simulated bubble is GPipe's, (p-1)/(m+p-1)"
C1_PEAK = "1F1B holds at most p-r microbatches in flight on rank r"
C1_WARMUP = "1F1B's warm-up fills rank r up to its bound"
C1_STEADY = "1F1B's steady state alternates one forward, one backward"
C1_COOLDOWN = "1F1B's cool-down drains what the warm-up put in flight"
C1_REJECT = "1F1B rejects m < p with a ValueError"
# 4.2: interleaved 1F1B
C2_VALID = "interleaved is a valid schedule on hidden (p, m, v)"
C2_BUBBLE = "interleaved's simulated bubble is (p-1)/(vm+p-1)"
C2_PEAK = "interleaved holds no more in flight than Megatron's warm-up bound"
C2_REJECT = "interleaved rejects m not a multiple of p with a ValueError"
# 4.3: the dry run
C3_ACCEPT = "dry run accepts every valid schedule"
C3_DETECT = "dry run rejects every hidden deadlock"
C3_REPORT = "dry run names the lowest stalled rank and its action"
C3_CHANNEL = "dry run enforces the order of messages on a channel"
# 4.4: the executor
C4_LOSSES = "forward: the m microbatch losses equal a single process"
C4_GPIPE = "GPipe: gradients equal a single process, run in its order (hidden transformer blocks)"
C4_1F1B = "1F1B and a hidden valid schedule: gradients equal a single process, run in their order"
C4_INTERLEAVED = "interleaved (6 stages on 3 ranks): gradients equal a single process, run in its order"
C4_ZB_H1 = "ZB-H1 (I/W split): gradients equal a single process, run in its order"
C4_MEMORY = "activations: never more alive than the schedule's peak, none held after the step"
ONE_F_ONE_B_CHECKS = (C1_VALID, C1_BUBBLE, C1_PEAK, C1_WARMUP, C1_STEADY, C1_COOLDOWN, C1_REJECT)
EXECUTOR_CHECKS = (C4_LOSSES, C4_GPIPE, C4_1F1B, C4_INTERLEAVED, C4_ZB_H1, C4_MEMORY)
