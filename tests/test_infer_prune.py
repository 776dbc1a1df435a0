"""Magnitude pruning (scaletrain.infer.prune) against torch.topk: exactly round(s·n) weights (rows)
zeroed, ties included; the kept ones are the largest |w| (rows: the largest L2 norms) and untouched;
structured pruning zeroes whole rows and their bias; sparsity 0 leaves the outputs bit-identical;
the original model is never touched; bad sparsity or kind raises a ValueError naming it."""

from __future__ import annotations

import pytest
import torch

from scaletrain.infer import block_linears, magnitude_masks, prune, row_masks, zero_fraction
from scaletrain.models import GPT, GPTConfig

CFG = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=3, n_embd=18)  # 18, 54, 72 rows: not powers of two
SPARSITIES = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99]


def _model(seed: int = 0) -> GPT:
    model = GPT(CFG, seed=seed).eval()
    with torch.no_grad():
        for linear in block_linears(model).values():
            linear.bias.normal_()  # GPT's init zeroes biases: a zeroed row's bias must be seen going
    return model


def _weights(model) -> list[torch.Tensor]:
    return [m.weight.detach() for m in block_linears(model).values()]


@pytest.mark.parametrize("sparsity", SPARSITIES)
def test_global_keeps_exactly_the_largest_magnitudes(sparsity):
    weights = _weights(_model())
    flat = torch.cat([w.abs().flatten() for w in weights])
    keep = round((1 - sparsity) * flat.numel())
    want = torch.zeros(flat.numel(), dtype=torch.bool)
    want[torch.topk(flat, keep).indices] = True
    got = torch.cat([m.flatten() for m in magnitude_masks(weights, sparsity, scope="global")])
    assert torch.equal(got, want)


@pytest.mark.parametrize("sparsity", SPARSITIES)
def test_per_layer_keeps_the_largest_of_each_layer(sparsity):
    weights = _weights(_model(1))
    for w, mask in zip(weights, magnitude_masks(weights, sparsity, scope="layer")):
        assert int((~mask).sum()) == round(sparsity * w.numel())
        assert set(mask.flatten().nonzero().flatten().tolist()) == set(
            torch.topk(w.abs().flatten(), int(mask.sum())).indices.tolist())


def test_ties_still_give_the_exact_count():
    weights = [torch.ones(7, 5), torch.full((3, 5), -1.0)]  # every |w| equal: a threshold would keep all or none
    masks = magnitude_masks(weights, 0.4, scope="global")
    assert sum(int((~m).sum()) for m in masks) == round(0.4 * 50)
    assert sum(int((~m[:, 0]).sum()) for m in row_masks(weights, 0.5)) == round(0.5 * 7) + round(0.5 * 3)


@pytest.mark.parametrize("sparsity", SPARSITIES)
def test_rows_zero_whole_rows_of_smallest_norm_and_their_bias(sparsity):
    model = _model(2)
    pruned, masks = prune(model, sparsity, kind="row")
    for name, linear in block_linears(pruned).items():
        original = block_linears(model)[name]
        gone = ~masks[name][:, 0]
        assert torch.equal(masks[name], masks[name][:, :1].expand_as(masks[name]))  # a row is all kept or all gone
        assert int(gone.sum()) == round(sparsity * linear.out_features)
        kept = torch.topk(original.weight.norm(dim=1), int((~gone).sum())).indices
        assert set(kept.tolist()) == set((~gone).nonzero().flatten().tolist())
        assert (linear.weight[gone] == 0).all() and (linear.bias[gone] == 0).all()
        assert torch.equal(linear.weight[~gone], original.weight[~gone])
        assert torch.equal(linear.bias[~gone], original.bias[~gone])


@pytest.mark.parametrize("kind", ["global", "layer"])
def test_pruned_model_holds_the_masks_and_the_share_of_zeros(kind):
    model = _model(3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pruned, masks = prune(model, 0.6, kind=kind)
    assert zero_fraction(pruned) == pytest.approx(0.6, abs=1e-3)
    for name, linear in block_linears(pruned).items():
        original = block_linears(model)[name].weight
        assert torch.equal(linear.weight, torch.where(masks[name], original, torch.zeros(())))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # a copy was pruned


@pytest.mark.parametrize("kind", ["global", "layer", "row"])
def test_sparsity_zero_leaves_the_outputs_bit_identical(kind):
    model = _model(4)
    idx = torch.randint(0, CFG.vocab_size, (3, CFG.block_size), generator=torch.Generator().manual_seed(0))
    pruned, masks = prune(model, 0.0, kind=kind)
    assert torch.equal(pruned(idx)[0], model(idx)[0]) and all(m.all() for m in masks.values())


@pytest.mark.parametrize("sparsity", [1.0, -0.1, 1.5, float("nan")])
def test_sparsity_outside_zero_one_is_refused(sparsity):
    with pytest.raises(ValueError, match=r"sparsity=.*\[0, 1\)"):
        prune(_model(), sparsity)


def test_unknown_kind_or_scope_is_refused():
    with pytest.raises(ValueError, match="kind="):
        prune(_model(), 0.5, kind="channel")
    with pytest.raises(ValueError, match="scope="):
        magnitude_masks(_weights(_model()), 0.5, scope="rows")
