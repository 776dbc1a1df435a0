"""Assignment a5: ZeRO stages 1-3 on the ring collectives (`assignments/a5_zero/`).

The group is *trusted* (`Group.trusted`): this process never imports the submission. The probe
`autograder.probes.a5_zero` runs the student's `shard_of`, `unshard` and `ZeRO` in the sandboxed
worker (one spawn of 2 gloo ranks, with a subgroup of rank 0 for N = 1) on models this side
names, and sends back raw outputs: the parameters after every step, the optimizer state, the bytes
its own wrapper of `isend` saw, and the bytes of live storages it found reachable from the model,
the optimizer and the engine after each step and during forward and backward. Everything that
decides a verdict is here:

- the reference, independent of the student's code: one process training the same model on the
  mean of the ranks' micro-batch gradients (`scaletrain.zero.verify`'s protocol, step by step),
  on hidden models (a GPT of another shape with its tied embedding, an odd MLP, one weight, two
  param groups and a frozen layer), with AdamW and with SGD + momentum (Adam is blind to a
  gradient scaled by N, SGD is not); compared after every step, on every rank;
- the layout (`scaletrain.zero.layout`, the reference) that says which elements each unit and
  shard hold, so stage 3's parameters are rebuilt from the shards here;
- memory: the paper's formula `scaletrain.memory.zero_memory_per_rank` at the padded Ψ' (plus
  frozen parameters and Adam's step counters) against what the process *holds*, counted by the
  probe from the storages, never the engine's `memory_report`; during stage 2's backward, each
  bucket's full gradients must be gone (and its bytes sent) once the bucket is complete; during
  stage 3's forward only the root unit and the running module are gathered;
- bytes: `2Ψ'(N-1)/N` and `3Ψ'(N-1)/N` elements per step, against the bytes handed to `isend`
  (counted below the student's code, not through `record_send`).
Memory, timing and bytes are evidence: each is granted only when its stage's values passed in the
same run (`Check.needs`, `grade.with_values`).

A deadlocked collective ends its job after PG_TIMEOUT_S as `timeout` (the jobs after it are not
run). A task whose functions still hold the stub's `raise NotImplementedError` is reported as not
implemented without running (an untouched stub spawns nothing). torch's ZeroRedundancyOptimizer,
FSDP and its collectives are forbidden in the student file, statically and at run time (in the
ranks, by the probe).
"""

from autograder.manifest import Check, Group, Manifest, Task

from .names import (C_S1_EQ, C_S1_HELD, C_S1_SENT, C_S2_EARLY, C_S2_EQ, C_S2_HELD, C_S2_SENT, C_S3_COMM, C_S3_EQ,
                    C_S3_GATHER, C_S3_HELD, C_SHARD, C_UNSHARD, FORBIDDEN, ZF, ZF3)
from .planted import PLANTED

MANIFEST = Manifest(
    assignment="a5", folder="a5_zero", title="ZeRO: sharded optimizer state, gradients and parameters",
    files={ZF: "lib/scaletrain/zero/engine.py", ZF3: "lib/scaletrain/zero/stage3.py"},
    tasks=(
        Task("5.1", "Shard and unshard the flat buffer", file=ZF, functions=("shard_of", "unshard")),
        Task("5.2", "Stage 1: reduce-scatter, step on the shard, all-gather", file=ZF, functions=("_step_stage1",)),
        Task("5.3", "Stage 2: reduce-scatter buckets during backward", file=ZF,
             functions=("_grad_ready", "_reduce_scatter_unit", "_step_stage2")),
        Task("5.4", "Stage 3: when to gather and free parameters (a design decision)", file=ZF3,
             functions=("gather", "free", "_post_forward", "_pre_backward")),
    ),
    forbidden={file: FORBIDDEN for file in (ZF, ZF3)},
    groups=(
        Group("ranks", "autograder.suites.a5_zero.judge:group_ranks", timeout_s=240, trusted=True, checks=(
            Check("5.1", C_SHARD, 1), Check("5.1", C_UNSHARD, 2),
            Check("5.2", C_S1_EQ, 2), Check("5.2", C_S1_HELD, 1, needs=(C_S1_EQ,)),
            Check("5.2", C_S1_SENT, 1, needs=(C_S1_EQ,)),
            Check("5.3", C_S2_EQ, 2), Check("5.3", C_S2_HELD, 1, needs=(C_S2_EQ,)),
            Check("5.3", C_S2_SENT, 1, needs=(C_S2_EQ,)), Check("5.3", C_S2_EARLY, 1, needs=(C_S2_EQ,)),
            Check("5.4", C_S3_EQ, 3), Check("5.4", C_S3_HELD, 1, needs=(C_S3_EQ,)),
            Check("5.4", C_S3_GATHER, 1, needs=(C_S3_EQ,)), Check("5.4", C_S3_COMM, 1, needs=(C_S3_EQ,)),
        )),
    ),
    planted=PLANTED,
    public_boundary=('gradients summed, not averaged',),
)
