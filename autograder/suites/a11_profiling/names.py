"""a11's names: the submitted files, the reference each is released from, and every check's name."""

CATEGORIES_F, COST, TABLES, PLD = "profile_categories.py", "profile_cost.py", "profile_tables.py", "profile_pld.py"
SOURCES = {CATEGORIES_F: "lib/scaletrain/profile/categories.py", COST: "lib/scaletrain/profile/cost.py",
           TABLES: "lib/scaletrain/profile/tables.py", PLD: "lib/scaletrain/profile/pld.py"}
PROBE = "autograder.probes.a11_profiling:"

C_CAT_FWD = "categories of the aten ops of real traces (CPU and GPU, hidden names)"
C_CAT_BWD = "categories of autograd nodes, bare and inside the engine's evaluate_function wrapper"
C_CAT_SYS = "categories of the optimizer's kernels and regions and of collectives (c10d, nccl, gloo)"
C_CAT_ONE = "every name, unknown ones included, gets exactly one category (a str of CATEGORIES)"
C_MM_FLOPS = "matmul FLOPs (mm, addmm, bmm, baddbmm) are 2 per multiply-add on hidden shapes"
C_MM_BYTES = "matmul bytes: every operand read once and the output written once, by dtype"
C_EW = "elementwise ops: bytes of inputs and output by dtype, 1-20 FLOPs per element, None without tensors"
C_NORM = "LayerNorm and softmax, forward and backward: row tensors' bytes, 1-20 FLOPs per element"
C_BREAKDOWN = "time by (phase, category) per step of hidden profiles"
C_MFU = "step time, model FLOPs 6NT and MFU of hidden profiles"
C_COUNTED = "the profile's counted FLOPs per step and their share of the peak"
C_THETA = "θ(t): 1 at t = 0, non-increasing, the paper's decay towards θ̄ at rate γ"
C_KEEP = "p_i(t): non-increasing in depth, the deepest at θ(t), linear steps, expected kept layers"
C_GATES = ("gates: each layer kept with frequency p_i (binomial bound), layers independent, a list of bools, "
           "drawn from the generator given (same seed, same gates)")
C_IDENTITY = ("a dropped block is exactly the identity; every block kept with p = 1 is the model; the model is "
              "left as it was")
C_SCALED = "a kept block's branches scaled by 1/p_i (hidden gates and probabilities)"
C_DROP_FREE = ("a dropped block runs nothing: no op reads its parameters, forward or backward, and they get no "
               "gradient; a kept block's do")
