"""Progressive layer dropping and the sequence-length curriculum (issue 35 item 4) as pure schedules:
θ(t) against its formula, deeper layers dropped more, nothing dropped at t = 0, a dropped layer the
identity; the curriculum monotone, on its grid and reaching the full length."""

from __future__ import annotations

import math

import pytest
import torch

from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.profile.curriculum import seq_len_at, truncate
from scaletrain.profile.pld import keep_probabilities, pld_forward, sample_gates, theta


@pytest.mark.parametrize("t,theta_bar,gamma", [(0, 0.5, 1e-3), (700, 0.5, 1e-3), (50, 0.3, 0.05), (10**6, 0.5, 1e-3)])
def test_theta_is_the_papers_formula(t, theta_bar, gamma):
    expected = (1 - theta_bar) * math.exp(-gamma * t) + theta_bar
    assert theta(t, theta_bar=theta_bar, gamma=gamma) == pytest.approx(expected)
    assert theta_bar <= theta(t, theta_bar=theta_bar, gamma=gamma) <= 1.0


def test_deeper_layers_and_later_steps_are_dropped_more_and_nothing_at_the_start():
    assert keep_probabilities(0, 7) == [1.0] * 7  # θ(0) = 1: the first layer (every layer) always kept
    assert sample_gates(keep_probabilities(0, 7), torch.Generator().manual_seed(0)) == [True] * 7
    for t in (1, 100, 5000):
        p = keep_probabilities(t, 7)
        assert all(a > b for a, b in zip(p, p[1:]))               # deeper: lower keep probability
        assert p[-1] == pytest.approx(theta(t))                    # the last layer keeps with θ(t)
    assert all(a > b for a, b in zip(keep_probabilities(100, 7), keep_probabilities(2000, 7)))


def test_gates_follow_their_probabilities():
    g = torch.Generator().manual_seed(1)
    probs = [0.9, 0.5, 0.2]
    kept = torch.tensor([sample_gates(probs, g) for _ in range(4000)], dtype=torch.float64).mean(0)
    assert torch.allclose(kept, torch.tensor(probs, dtype=torch.float64), atol=0.03)


def test_a_dropped_layer_is_the_identity_and_all_kept_is_the_model():
    cfg = GPTConfig(vocab_size=50, block_size=12, n_layer=3, n_head=2, n_embd=16)
    model = GPT(cfg, seed=0)
    idx, targets = make_batch(cfg, 2, seed=1)
    full = model(idx, targets)
    same = pld_forward(model, idx, targets, [True] * 3, [1.0] * 3)
    torch.testing.assert_close(same[0], full[0])
    short = GPT(cfg, seed=0)  # the same weights with the middle block removed: the reference for G_2 = 0
    short.blocks = torch.nn.ModuleList([short.blocks[0], short.blocks[2]])
    torch.testing.assert_close(pld_forward(model, idx, targets, [True, False, True], [1.0] * 3)[0], short(idx)[0])


def test_the_curriculum_grows_monotonically_on_its_grid_to_the_full_length():
    full, start, total = 96, 8, 50
    for root in (1, 2):
        lengths = [seq_len_at(t, full=full, start=start, total_steps=total, step=8, root=root) for t in range(80)]
        assert lengths[0] == start and lengths[total:] == [full] * (80 - total)
        assert all(a <= b for a, b in zip(lengths, lengths[1:]))
        assert all(s % 8 == 0 and start <= s <= full for s in lengths)
    # root 2 grows faster early (t/T)^(1/2) >= t/T
    assert seq_len_at(10, full=full, start=start, total_steps=total, root=2) > seq_len_at(
        10, full=full, start=start, total_steps=total, root=1)
    idx, targets = torch.arange(20).view(2, 10), torch.arange(1, 21).view(2, 10)
    short_idx, short_targets = truncate(idx, targets, 4)
    assert short_idx.tolist() == [[0, 1, 2, 3], [10, 11, 12, 13]] and (short_targets - short_idx).eq(1).all()
