"""Assignment a4: pipeline schedules, their validator and the executor (`assignments/a4_pipeline/`).

Each task is graded against an independent reference: the student's generators through the
library's `validate` and `simulate` (closed-form bubbles, in-flight bounds, the phases of 1F1B),
the student's dry run against the library's verdict on hidden broken schedules, the student's
executor against one process computing the whole model, and against the schedule it was given.

Every group is *trusted* (`Group.trusted`): this module runs in a process that never imports the
submission. The probes (`autograder/probes/a4_pipeline.py`) run the student's code in the
sandboxed worker and send back data: schedules as (stage, kind, microbatch) tuples, the dry
run's verdict, the executor's gradients, losses and a trace of what it ran. The reference, the
hidden inputs, the expected values and the verdicts stay here:

- 4.1 / 4.2 are design decisions (the order of each rank's actions): the returned schedules are
  rebuilt with the library's `Action` and judged by the properties of
  `scaletrain.pipeline.schedule_rules`, one check each (valid, the closed-form bubble, the
  in-flight bound; for 1F1B its warm-up, steady state and cool-down), never against one order;
  each student call has its own time limit, so an infinite loop costs that check only (`timeout`).
- 4.3: valid schedules, hidden deadlocks and hidden receives out of channel order are generated
  here from the seed (the public examples decide nothing: a dry run that recognises them fails);
  rejecting a deadlock and naming its stalled rank and action are separate checks.
- 4.4: the executor runs hidden models and schedules (one of them a random valid schedule) on 3
  ranks. Beyond the gradients, the trace says in which order the stages' forwards and backwards
  ran and how many stage outputs were alive at once: an executor that runs every schedule as
  GPipe fails every schedule's check but GPipe's, one that keeps activations longer than its
  schedule fails the memory check. The losses (forward only) are a check of their own.

What stays best effort: the trace is recorded in the process that runs the student's code (by
wrappers around the stage modules), so code that finds and rewrites it in memory could forge an
order; the gradients, losses and hidden schedules are judged here and cannot be, and the activations
freed (memory evidence) are granted only with 1F1B's gradients (`Check.needs`). The probe also
replaces the executor's call to `validate` (the student's own dry run, under the library's name
in the worker) by nothing: the schedules are the library's, and task 4.4 must not depend on 4.3.
"""

from autograder.manifest import Check, Group, Manifest, Task

from .names import (C1_BUBBLE, C1_COOLDOWN, C1_PEAK, C1_REJECT, C1_STEADY, C1_VALID, C1_WARMUP, C2_BUBBLE, C2_PEAK,
                    C2_REJECT, C2_VALID, C3_ACCEPT, C3_CHANNEL, C3_DETECT, C3_REPORT, C4_1F1B, C4_GPIPE,
                    C4_INTERLEAVED, C4_LOSSES, C4_MEMORY, C4_ZB_H1, E, E_SRC, EXECUTOR_GROUP_S, S, S_SRC, V, V_SRC)
from .planted import PLANTED

_NO_TRICKS = ("importlib", "__import__", "exec", "eval", "subprocess")
_JUDGE = "autograder.suites.a4_pipeline."

MANIFEST = Manifest(
    assignment="a4", folder="a4_pipeline", title="Pipeline parallelism: schedules, validation, execution",
    files={S: S_SRC, V: V_SRC, E: E_SRC},
    tasks=(
        Task("4.1", "1F1B schedule generator (a design decision)", file=S, functions=("one_f_one_b",)),
        Task("4.2", "Interleaved 1F1B schedule generator (a design decision)", file=S,
             functions=("interleaved_1f1b",)),
        Task("4.3", "The validator's dry run: deadlock detection", file=V, functions=("_dry_run",)),
        Task("4.4", "The executor's action step", file=E, functions=("_run", "_forward", "_backward")),
    ),
    # generators are pure Python: no torch (torch.distributed.pipelining has generators) and no
    # copy of the reference; the executor must do its own send/recv, not torch's pipelining
    forbidden={S: ("scaletrain", "torch", *_NO_TRICKS),
               V: ("scaletrain.pipeline.validate", "scaletrain.pipeline.simulate", "scaletrain.pipeline.executor",
                   "torch", *_NO_TRICKS),
               E: ("scaletrain.pipeline.executor", "torch.distributed.pipelining",
                   "torch.distributed.batch_isend_irecv", *_NO_TRICKS)},
    groups=(
        # a property that an empty or invalid schedule has for nothing (a bubble, a bound) counts
        # only with the schedule valid; a dry run's rejections only when it accepts valid ones
        Group("pure", _JUDGE + "judge_pure:group_pure", timeout_s=90, trusted=True, checks=(
            Check("4.1", C1_VALID, 1),
            Check("4.1", C1_BUBBLE, 1, needs=(C1_VALID,)),
            Check("4.1", C1_PEAK, 0.5, needs=(C1_VALID,)),
            Check("4.1", C1_WARMUP, 0.5),
            Check("4.1", C1_STEADY, 0.5),
            Check("4.1", C1_COOLDOWN, 0.5),
            Check("4.1", C1_REJECT, 1),
            Check("4.2", C2_VALID, 1.5),
            Check("4.2", C2_BUBBLE, 1.5, needs=(C2_VALID,)),
            Check("4.2", C2_PEAK, 1, needs=(C2_VALID,)),
            Check("4.2", C2_REJECT, 1),
            Check("4.3", C3_ACCEPT, 1),
            Check("4.3", C3_DETECT, 1, needs=(C3_ACCEPT,)),
            Check("4.3", C3_REPORT, 1, needs=(C3_ACCEPT,)),
            Check("4.3", C3_CHANNEL, 1, needs=(C3_ACCEPT,)),
        )),
        Group("executor", _JUDGE + "judge_executor:group_executor", timeout_s=EXECUTOR_GROUP_S, trusted=True,
              checks=(
            Check("4.4", C4_LOSSES, 1),
            Check("4.4", C4_GPIPE, 1),
            Check("4.4", C4_1F1B, 2),
            Check("4.4", C4_INTERLEAVED, 1),
            Check("4.4", C4_ZB_H1, 1),
            Check("4.4", C4_MEMORY, 1, needs=(C4_1F1B,)),
        )),
    ),
    planted=PLANTED,
    public_boundary=('1F1B accepts m = p - 1 (checks m < p - 1)',),
)
