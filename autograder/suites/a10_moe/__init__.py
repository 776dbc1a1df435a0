"""Assignment a10: Mixture of Experts and expert parallelism (`assignments/a10_moe/`).

Every group is *trusted* (`Group.trusted`): this process never imports the submission. The probe
`autograder.probes.a10_moe` runs the student's router, load-balancing loss, capacity, grouping,
dispatch/combine and all-to-all in the sandboxed worker on hidden inputs sent from here, and the
course's MoE layer and expert-parallel layer, which in the grading build run the student's files;
raw outputs come back. What decides a verdict is here:

- references independent of the student's code and of scaletrain.moe (reference.py): softmax and a
  sort for top-k, Switch's eq. 4-6 summed in Python, capacity in exact fractions, GShard's slot
  order counted token by token, the layer run token by token through each kept expert;
- properties every correct design satisfies, not one design: a group's rows in any order, an
  all-to-all's messages in any order, as long as what arrives, the gradients and the bytes are right;
- bytes: what each rank handed to `isend` and recorded in comm_counter, against the closed form
  (rows for the other ranks only, plus 8 B per peer when the split sizes are exchanged), granted only
  with the all-to-all's values (`Check.needs`).

torch's collectives are forbidden in the all-to-all file, by name and at run time (a deadlock ends
after 10 s as `timeout`); one spawn of 4 gloo ranks serves p = 2, 3, 4 and ep = 2, 4.
"""

from autograder.checks import TORCH_COLLECTIVES
from autograder.manifest import Check, Group, Manifest, Task

from .names import (A2A, C_A2A, C_A2A_BYTES, C_A2AV, C_CAP, C_DISPATCH, C_EP, C_GROUP, C_KEEP, C_LAYER, C_LB,
                    C_LB_BOUNDS, C_LB_GRAD, C_TOPK, C_TOPK_GRAD, CAPACITY, DISPATCH, LOSSES, ROUTER, SOURCES)
from .planted import PLANTED

_JUDGE = "autograder.suites.a10_moe.judge:"
_NO_TRICKS = ("scaletrain.moe", "importlib", "__import__", "exec", "eval")

MANIFEST = Manifest(
    assignment="a10", folder="a10_moe", title="Mixture of Experts and expert parallelism",
    files=dict(SOURCES),
    tasks=(
        Task("10.1", "Top-k routing: softmax gates, Switch (k = 1) and GShard (k = 2)", file=ROUTER,
             functions=("top_k_routing",)),
        Task("10.2", "The load-balancing loss (Switch §2.2)", file=LOSSES, functions=("load_balancing_loss",)),
        Task("10.3", "Expert capacity and the tokens it drops (GShard's priority)", file=CAPACITY,
             functions=("expert_capacity", "apply_capacity")),
        Task("10.4", "Grouping by expert, dispatch and combine", file=DISPATCH,
             functions=("group_by_expert", "dispatch", "combine")),
        Task("10.5", "All-to-all on isend/irecv, equal and variable", file=A2A,
             functions=("_exchange", "exchange_splits", "backward")),
    ),
    forbidden={ROUTER: _NO_TRICKS, LOSSES: _NO_TRICKS, CAPACITY: _NO_TRICKS, DISPATCH: _NO_TRICKS,
               A2A: _NO_TRICKS + TORCH_COLLECTIVES + ("torch.distributed.batch_isend_irecv",
                                                        "torch.distributed.P2POp")},
    groups=(
        Group("routing", _JUDGE + "group_routing", timeout_s=90, trusted=True, checks=(
            Check("10.1", C_TOPK, 3), Check("10.1", C_TOPK_GRAD, 2),
            Check("10.2", C_LB, 3), Check("10.2", C_LB_GRAD, 2), Check("10.2", C_LB_BOUNDS, 1, needs=(C_LB,)),
            Check("10.3", C_CAP, 2), Check("10.3", C_KEEP, 4),
        )),
        Group("dispatch", _JUDGE + "group_dispatch", timeout_s=90, trusted=True, checks=(
            Check("10.4", C_GROUP, 3), Check("10.4", C_DISPATCH, 3), Check("10.4", C_LAYER, 4),
        )),
        Group("ranks", "autograder.suites.a10_moe.judge_ranks:group_ranks", timeout_s=240, trusted=True, checks=(
            Check("10.5", C_A2A, 3), Check("10.5", C_A2AV, 4), Check("10.5", C_A2A_BYTES, 2, needs=(C_A2A, C_A2AV)),
            Check("10.5", C_EP, 3),
        )),
    ),
    planted=PLANTED,
    public_boundary=('capacity rounded down (floor, not ceil)',),
)
