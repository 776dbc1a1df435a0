"""Assignment a3: data parallelism with buckets, overlap and no_sync (`assignments/a3_data_parallel/`).

Every group is *trusted* (`Group.trusted`): this module runs in a process that never imports the
submission. The student's code runs in the sandboxed worker through the probes of
`autograder/probes/a3_data_parallel.py`, which return raw outputs; references, comparisons and
verdicts stay here.

3.1 is a design decision (which parameter goes in which bucket, in which order the buckets go):
the student's `assign_buckets` runs on hidden parameter shapes and caps sent as data; its index
lists come back and are judged by the five properties of `scaletrain.dp.bucket_rules`, each its
own check (partition, cap, one dtype, no two mergeable neighbours, the gradients' arrival order),
never against one layout; the four others are granted only with the partition (`Check.needs`).

3.2 and 3.3: one spawn of P ranks in the worker runs the student's DataParallel on a hidden GPT
shape, scenario after scenario, with the bucket assignment computed here by the reference (so
these tasks are graded whatever the state of 3.1). Per rank and scenario the probe returns the
final gradients, every allreduce launched through the callable it gave DataParallel (time and a
copy of what it carried), the times at which its own gradient hooks ran, collectives run outside
that callable, and any use of the c10d store (trapped: `Flagged`). Here, from one process
computing the whole batch and each rank's own rows:
- the final gradients must equal the mean over ranks of gradients that differ per rank;
- every bucket's *local* gradients must have gone out through a launched allreduce (a dummy
  collective, a side channel, or a sum done elsewhere fails: the checks say so);
- overlap counts only such genuine launches that started before the last gradient of backward;
- exactly one allreduce per bucket and nothing else on the wire but the library's used-parameter
  map (one allreduce after the buckets), none inside no_sync();
- the count of allreduces and the overlap are evidence, granted only with the gradients' values
  (`Check.needs`, `grade.with_values`);
- a parameter no rank used keeps .grad None (torch DDP's find_unused_parameters semantics).
A bucket that is never launched ends as `timeout` after WAIT_S (DataParallel's bucket wait), a
deadlock when the process group's timeout expires. torch's DistributedDataParallel is forbidden in
the student file, statically and at run time.
"""

from autograder.manifest import Check, Group, Manifest, Task

from .names import (BF, BF_SRC, C_CAP, C_DTYPE, C_FULL, C_HOOKED, C_NOSYNC, C_ONCE, C_ORDER, C_OVERLAP,
                    C_PARTITION, C_SYNC, C_UNUSED, C_UNUSED_HOOKED, DF, DF_SRC)
from .planted import PLANTED

_JUDGE = "autograder.suites.a3_data_parallel."

MANIFEST = Manifest(
    assignment="a3", folder="a3_data_parallel", title="Data parallelism: buckets, overlap, accumulation",
    files={BF: BF_SRC, DF: DF_SRC},
    tasks=(
        Task("3.1", "Bucket assignment: order and cuts (a design decision)", file=BF, functions=("assign_buckets",)),
        Task("3.2", "Bucketed gradient synchronization after backward", file=DF,
             functions=("_mark_ready", "_launch_ready_buckets", "finish_gradient_synchronization")),
        Task("3.3", "Overlap: gradient hooks that launch buckets; no_sync", file=DF,
             functions=("_register_hooks", "_on_grad_ready")),
    ),
    forbidden={
        BF: ("scaletrain.dp", "torch.distributed._compute_bucket_assignment_by_size", "importlib", "__import__"),
        DF: ("torch.nn.parallel", "torch.distributed.algorithms", "torch.distributed.fsdp",
             "scaletrain.dp.data_parallel", "scaletrain.dp.DataParallel", "importlib", "__import__"),
    },
    groups=(
        Group("buckets", _JUDGE + "judge_buckets:group_buckets", timeout_s=60, trusted=True, checks=(
            # a property an empty or broken partition has for nothing counts only with the partition
            Check("3.1", C_PARTITION, 1),
            Check("3.1", C_CAP, 1, needs=(C_PARTITION,)),
            Check("3.1", C_DTYPE, 1, needs=(C_PARTITION,)),
            Check("3.1", C_FULL, 1, needs=(C_PARTITION,)),
            Check("3.1", C_ORDER, 1, needs=(C_PARTITION,)),
        )),
        Group("ddp", _JUDGE + "judge_ddp:group_ddp", timeout_s=150, trusted=True, checks=(
            Check("3.2", C_SYNC, 3), Check("3.2", C_ONCE, 1, needs=(C_SYNC,)), Check("3.2", C_UNUSED, 2),
            Check("3.3", C_OVERLAP, 2, needs=(C_HOOKED,)), Check("3.3", C_HOOKED, 2), Check("3.3", C_NOSYNC, 2),
            Check("3.3", C_UNUSED_HOOKED, 1),
        )),
    ),
    planted=PLANTED,
    public_boundary=('a bucket closed when a parameter exactly fills the cap (>= for >)',),
)
