"""a2's names: the submitted file, its source, the probe, the limits, the forbidden names and every
check's name (no check name is written anywhere else)."""

RING = "ring.py"
SRC = "lib/scaletrain/comm/ring.py"
PROBE = "autograder.probes.a2_collectives:"
GROUP_TIMEOUT_S = 5     # autograder/probes/a2_collectives.py: a p2p wait longer than this is a deadlock
DTYPES = ("float32", "float16", "bfloat16", "int64")
PUBLIC_SIZES = (0, 1, 2, 3, 4, 10, 1001)  # assignments/a2_collectives/tests: every one runs here too (issue 27)
SPEED_MIB, SPEED_P = 16, 2
RS_SPEED_MAX = 1.0      # gloo's reduce-scatter is a full allreduce: a ring of p-1 steps must beat it
AR_SPEED_MAX = 1.5      # a ring with fresh buffers and no pipelining measures 1.5-4.4x (ANCHORS.md)
NCCL_SPEED_MAX = 1.5
SPEED_PAIRS = 7         # timed batches per side, alternating; the verdict is the median of their ratios
SPEED_ROUNDS = 3        # a round whose p20-p80 band spans the limit is inconclusive and measured again
SPEED_REPS = 3          # calls per timed batch
SAMPLES = 64            # positions of each timed result that are checked
CHECK_SAMPLES = 4096    # positions of the timing input's results that are checked (and every chunk's ends)

_COLLECTIVES = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
                "_reduce_scatter_base", "all_gather", "all_gather_into_tensor", "all_gather_single",
                "_all_gather_base", "all_gather_coalesced", "all_gather_object", "broadcast", "broadcast_object_list",
                "all_to_all", "all_to_all_single", "scatter", "gather", "batch_isend_irecv", "all_reduce_coalesced")
FORBIDDEN_CALLS = tuple(f"torch.distributed.{name}" for name in _COLLECTIVES)
FORBIDDEN = FORBIDDEN_CALLS + ("torch.distributed.distributed_c10d", "torch.distributed._functional_collectives",
                               "torch.distributed.nn", "torch.distributed.device_mesh", "scaletrain.comm.ring",
                               "scaletrain.comm.naive", "scaletrain.comm.ring_allreduce",
                               "scaletrain.comm.ring_reduce_scatter", "scaletrain.comm.ring_all_gather",
                               "importlib", "__import__", "exec", "eval")


# correctness, split by property: p divides n or not, p = 3 / 2 (a subgroup) / 4, values / bytes
C_RS_EVEN = "reduce-scatter equals the single-process sum, p=3, p divides n (hidden sizes, 4 dtypes)"
C_RS = "reduce-scatter equals the single-process sum, p=3, p does not divide n (padding, n < p, n = 0)"
C_RS2 = "reduce-scatter on a 2-rank subgroup {0, 2} (neighbours are global ranks)"
C_RS4 = "reduce-scatter equals the single-process sum, p=4"
C_AG_EVEN = "all-gather reassembles every shard, p=3, p divides n (hidden sizes, 4 dtypes)"
C_AG = "all-gather reassembles every shard, p=3, p does not divide n"
C_AG2 = "all-gather on a 2-rank subgroup {0, 2}"
C_AG4 = "all-gather reassembles every shard, p=4"
C_AR_EVEN = "allreduce in place, sum and avg, p=3, p divides n"
C_AR = "allreduce in place, sum and avg, p=3, p does not divide n"
C_AR_VIEWS = "allreduce writes non-contiguous tensors in place: a strided view, a transposed matrix"
C_AR2 = "allreduce on a 2-rank subgroup {0, 2}"
C_AR4 = "allreduce in place, sum and avg, p=4"
C_BYTES_EVEN = "allreduce bytes per rank exactly 2(p-1)/p·n·itemsize when p divides n, recorded as 2(p-1) messages"
C_BYTES = ("allreduce bytes per rank within 2(p-1)·floor(n/p) .. 2(p-1)·ceil(n/p) items when p does not divide n, "
           "recorded as sent")
C_RS_SPEED = f"reduce-scatter faster than gloo's (p={SPEED_P}, {SPEED_MIB} MiB, CPU)"
C_AR_SPEED = f"allreduce within {AR_SPEED_MAX}x of gloo's all_reduce (p={SPEED_P}, {SPEED_MIB} MiB, CPU)"
C_NCCL = f"allreduce within {NCCL_SPEED_MAX}x of NCCL (2 GPUs, 64 MiB)"
RING_CHECKS = (C_RS_EVEN, C_RS, C_AG_EVEN, C_AG, C_AR_EVEN, C_AR, C_AR_VIEWS, C_BYTES_EVEN, C_BYTES, C_RS2, C_AG2,
               C_AR2)  # the group `rings`: what a forged report would claim
