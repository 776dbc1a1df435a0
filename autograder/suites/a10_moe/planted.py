"""a10's planted submissions: each an edit of the solution and the outcomes it must get."""

from __future__ import annotations

from autograder.attacks import function_attacks
from autograder.manifest import REPO, Planted

from .names import (A2A, C_A2A, C_A2A_BYTES, C_A2AV, C_CAP, C_DISPATCH, C_EP, C_GROUP, C_KEEP, C_LAYER, C_LB,
                    C_LB_BOUNDS, C_LB_GRAD, C_TOPK, C_TOPK_GRAD, CAPACITY, DISPATCH, LOSSES, ROUTER, SOURCES)

_CEIL = "    return max(1, math.ceil(round(k * tokens * capacity_factor / num_experts, 9)))\n"
_LOSS = "    return n * (f * p).sum()\n"
_RECV = "            handles.append(dist.irecv(recv[src], src=peers[src], group=group))\n"
_EXCHANGE_START = "    handles = []\n    for step in range(1, p):\n"
_SPLITS = "    return _rows_out(sizes, [1] * p, [1] * p, group).tolist()\n"
_NORMALIZE = "    if k > 1 if normalize is None else normalize:\n        top = top / top.sum(dim=-1, keepdim=True)\n"


def _attacks() -> tuple[Planted, ...]:
    """Attacks on the grader itself (issue 13's catalogue), each in place of `expert_capacity`'s
    answer: under the trusted split they earn nothing."""
    attacks = function_attacks(checks=[C_CAP], module="scaletrain.moe.capacity", source=str(REPO / SOURCES[CAPACITY]),
                               call="expert_capacity(tokens=tokens, num_experts=num_experts, "
                                    "capacity_factor=capacity_factor, k=k)")
    return tuple(Planted(name, CAPACITY, (_CEIL, body + "\n"), groups=("routing",),
                         expect={C_CAP: outcome, C_KEEP: "passed"})
                 for name, (body, outcome) in attacks.items())


PLANTED = (
    Planted("top-k gates not renormalised for k > 1", ROUTER, (_NORMALIZE, ""), groups=("routing",),
            expect={C_TOPK: "failed", C_CAP: "passed"}),
    Planted("gates detached: the router gets no gradient from the task loss", ROUTER,
            ("gates=top)", "gates=top.detach())"), groups=("routing",),
            expect={C_TOPK: "passed", C_TOPK_GRAD: "failed"}),
    Planted("aux loss with the wrong sign", LOSSES, (_LOSS, "    return -n * (f * p).sum()\n"), groups=("routing",),
            expect={C_LB: "failed", C_LB_GRAD: "failed", C_LB_BOUNDS: "failed", C_TOPK: "passed"}),
    Planted("aux loss without N (wrong scale)", LOSSES, (_LOSS, "    return (f * p).sum()\n"), groups=("routing",),
            expect={C_LB: "failed", C_LB_GRAD: "failed", C_LB_BOUNDS: "failed"}),
    # right at both bounds (1 uniform, N collapsed), wrong everywhere between: the bounds need the values
    Planted("aux loss without the fraction term (N·Σ Pᵢ²)", LOSSES, (_LOSS, "    return n * (p * p).sum()\n"),
            groups=("routing",), expect={C_LB: "failed", C_LB_GRAD: "failed", C_LB_BOUNDS: "failed"}),
    # a boundary the public tests exercise (10 tokens, 4 experts: 2.5 slots)
    Planted("capacity rounded down (floor, not ceil)", CAPACITY, ("math.ceil(", "math.floor("), groups=("routing",),
            expect={C_CAP: "failed", C_KEEP: "passed"}),
    Planted("capacity ignored: every pair kept", CAPACITY, ("kept=position < capacity", "kept=position >= 0"),
            groups=("routing",), expect={C_KEEP: "failed", C_CAP: "passed"}),
    Planted("pairs ranked token by token (a token's second choice before later first choices)", CAPACITY,
            (("order = experts.t().reshape(-1)", "order = experts.reshape(-1)"),
             ("position = position.view(k, t).t()", "position = position.view(t, k)")),
            groups=("routing",), expect={C_KEEP: "failed", C_CAP: "passed"}),
    Planted("a dispatch that drops silently: the last expert's assignments are lost", DISPATCH,
            (("    order = torch.argsort(expert, stable=True)\n",
              "    order = torch.argsort(expert, stable=True)[:int((expert < num_experts - 1).sum())]\n"),
             (".tolist()\n    return Groups(", ".tolist()[:-1] + [0]\n    return Groups(")),
            groups=("dispatch",), expect={C_GROUP: "failed", C_DISPATCH: "passed", C_LAYER: "failed"}),
    Planted("combine forgets the gates", DISPATCH, ("y * groups.gate[:, None].to(y.dtype)", "y"),
            groups=("dispatch",), expect={C_DISPATCH: "failed", C_GROUP: "passed", C_LAYER: "failed"}),
    Planted("the router kills its process (crash)", ROUTER, (_NORMALIZE, "    import os\n    os._exit(3)\n"),
            groups=("routing",), expect={C_TOPK: "error", C_TOPK_GRAD: "error", C_LB: "passed"}),
    Planted("all-to-all through torch.distributed.all_to_all (forbidden)", A2A,
            (_EXCHANGE_START, "    dist.all_to_all(recv, send, group=group)\n    return\n" + _EXCHANGE_START),
            groups=("ranks",), expect={C_A2A: "flagged", C_A2AV: "flagged", C_EP: "flagged"}),
    Planted("all_to_all_single looked up by a name built at run time", A2A,
            (_EXCHANGE_START, "    getattr(dist, 'all_to_all' + '_single')(torch.cat(recv), torch.cat(send), "
                              "group=group)\n"
                              "    return\n" + _EXCHANGE_START),
            groups=("ranks",), expect={C_A2A: "flagged", C_A2AV: "flagged", C_A2A_BYTES: "flagged"}),
    Planted("all-to-all that waits on each receive before sending (deadlock)", A2A,
            (_RECV, "            dist.irecv(recv[src], src=peers[src], group=group).wait()\n"),
            groups=("ranks",), timeout_s=60,
            expect={C_A2A: "timeout", C_A2AV: "timeout", C_A2A_BYTES: "timeout", C_EP: "timeout"}),
    # right sizes, p times the bytes: every rank all-gathers the whole p x p split matrix
    Planted("split sizes all-gathered: every rank sends all p sizes to every peer", A2A,
            (_SPLITS, "    table = _rows_out(sizes.repeat(p), [p] * p, [p] * p, group).view(p, p)\n"
                      "    return table[:, _members(group)[0]].tolist()\n"),
            groups=("ranks",), expect={C_A2AV: "passed", C_A2A: "passed", C_A2A_BYTES: "failed", C_EP: "passed"}),
    # the decisions left to the student: other correct designs must get every point
    Planted("another design: groups in descending token order, combine as a dense scatter matrix (passes)", DISPATCH,
            (("    order = torch.argsort(expert, stable=True)\n",
              "    order = torch.cat([torch.nonzero(expert == e).flatten().flip(0) for e in range(num_experts)]\n"
              "                      + [torch.zeros(0, dtype=torch.long)])\n"),
             ("    out = y.new_zeros(tokens, y.shape[1])\n"
              "    return out.index_add(0, groups.token, y * groups.gate[:, None].to(y.dtype))\n",
              "    scatter = y.new_zeros(tokens, y.shape[0])\n"
              "    scatter = scatter.index_put((groups.token, torch.arange(y.shape[0])), groups.gate.to(y.dtype))\n"
              "    return scatter @ y\n")),
            groups=("dispatch",), expect={C_GROUP: "passed", C_DISPATCH: "passed", C_LAYER: "passed"}),
    Planted("another design: every send first in plain rank order, split sizes by _exchange (passes)", A2A,
            ((_RECV, "            pass\n"),
             ("    for step in range(1, p):\n        dst = (rank + step) % p\n        if send[dst].numel():\n",
              "    for dst in range(p):  # everyone to rank 0 first, then to rank 1 ...\n"
              "        if dst != rank and send[dst].numel():\n"),
             ("    recv[rank].copy_(send[rank])\n",
              "    for src in range(p):  # the receives, after every send\n"
              "        if src != rank and recv[src].numel():\n"
              "            handles.append(dist.irecv(recv[src], src=peers[src], group=group))\n"
              "    recv[rank].copy_(send[rank])\n"),
             (_SPLITS, "    got = [torch.zeros(1, dtype=torch.int64) for _ in range(p)]\n"
                       "    _exchange(list(sizes.split(1)), got, group)\n"
                       "    return [int(g) for g in got]\n")),
            groups=("ranks",), expect={C_A2A: "passed", C_A2AV: "passed", C_A2A_BYTES: "passed", C_EP: "passed"}),
    *_attacks(),
    Planted("syntax error", DISPATCH, ("def combine(", "def combine(("), groups=("dispatch",),
            expect={C_GROUP: "error", C_DISPATCH: "error", C_LAYER: "error"}),
)
