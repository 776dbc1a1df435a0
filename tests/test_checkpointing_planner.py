"""The planner against a brute force over every plan, Chen's √n at the same budget, and the bytes
`track_saved_tensors` measures when the executor runs a plan on a real GPT (dropout included)."""

import functools
import random

import pytest
import torch

from scaletrain.checkpointing import (Chain, Split, Store, gpt_stages, min_peak, notation, ops, plan_rotor, plan_sqrt,
                                      profile_chain, record_ops, run_plan, segments_plan, simulate, store_all,
                                      store_all_peak, timeline)
from scaletrain.checkpointing.schedule import from_data, to_data, validate
from scaletrain.memory_measure import track_saved_tensors
from scaletrain.models import GPT, GPTConfig, make_batch


def _all_plans(s, t):
    """Every plan of stages s..t (394 for six stages)."""
    if s == t:
        yield Store(s)
        return
    for rest in _all_plans(s + 1, t):
        yield Store(s, rest)
    for k in range(s + 1, t + 1):
        for first in _all_plans(s, k - 1):
            for rest in _all_plans(k, t):
                yield Split(s, k, first, rest)


def _random_chain(rng, n):
    """Integer bytes and times (so costs compare exactly), some tapes not saving their input."""
    return Chain(input_bytes=tuple(rng.randint(1, 9) for _ in range(n)),
                 tape_bytes=tuple(rng.randint(0, 20) for _ in range(n)),
                 saves_input=tuple(rng.random() < 0.7 for _ in range(n)),
                 forward_s=tuple(rng.randint(1, 9) for _ in range(n)),
                 backward_s=tuple(rng.randint(1, 9) for _ in range(n)))


def test_seed_sequence_is_a_plan():
    """The lecture's Rotor example, written as a tree, prints as the seed's sequence."""
    plan = Split(0, 3, Split(0, 2, Store(0, Store(1)), Store(2)), Store(3, Store(4, Store(5, Store(6)))))
    assert notation(plan) == ("F_1^c F_2^n F_3^n F_4^e F_5^e F_6^e Loss B_Loss B_6 B_5 B_4 "
                              "F_1^c F_2^n F_3^e B_3 F_1^e F_2^e B_2 B_1")
    assert from_data(to_data(plan)) == plan


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_dp_equals_brute_force_on_small_chains(n):
    rng = random.Random(n)
    for _ in range(3 if n < 6 else 2):
        chain = _random_chain(rng, n)
        sims = [simulate(p, chain) for p in _all_plans(0, n - 1)]
        top = max(s.peak_bytes for s in sims)
        assert min_peak(chain) == min(s.peak_bytes for s in sims)
        assert store_all_peak(chain) == simulate(store_all(n), chain).peak_bytes
        for budget in range(top + 2):
            fits = [s.time_s for s in sims if s.peak_bytes <= budget]
            if not fits:
                with pytest.raises(ValueError, match="smallest possible peak"):
                    plan_rotor(chain, budget)
                continue
            got = simulate(plan_rotor(chain, budget), chain)
            assert got.peak_bytes <= budget and got.time_s == min(fits), (chain, budget)


def test_dp_never_slower_than_sqrt_n_at_its_budget():
    rng = random.Random(0)
    for n in range(3, 14):
        chain = _random_chain(rng, n)
        sqrt = simulate(plan_sqrt(n), chain)
        dp = simulate(plan_rotor(chain, sqrt.peak_bytes), chain)
        assert dp.peak_bytes <= sqrt.peak_bytes and dp.time_s <= sqrt.time_s


def test_plans_of_known_shape():
    chain = Chain(input_bytes=(1,) * 4, tape_bytes=(10,) * 4, saves_input=(True,) * 4,
                  forward_s=(1,) * 4, backward_s=(2,) * 4)
    assert ops(plan_rotor(chain, 10**6)) == ops(store_all(4))
    assert simulate(store_all(4), chain).peak_bytes == 44     # four tapes, each with its 1-byte input
    assert notation(segments_plan(4, 3)) == "F_1^c F_2^c F_3^e Loss B_Loss B_3 F_2^e B_2 F_1^e B_1"
    with pytest.raises(ValueError, match="budget"):
        plan_rotor(chain, -1)


def test_timeline_peak_is_the_simulated_peak():
    rng = random.Random(3)
    for plan in list(_all_plans(0, 4))[::7]:
        chain = _random_chain(rng, 5)
        rows = timeline(plan, chain)
        assert [op for op, *_ in rows] == ops(plan)
        assert max(live for *_, live in rows) == simulate(plan, chain).peak_bytes
        assert rows[-1][-1] == 0


def test_invalid_plans_and_chains_raise():
    with pytest.raises(ValueError, match="continue"):
        validate(Split(0, 2, Store(0), Store(2)))
    with pytest.raises(ValueError, match="chain has stages"):
        validate(store_all(3), 4)
    with pytest.raises(ValueError, match="tape_bytes"):
        Chain(input_bytes=(1, 2), tape_bytes=(1,), saves_input=(True, True), forward_s=(1, 1), backward_s=(1, 1))
    relu_end = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    with pytest.raises(ValueError, match="saves its own output"):
        profile_chain([relu_end, torch.nn.Linear(3, 1)], torch.randn(2, 3))


# ---------------------------------------------------------------- plans run on a real GPT

CFG = GPTConfig(vocab_size=47, block_size=20, n_layer=5, n_head=3, n_embd=21, dropout=0.15)


@functools.lru_cache(maxsize=None)
def _setup():
    torch.manual_seed(0)
    model = GPT(CFG, seed=1).train()
    idx, tgt = make_batch(CFG, 3, seq_len=19)
    stages, names = gpt_stages(model, tgt)
    return model, idx, tgt, stages, profile_chain(stages, idx, names=names)


def _run(model, fn, seed=11):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with track_saved_tensors(list(model.parameters())) as tracker:
        loss = fn()
        loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()], tracker.peak


def test_profiled_chain_predicts_plain_backpropagation():
    model, idx, tgt, stages, chain = _setup()
    loss, grads, peak = _run(model, lambda: model(idx, tgt)[1])
    assert peak == store_all_peak(chain)
    got = _run(model, lambda: run_plan(store_all(chain.n), stages, idx))
    assert got[0] == loss and all(torch.equal(a, b) for a, b in zip(got[1], grads))


@pytest.mark.parametrize("where", [0.0, 0.2, 0.5, 0.8, "sqrt"])
def test_executed_plan_measures_its_predicted_peak_and_exact_gradients(where):
    model, idx, tgt, stages, chain = _setup()
    lo, hi = min_peak(chain), store_all_peak(chain)
    budget = simulate(plan_sqrt(chain.n), chain).peak_bytes if where == "sqrt" else int(lo + where * (hi - lo))
    plan = plan_rotor(chain, budget)
    loss, grads, _ = _run(model, lambda: model(idx, tgt)[1])
    with record_ops(stages) as seen:
        got_loss, got_grads, peak = _run(model, lambda: run_plan(plan, stages, idx))
    assert peak == simulate(plan, chain).peak_bytes <= budget
    assert got_loss == loss
    assert all(torch.equal(a, b) for a, b in zip(got_grads, grads)), "gradients must equal plain backpropagation"
    assert seen == ops(plan), f"executed {seen}\nplanned {ops(plan)}"


def test_sqrt_plan_measures_like_checkpoint_sequential():
    from scaletrain.checkpointing import checkpoint_sequential

    model, idx, tgt, stages, chain = _setup()
    plan = plan_sqrt(chain.n)
    segments = round((chain.n - 1) ** 0.5)
    seq = _run(model, lambda: stages[-1](checkpoint_sequential(list(stages)[:-1], segments, idx)))
    planned = _run(model, lambda: run_plan(plan, stages, idx))
    assert seq[2] == planned[2] == simulate(plan, chain).peak_bytes
    assert all(torch.equal(a, b) for a, b in zip(seq[1], planned[1]))
