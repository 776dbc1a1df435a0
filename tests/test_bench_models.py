"""The timing protocol's statistics and the tiny models every module builds on."""

import pytest
import torch

from scaletrain import bench
from scaletrain.models import GPT, MLP, GPTConfig, make_batch


def test_quantiles_and_median_of_ratios():
    t = bench.Timing((4.0, 1.0, 3.0, 2.0, 5.0))
    assert (t.median, t.p20, t.p80) == (3.0, 1.8, 4.2)
    c = bench.Comparison(bench.Timing((2.0, 4.0, 9.0)), bench.Timing((1.0, 1.0, 3.0)))
    assert c.ratios == (2.0, 4.0, 3.0) and c.ratio == 3.0  # median of ratios, not ratio of medians


def test_compare_alternates_and_uses_fresh_inputs():
    calls, made = [], []

    def setup():
        made.append(torch.randn(4))
        return (made[-1],)

    bench.compare(lambda x: calls.append("c"), lambda x: calls.append("b"), setup=setup, warmup=1, reps=4)
    assert calls == ["c", "b"] + ["c", "b", "b", "c", "c", "b", "b", "c"]
    assert len(made) == 10  # one fresh input per call, warm-up included


def test_compare_many_shares_one_baseline_and_its_row_reads_one():
    calls = []
    fns = {name: (lambda name: lambda: calls.append(name))(name) for name in ("a", "b", "base")}
    cmps = bench.compare_many(fns, "base", warmup=1, reps=6)
    assert calls[:3] == ["a", "b", "base"] and len(calls) == 3 + 3 * 6
    for rep in range(6):  # every rep runs each function once, in a rotating order
        assert sorted(calls[3 + 3 * rep: 6 + 3 * rep]) == ["a", "b", "base"]
    assert {calls[3 + 3 * rep] for rep in range(6)} == {"a", "b", "base"}
    assert cmps["a"].baseline is cmps["b"].baseline is cmps["base"].baseline  # one measurement
    assert cmps["base"].ratios == (1.0,) * 6 and cmps["base"].ratio == 1.0
    with pytest.raises(ValueError, match="not among"):
        bench.compare_many(fns, "torch")


def test_busbw_factors_and_errors():
    assert bench.busbw(1.0, 4, "allreduce") == 1.5
    assert bench.busbw(1.0, 4, "all_gather") == 0.75
    with pytest.raises(ValueError, match="unknown collective"):
        bench.busbw(1.0, 4, "alltoall")


def test_format_table_aligns_columns():
    text = bench.format_table([{"size": 4096, "ratio": 1.23456}, {"size": 65536, "ratio": 0.5}])
    lines = text.splitlines()
    assert lines[0].split() == ["size", "ratio"] and "1.23" in lines[2] and len({len(x) for x in lines}) == 1


def test_bench_cli_rejects_unknown_names(capsys):
    assert bench.main(["nope"]) == 2
    assert "unknown benchmark 'nope'" in capsys.readouterr().err


def test_gpt_is_deterministic_tied_and_learns():
    cfg = GPTConfig(n_layer=2, n_embd=32, n_head=4, block_size=16)
    a, b = GPT(cfg, seed=3), GPT(cfg, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert a.lm_head.weight is a.wte.weight
    idx, targets = make_batch(cfg, 4, seed=1)
    opt = torch.optim.AdamW(a.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        _, loss = a(idx, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert abs(losses[0] - torch.log(torch.tensor(256.0)).item()) < 0.2  # uniform at init
    assert losses[-1] < losses[0] - 1.0


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="exceeds block_size"):
        GPT(GPTConfig(block_size=8))(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="at least"):
        MLP([4])
