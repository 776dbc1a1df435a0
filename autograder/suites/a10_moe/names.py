"""a10's names: the submitted files, the reference each is released from, and every check's name."""

ROUTER, LOSSES, CAPACITY, DISPATCH, A2A = "moe_router.py", "moe_losses.py", "moe_capacity.py", "moe_dispatch.py", \
    "moe_all_to_all.py"
SOURCES = {ROUTER: "lib/scaletrain/moe/router.py", LOSSES: "lib/scaletrain/moe/losses.py",
           CAPACITY: "lib/scaletrain/moe/capacity.py", DISPATCH: "lib/scaletrain/moe/dropless.py",
           A2A: "lib/scaletrain/moe/all_to_all.py"}
PROBE = "autograder.probes.a10_moe:"

C_TOPK = "top-k routing: softmax, each token's k best experts and their gates (renormalised for k > 1)"
C_TOPK_GRAD = "top-k routing: the gates' gradient reaches the router logits"
C_LB = "load-balancing loss N·Σ fᵢ·Pᵢ on hidden routings (k = 1, 2, 3)"
C_LB_GRAD = "load-balancing loss: gradient through the probability fractions only"
C_LB_BOUNDS = "load-balancing loss is 1 under uniform routing and N when one expert takes every token"
C_CAP = "expert capacity ⌈k·T·cf/E⌉ (at least 1) on hidden (T, E, k, cf)"
C_KEEP = "capacity: the pairs kept are exactly the first C per expert in GShard's priority order"
C_GROUP = "grouping by expert: counts, and each group holds exactly its expert's (token, gate) pairs"
C_DISPATCH = "dispatch and combine equal a per-token gate-weighted sum (values and gradients)"
C_LAYER = "MoE layer on your files equals a per-token reference (output, aux loss, drops, gradients)"
C_A2A = "equal all-to-all on isend/irecv (p = 2, 3, 4; values and backward)"
C_A2AV = "variable all-to-all with uneven and empty splits, sizes given or exchanged (values and backward)"
C_A2A_BYTES = "all-to-all bytes handed to isend and to comm_counter equal the formula"
C_EP = "expert-parallel MoE layer (ep = 2, 4) on your all-to-all equals one process holding every expert"

CHECKS_LOCAL = (C_TOPK, C_TOPK_GRAD, C_LB, C_LB_GRAD, C_LB_BOUNDS, C_CAP, C_KEEP, C_GROUP, C_DISPATCH, C_LAYER)
CHECKS_RANKS = (C_A2A, C_A2AV, C_A2A_BYTES, C_EP)
