"""Public tests of a7: the loss scale against torch's GradScaler, the checkpoint Function against
plain backpropagation, the planner against an exhaustive search.

The grader runs more: hidden overflow patterns and factors (float32 rounding, growth past
float32's range), a real fp16 run from scale 2^20, hidden blocks with and without dropout (and
what they keep after the forward), hidden chains and budgets. Run one task with
`pytest assignments/a7_memory -m task7_2`.
"""

import pytest
import torch

from autograder.checks import student_module
from scaletrain.checkpointing import Chain, Split, Store, min_peak, simulate
from scaletrain.memory_measure import track_saved_tensors
from scaletrain.models import Block, GPTConfig
from scaletrain.testing import assert_close, expect_equal

ls = student_module("loss_scaler", default=__file__)
cf = student_module("checkpoint_function", default=__file__)
rp = student_module("rotor_planner", default=__file__)


@pytest.mark.task7_1
def test_task7_1_scale_follows_grad_scaler():
    settings = dict(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    ours, theirs = ls.DynamicLossScaler(**settings), torch.amp.GradScaler("cpu", **settings)
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.1)
    for step, bad in enumerate([0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]):
        theirs.scale(torch.ones(()))
        p.grad = torch.tensor([1.0, float("inf") if bad else 1.0])
        theirs.step(opt)
        theirs.update()
        ours.update(bool(bad))
        expect_equal(ours.scale, theirs.get_scale(),
                     what=f"DynamicLossScaler(init 1024, x2 every 3 clean steps, /2 on overflow).scale after step "
                          f"{step} ({'overflow' if bad else 'clean'}), against torch's GradScaler")


WHERE = "task 7.2, checkpoint(Block(h 12, 3 heads, dropout 0.3), x of (2, 7, 12))"


def _checkpoint_and_plain():
    """(checkpointed, plain): per run the output, parameter gradients, input gradient and the bytes
    saved for backward after the forward, under the same seeds."""
    torch.manual_seed(0)
    block = Block(GPTConfig(n_embd=12, n_head=3, dropout=0.3)).train()
    x = torch.randn(2, 7, 12)

    def run(fn):
        block.zero_grad()
        leaf = x.clone().requires_grad_(True)
        torch.manual_seed(1)
        with track_saved_tensors(list(block.parameters())) as tracker:
            out = fn(leaf)
            held = tracker.bytes
            out.pow(2).sum().backward()
        return out, [p.grad.clone() for p in block.parameters()], leaf.grad, held

    return run(lambda leaf: cf.checkpoint(block, leaf)), run(block), [n for n, _ in block.named_parameters()]


def _values_agree(got, want, names):
    (out, grads, xgrad, _), (ref_out, ref_grads, ref_xgrad, _) = got, want
    assert_close(out, ref_out, rtol=0, what=f"{WHERE}: output against the block without checkpointing")
    assert_close(xgrad, ref_xgrad, rtol=0, what=f"{WHERE}: input gradient")
    differ = [n for n, a, b in zip(names, grads, ref_grads) if not torch.equal(a, b)]
    expect_equal(differ, [], what=f"{WHERE}: parameters whose gradients differ from plain backpropagation "
                                  "(the dropout masks differ: restore the RNG state)")


@pytest.mark.task7_2
def test_task7_2_checkpoint_equals_plain_backward_with_dropout():
    _values_agree(*_checkpoint_and_plain())


@pytest.mark.task7_2
def test_task7_2_checkpoint_keeps_only_its_input():
    got, want, names = _checkpoint_and_plain()
    _values_agree(got, want, names)  # as the grader: the memory counts only beside the right values
    expect_equal(got[3], 2 * 7 * 12 * 4, what=f"{WHERE}: bytes saved for backward after the forward (only the input)")


def _all_plans(s, t):
    if s == t:
        yield Store(s)
        return
    for rest in _all_plans(s + 1, t):
        yield Store(s, rest)
    for k in range(s + 1, t + 1):
        for first in _all_plans(s, k - 1):
            for rest in _all_plans(k, t):
                yield Split(s, k, first, rest)


PUBLIC_CHAIN = Chain(input_bytes=(3, 5, 5, 5, 2), tape_bytes=(8, 20, 20, 20, 9),
                     saves_input=(True, True, True, True, False), forward_s=(1, 3, 3, 3, 1), backward_s=(2, 6, 6, 6, 1))


def _budgets_and_plans():
    """Every third budget from the lowest peak up, and every plan of the 5-stage chain, simulated."""
    sims = [simulate(p, PUBLIC_CHAIN) for p in _all_plans(0, PUBLIC_CHAIN.n - 1)]
    return range(min_peak(PUBLIC_CHAIN), max(s.peak_bytes for s in sims) + 1, 3), sims


@pytest.mark.task7_3
def test_task7_3_planner_plans_fit_their_budget():
    budgets, _ = _budgets_and_plans()
    for budget in budgets:
        got = simulate(rp.plan_rotor(PUBLIC_CHAIN, budget), PUBLIC_CHAIN)
        expect_equal(got.peak_bytes <= budget, True,
                     what=f"plan_rotor(the 5-stage chain, budget {budget}): peak {got.peak_bytes} B within the budget")


@pytest.mark.task7_3
def test_task7_3_planner_finds_the_fastest_plan_within_budget():
    budgets, sims = _budgets_and_plans()
    for budget in budgets:
        got = simulate(rp.plan_rotor(PUBLIC_CHAIN, budget), PUBLIC_CHAIN)
        expect_equal(got.time_s, min(s.time_s for s in sims if s.peak_bytes <= budget),
                     what=f"plan_rotor(the 5-stage chain, budget {budget}): time of the plan against the fastest "
                          f"of all {len(sims)} plans within the budget")


@pytest.mark.task7_3
def test_task7_3_planner_raises_when_no_plan_fits():
    budget = min_peak(PUBLIC_CHAIN) - 1
    try:
        got = rp.plan_rotor(PUBLIC_CHAIN, budget)
    except ValueError:
        return
    pytest.fail(f"task 7.3: plan_rotor(the 5-stage chain, budget {budget}) returned {got!r}, but the lowest "
                f"possible peak is {budget + 1} B: expected a ValueError")
