"""a3's names: the submitted files, the references they are generated from, the probe, the
distributed setting, and every check's name."""

BF, DF = "dp_bucket.py", "dp_data_parallel.py"
BF_SRC, DF_SRC = "lib/scaletrain/dp/bucket.py", "lib/scaletrain/dp/data_parallel.py"
PROBE = "autograder.probes.a3_data_parallel"
P = 2          # ranks of the distributed group
WAIT_S = 1.0   # DataParallel(timeout_s=...): how long finish waits for a bucket nobody launched

C_PARTITION = "every parameter in exactly one bucket, none empty"
C_CAP = "every bucket within the cap (a parameter above it alone)"
C_DTYPE = "one dtype per bucket"
C_FULL = "no two neighbouring buckets would fit in one"
C_ORDER = "buckets follow the gradients' arrival: none waits behind a later one"
C_SYNC = "bucketed sync after backward equals one process (1, 2 and 3 buckets)"
C_ONCE = "exactly one allreduce per bucket per step"
C_UNUSED = "unused and frozen parameters: no hang, mean with zeros"
C_OVERLAP = "hooks launch buckets before backward ends (overlap)"
C_HOOKED = "overlapped steps equal one process, tied wte/lm_head included"
C_NOSYNC = "no_sync: no communication, 4 micro-steps equal one large batch"
C_UNUSED_HOOKED = "unused parameter with hooks on: no hang, correct gradients"
BUCKET_CHECKS = (C_PARTITION, C_CAP, C_DTYPE, C_FULL, C_ORDER)
DDP_CHECKS = (C_SYNC, C_ONCE, C_UNUSED, C_OVERLAP, C_HOOKED, C_NOSYNC, C_UNUSED_HOOKED)
