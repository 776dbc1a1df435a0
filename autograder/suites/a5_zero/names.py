"""a5's names: the submitted files, the ranks and time limits, what is forbidden, and every
check's name."""

ZF = "zero_engine.py"
ZF3 = "zero_stage3.py"  # task 5.4: stage 3's coordinator, in its own file
STEM = "zero_engine"
PROBE = "autograder.probes.a5_zero:"
P = 2                # ranks per spawn; a subgroup of rank 0 gives N = 1
PG_TIMEOUT_S = 10.0  # a collective that waits longer than this is a deadlock
SPAWN_TIMEOUT_S = 200
TORCH_COLLECTIVES = ("torch.distributed.all_reduce", "torch.distributed.all_gather",
                     "torch.distributed.all_gather_into_tensor", "torch.distributed.reduce_scatter",
                     "torch.distributed.reduce_scatter_tensor", "torch.distributed.broadcast")

FORBIDDEN = ("torch.distributed.optim", "torch.distributed.fsdp", "torch.distributed._composable",
             "torch.distributed.tensor", "torch.nn.parallel", *TORCH_COLLECTIVES,
             "scaletrain.zero.engine", "scaletrain.zero.ZeRO", "scaletrain.zero.shard_of",
             "scaletrain.zero.unshard", "importlib", "__import__", "exec", "eval")

C_SHARD = "shard_of is a view of elements [r·m, (r+1)·m) of the padded buffer"
C_UNSHARD = "unshard fills every chunk from its owner (N = 1, 2; fewer elements than ranks)"
C_S1_EQ = "stage 1 equals one process (AdamW, SGD momentum; hidden models; N = 1, 2)"
C_S1_HELD = "stage 1 holds 8Ψ' + 8Ψ'/N bytes after each step (optimizer state sharded)"
C_S1_SENT = "stage 1 sends 2Ψ'(N-1)/N elements per step"
C_S2_EQ = "stage 2 equals one process (several buckets; hidden models; N = 1, 2)"
C_S2_HELD = "stage 2 keeps only gradient shards: 4Ψ' + 12Ψ'/N bytes after each step"
C_S2_SENT = "stage 2 sends 2Ψ'(N-1)/N elements per step"
C_S2_EARLY = "stage 2 reduce-scatters every bucket during backward and frees full gradients"
C_S3_EQ = "stage 3 equals one process (hidden models; N = 1, 2)"
C_S3_HELD = "stage 3 holds 16Ψ'/N bytes after each step"
C_S3_GATHER = "stage 3 gathers one block at a time in forward and frees every unit after backward"
C_S3_COMM = "stage 3 sends 3Ψ'(N-1)/N elements per step"
