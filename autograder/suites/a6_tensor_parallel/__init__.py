"""Assignment a6: tensor, sequence and 3D parallelism (`assignments/a6_tensor_parallel/`).

The group is *trusted* (`Group.trusted`): this process never imports the submission. The probe
`autograder.probes.a6_tensor_parallel` runs the student's f and g, the column and row layers (and the
given attention on them), the vocabulary-parallel loss, the sequence-parallel pair and the 3D grid's
builds in the sandboxed worker, on one spawn of 4 gloo ranks (t = 2 and t = 3 on subgroups, the
grid's builds on all 4), on hidden shapes and weights sent from here, then the grid's coordinates
and groups without processes, and returns raw outputs. Everything that decides a verdict is in this
package: `names` (files, constants, check names), `inputs` (the hidden jobs), `planted` (the
breakages and attacks), `judge*` (references and verdicts):

- references independent of the student's code: the unsharded `nn.Linear` and attention,
  `F.cross_entropy` on the whole logits, the one-process `scaletrain.models.GPT`, sums done in one
  process; the slice each rank must hold (`scaletrain.tp.layers.shard`, `scaletrain.tp.gpt.gpt_shard`
  from the plan `scaletrain.tp.plan.GPT_PLAN`), except where the student designs the slice: the QKV
  split is judged by property (whole heads of Q, K and V on each rank, and the attention's values);
- bytes: what each rank handed to `isend` (counted by the probe below the student's code) against
  the closed forms of `scaletrain.tp.cost` (f: nothing forward, one allreduce backward; the MLP one
  allreduce of b·s·h each way; the GPT 4 per layer, the seminar's equation 5);
- memory: the largest tensor the loss ever made (at most N·V/t elements: never the whole logits),
  what the sequence-parallel linear saved (the shard only), and what the GPT's blocks saved against
  `scaletrain.tp.activations` (Korthikanti's sbh(10 + 24/t + ...) and sbh(34/t + ...) adapted to CPU);
- the 3D grid by the properties any correct layout has (coords and rank_of inverse, groups that
  partition the ranks with position = coordinate, tp groups of consecutive ranks, real groups).

Checks are split by property (forward / backward / bytes, ordinary / very large logits, values /
memory) so that a small mistake costs a small share. Bytes and memory are evidence measured in the
worker: each is granted only when the values it measures passed in the same run (`Check.needs`,
`grade.with_values`): a loss of zeros makes no whole logits either.

A deadlocked collective ends after PG_TIMEOUT_S as `timeout` (the jobs after it are not run; the
grid's builds run last). torch's tensor-parallel API (DTensor, parallelize_module, DeviceMesh) and
collectives are forbidden in the student files, statically and at run time; the wire is the
course's ring (assignment a2).
"""


from autograder.manifest import Check, Group, Manifest, Task

from .names import (C_CE_BWD, C_CE_FWD, C_CE_MEM, C_CE_STABLE, C_COL_BWD, C_COL_FWD, C_FG_BWD, C_FG_BYTES,
                    C_FG_FWD, C_GPT, C_GPT_BYTES, C_LAST, C_MESH_BUILD, C_MESH_GRID, C_MESH_NODES, C_MLP, C_QKV,
                    C_ROW_BWD, C_ROW_FWD, C_SP_BYTES, C_SP_GPT, C_SP_LIN, C_SP_LIN_SAVED, C_SP_MEM, C_SP_PAIR_BWD,
                    C_SP_PAIR_FWD, LAYERS, LOSS, MESH, OPS, SEQ, SOURCES, TORCH_TP)
from .planted import PLANTED

MANIFEST = Manifest(
    assignment="a6", folder="a6_tensor_parallel", title="Tensor, sequence and 3D parallelism",
    files=SOURCES,
    tasks=(
        Task("6.1", "The conjugate operators f and g (and the last-dimension gather/scatter)", file=OPS,
             functions=("forward", "backward")),
        Task("6.2", "Column- and row-parallel linear layers, and the per-head slice of a fused weight", file=LAYERS,
             functions=("shard", "from_linear", "forward")),
        Task("6.3", "Vocabulary-parallel cross-entropy", file=LOSS, functions=("forward", "backward")),
        Task("6.4", "Sequence parallelism: the all-gather / reduce-scatter pair", file=SEQ,
             functions=("forward", "backward")),
        Task("6.5", "3D parallelism: the rank grid and its process groups", file=MESH,
             functions=("coords", "rank_of", "new_groups")),
    ),
    forbidden={OPS: TORCH_TP + ("scaletrain.tp.operators",),
               LAYERS: TORCH_TP + ("scaletrain.tp.layers", "scaletrain.tp.ColumnParallelLinear",
                                   "scaletrain.tp.RowParallelLinear", "scaletrain.tp.shard", "scaletrain.tp.shard_like",
                                   "scaletrain.tp.gpt", "scaletrain.tp.verify"),
               LOSS: TORCH_TP + ("scaletrain.tp.cross_entropy", "scaletrain.tp.vocab_parallel_cross_entropy"),
               SEQ: TORCH_TP + ("scaletrain.tp.sequence",),
               MESH: TORCH_TP + ("scaletrain.mesh", "scaletrain.train", "torch.distributed.device_mesh",
                                 "torch.distributed.init_device_mesh", "torch.distributed.DeviceMesh")},
    groups=(
        Group("ranks", "autograder.suites.a6_tensor_parallel.judge:group_ranks", timeout_s=300, trusted=True, checks=(
            Check("6.1", C_FG_FWD, 1), Check("6.1", C_FG_BWD, 2),
            Check("6.1", C_FG_BYTES, 1, needs=(C_FG_FWD, C_FG_BWD)),
            Check("6.1", C_LAST, 1),
            Check("6.2", C_COL_FWD, 1), Check("6.2", C_COL_BWD, 1),
            Check("6.2", C_ROW_FWD, 1), Check("6.2", C_ROW_BWD, 1),
            Check("6.2", C_QKV, 2), Check("6.2", C_MLP, 1),
            Check("6.2", C_GPT, 3),
            Check("6.2", C_GPT_BYTES, 1, needs=(C_GPT,)),
            Check("6.3", C_CE_FWD, 1), Check("6.3", C_CE_BWD, 1), Check("6.3", C_CE_STABLE, 1),
            Check("6.3", C_CE_MEM, 2, needs=(C_CE_FWD,)),
            Check("6.4", C_SP_PAIR_FWD, 1), Check("6.4", C_SP_PAIR_BWD, 1), Check("6.4", C_SP_LIN, 1),
            Check("6.4", C_SP_LIN_SAVED, 1, needs=(C_SP_LIN,)), Check("6.4", C_SP_GPT, 2),
            Check("6.4", C_SP_MEM, 2, needs=(C_GPT, C_SP_GPT)),
            Check("6.4", C_SP_BYTES, 1, needs=(C_SP_GPT,)),
            Check("6.5", C_MESH_GRID, 2), Check("6.5", C_MESH_NODES, 1, needs=(C_MESH_GRID,)),
            Check("6.5", C_MESH_BUILD, 2),
        )),
    ),
    planted=PLANTED,
    public_boundary=("f's backward does not allreduce",),
)

