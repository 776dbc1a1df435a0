"""a8's names: the submitted files, the references they are graded against, the ranks and
tolerances, and every check's name."""

PS, OB, LB = "powersgd.py", "onebit.py", "lamb.py"
SRC = {PS: "lib/scaletrain/compression/powersgd.py", OB: "lib/scaletrain/compression/onebit.py",
       LB: "lib/scaletrain/compression/lamb.py"}
PROBE = "autograder.probes.a8_compression:"
P = 2                 # ranks: every property here holds at p = 2, the cheapest spawn
SPAWN_S = 60          # the probe's spawn limit (the group's own limit is above it)
RTOL = 1e-4           # float32 ranks against a float64 reference, a few steps deep
NO_TRICKS = ("importlib", "__import__", "exec", "eval", "builtins", "inspect", "sys")
COLLECTIVES = ("torch.distributed.all_reduce", "torch.distributed.all_gather", "torch.distributed.broadcast",
               "torch.distributed.all_gather_into_tensor", "torch.distributed.reduce_scatter",
               "torch.distributed.reduce_scatter_tensor", "torch.distributed.all_to_all")

C_PS_STEP = "PowerSGD step: P̂P̂ᵀ·mean M per matrix, exact mean for the rest (hidden shapes, ranks)"
C_PS_EF = "PowerSGD outputs over several steps: memory and warm-started Q per bucket"
C_PS_MEM = "PowerSGD error memory: its mean over the ranks is what the output lost"
C_PS_BIAS = "PowerSGD: accumulated bias stays bounded with error feedback (30 steps)"
C_PS_WIRE = "PowerSGD messages: uncompressed, all P's, all Q's; ring bytes as the formula"
C_OB_CODEC = "1-bit compress/decompress: packed signs, mean |x| per chunk (hidden sizes, chunks)"
C_OB_STEP = "1-bit step: the output is the mean of the ranks' C(g + e)"
C_OB_MEM = "1-bit step: the error memory is e = x − C(x)"
C_OB_BIAS = "1-bit: accumulated bias stays bounded with error feedback (30 steps)"
C_OB_WIRE = "1-bit bytes per rank: (p − 1)·4·(⌈n/32⌉ + chunks)"
C_LB_TRUST = "LAMB trust ratio ‖x‖/‖u‖ per layer (zero norms → 1, max_trust clamp)"
C_LB_STEP = "LAMB parameters after every step equal Algorithm 2 (weight decay, bias correction)"
C_LB_LAYER = "LAMB moves each layer by lr·‖x‖ where the trust ratio is not clamped"
PS_CHECKS, OB_CHECKS, LB_CHECKS = (C_PS_STEP, C_PS_EF, C_PS_MEM, C_PS_BIAS, C_PS_WIRE), \
    (C_OB_CODEC, C_OB_STEP, C_OB_MEM, C_OB_BIAS, C_OB_WIRE), (C_LB_TRUST, C_LB_STEP, C_LB_LAYER)
