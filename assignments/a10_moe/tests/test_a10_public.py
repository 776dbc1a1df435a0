"""Public tests of a10: your router, load-balancing loss, capacity, grouping and all-to-all on small
hand-made cases, against torch and plain Python sums computed here.

One task at a time: `pytest assignments/a10_moe -m task10_3`. The grader runs more: hidden token
counts, expert counts and k, skewed routings that drop tokens, the MoE layer built on all your files
against a token-by-token reference, the all-to-all on 2, 3 and 4 ranks with empty chunks, the bytes
your code hands to isend, and the expert-parallel layer against one process holding every expert.
"""

import pytest
import torch

from autograder.checks import student_module
from scaletrain.comm import comm_counter
from scaletrain.launch import spawn
from scaletrain.testing import assert_close, expect_equal

STEMS = ("moe_router", "moe_losses", "moe_capacity", "moe_dispatch", "moe_all_to_all")
for _stem in STEMS:
    student_module(_stem, default=__file__)  # an import error shows here, before any test runs

PROBS = [[0.1, 0.6, 0.3], [0.5, 0.22, 0.28], [0.2, 0.1, 0.7], [0.05, 0.8, 0.15]]  # 4 tokens, 3 experts
LOGITS = torch.log(torch.tensor(PROBS, dtype=torch.float64))


def _expect_equal(got, want: list, what: str) -> None:
    """Exact equality of an integer or boolean tensor (as a list) with a list, naming both."""
    expect_equal(got.tolist() if isinstance(got, torch.Tensor) else got, want, what=what)


@pytest.mark.task10_1
def test_task10_1_top_k_routing():
    router = student_module("moe_router")
    probs = torch.tensor(PROBS, dtype=torch.float64)
    for k, best, normalize in ((1, [[1], [0], [2], [1]], None), (2, [[1, 2], [0, 2], [2, 0], [1, 2]], None),
                               (1, [[1], [0], [2], [1]], True)):
        what = f"task 10.1, top_k_routing(LOGITS, k={k}, normalize={normalize})"
        logits = LOGITS.clone().requires_grad_(True)
        r = router.top_k_routing(logits, k, normalize=normalize)
        assert_close(r.probs.detach(), probs, what=f"{what}: probs")
        _expect_equal(r.experts, best, f"{what}: experts (best first)")
        renormalised = normalize if normalize is not None else k > 1  # GShard for k > 1, Switch's raw p at k = 1
        top = probs.gather(1, torch.tensor(best))
        want = top / top.sum(-1, keepdim=True) if renormalised else top
        assert_close(r.gates.detach(), want, what=f"{what}: gates")
        w = torch.arange(1.0, 4 * k + 1, dtype=torch.float64).view(4, k)
        (r.gates * w).sum().backward()
        ref = LOGITS.clone().requires_grad_(True)
        top_ref = ref.softmax(-1).gather(1, torch.tensor(best))
        if renormalised:
            top_ref = top_ref / top_ref.sum(-1, keepdim=True)
        (top_ref * w).sum().backward()
        assert_close(logits.grad, ref.grad, atol=1e-12,  # p/p at k = 1 with normalize: 0 up to rounding
                     what=f"{what}: gradient of the gates with respect to the logits")


@pytest.mark.task10_2
def test_task10_2_load_balancing_loss():
    losses = student_module("moe_losses")
    probs = torch.tensor(PROBS, dtype=torch.float64)
    for k, experts in ((1, [[1], [0], [2], [1]]), (2, [[1, 2], [0, 2], [2, 0], [1, 2]])):
        what = f"task 10.2, load_balancing_loss(PROBS, experts={experts})"
        fraction = [sum(row.count(i) for row in experts) / (4 * k) for i in range(3)]  # f: every choice counts
        mean_prob = [sum(row[i] for row in PROBS) / 4 for i in range(3)]               # P
        p = probs.clone().requires_grad_(True)
        loss = losses.load_balancing_loss(p, torch.tensor(experts))
        assert_close(float(loss.detach()), 3 * sum(f * q for f, q in zip(fraction, mean_prob)), rtol=1e-12,
                     what=f"{what}: loss")
        loss.backward()
        assert_close(p.grad, torch.tensor([[3 * f / 4 for f in fraction]] * 4, dtype=torch.float64),
                     what=f"{what}: gradient with respect to probs (through P only)")
    uniform = losses.load_balancing_loss(torch.full((12, 4), 0.25, dtype=torch.float64),
                                         torch.tensor([[i % 4] for i in range(12)]))
    assert_close(float(uniform), 1.0, what="task 10.2, load_balancing_loss under uniform routing (Switch §2.2: 1)")
    collapsed = torch.zeros(10, 3, dtype=torch.float64)
    collapsed[:, 0] = 1.0
    assert_close(float(losses.load_balancing_loss(collapsed, torch.zeros(10, 1, dtype=torch.long))), 3.0,
                 what="task 10.2, load_balancing_loss when expert 0 takes every token (N = 3)")


@pytest.mark.task10_3
def test_task10_3_capacity():
    cap = student_module("moe_capacity")
    for kw, want in ((dict(tokens=10, num_experts=4, capacity_factor=1.0, k=1), 3),   # 2.5 slots -> 3
                     (dict(tokens=8, num_experts=4, capacity_factor=1.0, k=1), 2),
                     (dict(tokens=13, num_experts=4, capacity_factor=1.25, k=2), 9),  # 8.125 -> 9
                     (dict(tokens=3, num_experts=8, capacity_factor=0.5, k=1), 1)):   # at least 1
        assert_close(cap.expert_capacity(**kw), want, rtol=0, what=f"task 10.3, expert_capacity({kw})")
    got = cap.apply_capacity(torch.tensor([[0], [0], [1], [0]]), 2, 2)
    what = "task 10.3, apply_capacity(experts=[[0], [0], [1], [0]], 2 experts, capacity 2) (the docstring's example)"
    _expect_equal(got.position, [[0], [1], [0], [2]], f"{what}: position")
    _expect_equal(got.kept, [[True], [True], [True], [False]], f"{what}: kept")
    _expect_equal([got.dropped, got.dropped_tokens], [1, 1], f"{what}: [dropped, dropped_tokens]")


@pytest.mark.task10_4
def test_task10_4_group_dispatch_combine():
    m = student_module("moe_dispatch")
    token, expert = torch.tensor([0, 1, 2, 3]), torch.tensor([2, 0, 2, 1])
    gate = torch.tensor([0.7, 0.9, 0.6, 0.8], dtype=torch.float64)
    groups = m.group_by_expert(token, expert, gate, 3)
    what = "task 10.4, group_by_expert (the docstring's example)"
    _expect_equal(list(groups.counts), [1, 1, 2], f"{what}: counts")
    pairs = list(zip(groups.token.tolist(), groups.gate.tolist()))
    _expect_equal([pairs[0], pairs[1], sorted(pairs[2:])], [(1, 0.9), (3, 0.8), [(0, 0.7), (2, 0.6)]],
                  f"{what}: (token, gate) rows of expert 0, expert 1, expert 2 (in any order)")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, dtype=torch.float64, generator=gen).requires_grad_(True)  # token 4: never chosen
    y = torch.randn(4, 3, dtype=torch.float64, generator=gen).requires_grad_(True)
    rows = m.dispatch(x, groups)
    assert_close(rows.detach(), x.detach()[groups.token], what="task 10.4, dispatch: row i is x[groups.token[i]]")
    out = m.combine(y, groups, 5)
    want = torch.zeros(5, 3, dtype=torch.float64)
    for row, (tok, g) in enumerate(pairs):
        want[tok] += g * y.detach()[row]
    assert_close(out.detach(), want, what="task 10.4, combine: each token's gate-weighted rows (token 4: zeros)")
    out.sum().backward()
    assert_close(y.grad, groups.gate.detach()[:, None].expand(4, 3), what="task 10.4, combine: gradient of y")


def _all_to_all_rank(rank, world_size):
    a2a = student_module("moe_all_to_all")
    width, out = 4, {}
    x = torch.arange(6.0 * width).view(6, width) + 100 * rank  # rows 2j, 2j+1 go to rank j
    y = a2a.all_to_all(x.clone().requires_grad_(True))
    want = torch.cat([(torch.arange(6.0 * width).view(6, width) + 100 * i)[2 * rank:2 * rank + 2] for i in range(3)])
    assert_close(y.detach(), want, what=f"task 10.5, equal all-to-all, rank {rank}: rows from ranks 0, 1, 2")
    splits = [[1, 0, 2], [3, 1, 0], [0, 2, 2]]  # splits[i][j]: rows rank i sends to rank j (some empty)
    x = torch.randn(sum(splits[rank]), width, generator=torch.Generator().manual_seed(rank)).requires_grad_(True)
    with comm_counter() as counted:
        y, recv = a2a.all_to_all_v(x, splits[rank])
    _expect_equal(list(recv), [row[rank] for row in splits], f"task 10.5, all_to_all_v, rank {rank}: recv_splits")
    chunks = [torch.randn(sum(splits[i]), width, generator=torch.Generator().manual_seed(i)).split(splits[i])[rank]
              for i in range(3)]
    assert_close(y.detach(), torch.cat(chunks), what=f"task 10.5, all_to_all_v, rank {rank}: rows received")
    want_bytes = sum(s for j, s in enumerate(splits[rank]) if j != rank) * width * 4 + 8 * 2
    assert_close(counted.bytes_sent, want_bytes, rtol=0,
                 what=f"task 10.5, all_to_all_v, rank {rank}: bytes recorded (rows to others + 8 B of size per peer)")
    y.backward(torch.ones_like(y) * (rank + 1))
    sent_to = [j for j in range(3) for _ in range(splits[rank][j])]  # row -> the rank that received it
    assert_close(x.grad, torch.tensor([[j + 1.0] * width for j in sent_to]),
                 what=f"task 10.5, all_to_all_v backward, rank {rank}: each row's gradient from its receiver")
    return out


@pytest.mark.task10_5
def test_task10_5_all_to_all():
    spawn(_all_to_all_rank, 3, timeout_s=60)
