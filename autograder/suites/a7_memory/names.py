"""a7's names: the submitted files, the references they are graded against, and every check's name."""

LS, CF, RP = "loss_scaler.py", "checkpoint_function.py", "rotor_planner.py"
SRC = {LS: "lib/scaletrain/precision/scaler.py", CF: "lib/scaletrain/checkpointing/function.py",
       RP: "lib/scaletrain/checkpointing/planner.py"}
PROBE = "autograder.probes.a7_memory:"
NO_TRICKS = ("importlib", "__import__", "exec", "eval", "builtins", "inspect", "sys")

C_SCALE = "scale trajectory equals torch.amp.GradScaler's on hidden overflow patterns"
C_ODD = "float32 rounding of odd factors and growth past float32's range, as GradScaler"
C_SKIP = "fp16 training skips exactly the overflowed steps and backs off until it fits"
C_CK_PLAIN = "checkpoint: gradients equal plain backpropagation (several inputs, a float argument)"
C_CK_RNG = "checkpoint with dropout: gradients equal plain backpropagation (RNG state restored)"
C_CK_HELD = "checkpoint keeps nothing the block made after the forward, only its inputs"
C_CK_ONCE = "checkpoint runs the block once without grad in forward and once with grad in backward"
C_DP_FIT = "planner: every plan is complete and within its budget (hidden chains, roomy and tight budgets)"
C_DP_OPT = "planner: the plan is as fast as the optimum within the budget (hidden chains)"
C_DP_NONE = "planner: a budget below the lowest possible peak raises ValueError"
