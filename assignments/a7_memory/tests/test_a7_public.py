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
        assert ours.scale == theirs.get_scale(), f"step {step}"


@pytest.mark.task7_2
def test_task7_2_checkpoint_equals_plain_backward_with_dropout():
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

    out, grads, xgrad, held = run(lambda leaf: cf.checkpoint(block, leaf))
    ref_out, ref_grads, ref_xgrad, _ = run(block)
    assert torch.equal(out, ref_out) and torch.equal(xgrad, ref_xgrad)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads)), "dropout masks differ: restore the RNG state"
    assert held == x.numel() * 4, "after the forward only the input may be kept"


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


@pytest.mark.task7_3
def test_task7_3_planner_finds_the_fastest_plan_within_budget():
    chain = Chain(input_bytes=(3, 5, 5, 5, 2), tape_bytes=(8, 20, 20, 20, 9), saves_input=(True, True, True, True, False),
                  forward_s=(1, 3, 3, 3, 1), backward_s=(2, 6, 6, 6, 1))
    sims = [simulate(p, chain) for p in _all_plans(0, chain.n - 1)]
    for budget in range(min_peak(chain), max(s.peak_bytes for s in sims) + 1, 3):
        got = simulate(rp.plan_rotor(chain, budget), chain)
        assert got.peak_bytes <= budget
        assert got.time_s == min(s.time_s for s in sims if s.peak_bytes <= budget), f"budget {budget}"
    with pytest.raises(ValueError):
        rp.plan_rotor(chain, min_peak(chain) - 1)
