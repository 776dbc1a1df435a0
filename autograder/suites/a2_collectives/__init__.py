"""Assignment a2: ring reduce-scatter, all-gather and allreduce on isend/irecv (`assignments/a2_collectives/`).

Every group is *trusted* (`Group.trusted`): this module never imports the submission. The
student's ring runs in gloo ranks that the sandboxed worker starts (`autograder/probes/a2_collectives.py`),
each rank with its own inputs, generated here from the grading seed and sent over as data; the
ranks hand back what the calls returned or left in place, the messages they handed to
isend/irecv (peer and bytes, counted by the probe's own wrappers) and what `record_send` counted.
Here, and only here:

- the expected values: one process summing every rank's input in float64 (inputs are small
  integers, so every sum is exact in every dtype and the ring must match bit for bit);
- the technique, from the traffic: every message goes to the next rank of the ring and comes from
  the previous one, a result that needs the ring moves at least its volume (a sum computed some
  other way moved nothing), the allreduce hands isend exactly 2(p-1)/p·n·itemsize bytes when p
  divides n and between 2(p-1)·floor(n/p) and 2(p-1)·ceil(n/p) items when it does not (the
  chunking, padded or uneven, and the order of sends and receives are the student's design), and
  records what it sent in 2(p-1) steps; bytes are evidence, granted only with the allreduce's
  values (`Check.needs`, `grade.with_values`);
- forbidden collectives: each rank installs traps before it imports the submission (a collective
  saved at import or called as a ProcessGroup method is the trap too) and reports every trap
  reached, even one whose exception the student's code caught: `flagged`;
- speed: the clock is this process's, around worker calls that run a batch of calls in ranks that
  are already up; the baseline runs in ranks that never import student code, while the student's
  ranks are stopped (SIGSTOP); this machinery's own overhead, timed on the baseline's ranks, is
  subtracted from both sides; each batch's results are sampled and checked.

The student's calls get process groups whose timeout is GROUP_TIMEOUT_S, so a deadlocked ring
ends as `timeout` within seconds. Checks are split by property (p divides n or not; p = 3, 2 and
4, the last in a start of its own; values, non-contiguous tensors, bytes) so that a slip in one case costs that case's point.
Roles: `names` (files, limits, check names), `planted`, `inputs` (hidden inputs and expected
results), `judge` (correctness and traffic), `judge_speed` (timing against gloo and NCCL).
"""

from __future__ import annotations

from autograder.manifest import Check, Group, Manifest, Task

from .names import (C_AG, C_AG2, C_AG4, C_AG_EVEN, C_AR, C_AR2, C_AR4, C_AR_EVEN, C_AR_SPEED, C_AR_VIEWS, C_BYTES,
                    C_BYTES_EVEN, C_NCCL, C_RS, C_RS2, C_RS4, C_RS_EVEN, C_RS_SPEED, FORBIDDEN, RING, SRC)
from .planted import PLANTED

_JUDGE = "autograder.suites.a2_collectives.judge:"
_SPEED = "autograder.suites.a2_collectives.judge_speed:"

MANIFEST = Manifest(
    assignment="a2", folder="a2_collectives", title="Ring collectives on point-to-point messages",
    files={RING: SRC},
    tasks=(
        Task("2.1", "Ring reduce-scatter", file=RING, functions=("ring_reduce_scatter_chunks",)),
        Task("2.2", "Ring all-gather", file=RING, functions=("post_gather_receives", "ring_all_gather_chunks")),
        Task("2.3", "Allreduce in place = reduce-scatter + all-gather", file=RING, functions=("ring_allreduce",)),
        Task("2.4", "Speed: pipelined segments, posted receives, reused buffers", file=RING),
    ),
    forbidden={RING: FORBIDDEN},
    groups=(
        Group("rings", _JUDGE + "group_rings", timeout_s=90, trusted=True, checks=(
            Check("2.1", C_RS_EVEN, 1), Check("2.1", C_RS, 2),
            Check("2.2", C_AG_EVEN, 1), Check("2.2", C_AG, 1),
            Check("2.3", C_AR_EVEN, 1), Check("2.3", C_AR, 1), Check("2.3", C_AR_VIEWS, 1),
            Check("2.3", C_BYTES_EVEN, 1, needs=(C_AR_EVEN,)), Check("2.3", C_BYTES, 1, needs=(C_AR,)),
            Check("2.1", C_RS2, 1), Check("2.2", C_AG2, 1), Check("2.3", C_AR2, 1),
        )),
        Group("rings4", _JUDGE + "group_rings4", timeout_s=60, trusted=True, checks=(
            Check("2.1", C_RS4, 1), Check("2.2", C_AG4, 1), Check("2.3", C_AR4, 1),
        )),
        Group("speed_cpu", _SPEED + "group_speed_cpu", timeout_s=120, trusted=True, checks=(
            Check("2.4", C_RS_SPEED, 1), Check("2.4", C_AR_SPEED, 2),
        )),
        Group("speed_gpu", _SPEED + "group_speed_gpu", timeout_s=180, needs_gpu=True, gpus=2,  # NCCL ring of 2
              trusted=True, checks=(Check("2.4", C_NCCL, 2),)),
    ),
    planted=PLANTED,
    public_boundary=('allreduce of an empty tensor runs the ring: records 2(p-1) empty messages',),
)
