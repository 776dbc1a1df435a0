"""Assignment a7: memory techniques (`assignments/a7_memory/`): the dynamic loss scale's update rule,
the checkpoint Function, and Rotor's dynamic program.

Every group is *trusted* (`Group.trusted`): this process never imports the submission. The probes
(`autograder.probes.a7_memory`) run the student's code in the sandboxed worker and send back raw
outputs; everything that decides a verdict is computed here:

- 7.1: the scale and clean-step counter after every step against `torch.amp.GradScaler("cpu")`
  run on the same hidden overflow pattern (an independent reference: torch's own kernel, float32
  rounding included); and a real fp16 run (`scaletrain.precision.MixedPrecision` driven by the
  student's scaler, initial scale 2^20, an inf planted at one step) against the same run with the
  reference scaler: the skipped steps, the scales and every parameter after every step. A scale
  that never backs off keeps overflowing and never trains.
- 7.2: output, parameter and input gradients, and the caller's next random numbers, bitwise against
  plain backpropagation of the same block under the same seed (hidden GPT blocks, MLPs, a function
  of two tensors and a float; with and without dropout); the technique, granted only beside those
  values (`Check.needs`): after the forward, no storage the block made is alive (weak references
  to the storages of every tensor an aten op made during the forward, taken by the probe's own
  dispatch mode: a saved-tensor hook nested inside the student's code hides nothing from them), and
  the block ran once without grad and once more, with grad, in the backward.
- 7.3: the plan for hidden chains and budgets, rebuilt here from nested tuples, validated and
  simulated with the reference `scaletrain.checkpointing.schedule`: its peak must fit the budget
  and its time equal the reference planner's optimum (which the repository's tests check against a
  brute force over every plan); an impossible budget must raise ValueError.

torch.utils.checkpoint and torch.amp are forbidden in the student's files (statically; the former
is also trapped at run time by the probe).
"""

from autograder.manifest import Check, Group, Manifest, Task

from .names import (CF, C_CK_HELD, C_CK_ONCE, C_CK_PLAIN, C_CK_RNG, C_DP_FIT, C_DP_NONE, C_DP_OPT, C_ODD, C_SCALE, C_SKIP,
                    LS, NO_TRICKS, RP, SRC)
from .planted import PLANTED

MANIFEST = Manifest(
    assignment="a7", folder="a7_memory", title="Memory techniques: loss scaling, checkpointing, Rotor's planner",
    files={LS: SRC[LS], CF: SRC[CF], RP: SRC[RP]},
    tasks=(
        Task("7.1", "Dynamic loss scaling: the update rule", file=LS, functions=("update",)),
        Task("7.2", "The checkpoint Function: forward, recomputing backward, RNG restored", file=CF,
             functions=("forward", "backward")),
        Task("7.3", "Checkpoints under a memory budget (a design decision)", file=RP, functions=("plan_rotor",)),
    ),
    forbidden={LS: ("torch.amp", "torch.cuda.amp", "scaletrain.precision.scaler", *NO_TRICKS),
               CF: ("torch.utils.checkpoint", "torch.distributed.algorithms._checkpoint",
                    "scaletrain.checkpointing.function", "scaletrain.memory_measure.CheckpointedBlock", *NO_TRICKS),
               RP: ("scaletrain.checkpointing.planner", "scaletrain.checkpointing.plan_rotor", *NO_TRICKS)},
    groups=(
        Group("scaler", "autograder.suites.a7_memory.judge_scaler:group_scaler", timeout_s=90, trusted=True, checks=(
            Check("7.1", C_SCALE, 4), Check("7.1", C_ODD, 2), Check("7.1", C_SKIP, 3),
        )),
        Group("checkpoint", "autograder.suites.a7_memory.judge_checkpoint:group_checkpoint", timeout_s=90, trusted=True, checks=(
            Check("7.2", C_CK_PLAIN, 3), Check("7.2", C_CK_RNG, 4),
            Check("7.2", C_CK_HELD, 2, needs=(C_CK_PLAIN, C_CK_RNG)),
            Check("7.2", C_CK_ONCE, 1, needs=(C_CK_PLAIN, C_CK_RNG)),
        )),
        Group("planner", "autograder.suites.a7_memory.judge_planner:group_planner", timeout_s=120, trusted=True, checks=(
            Check("7.3", C_DP_FIT, 4), Check("7.3", C_DP_OPT, 5), Check("7.3", C_DP_NONE, 3),
        )),
    ),
    planted=PLANTED,
    public_boundary=('the scale grows one clean step late (> growth_interval for ==)',),
)
