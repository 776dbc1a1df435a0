"""scaletrain.zero without processes: flat buffers, padding, unit assignment, formulas, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from scaletrain.memory import GB, zero_memory_per_rank
from scaletrain.models import GPT, MLP, GPTConfig
from scaletrain.zero import ZeRO, expected_comm, shard_of
from scaletrain.zero.layout import (FlatUnit, bucket_units, default_unit_modules, module_units, pad_range,
                                    resolve_param_groups)


def test_pack_keeps_values_and_makes_views():
    model = MLP([3, 5, 2], seed=1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    unit = FlatUnit.pack(list(model.named_parameters()), group_index=0, dp_rank=2, dp_world_size=4)
    assert unit.numel == 3 * 5 + 5 + 5 * 2 + 2 == 32 and unit.shard_numel == 8 and unit.padded_numel == 32
    for (name, p), view in zip(model.named_parameters(), unit.views(unit.full)):
        assert torch.equal(p, before[name])
        assert p.untyped_storage().data_ptr() == unit.full.untyped_storage().data_ptr()
    with torch.no_grad():
        unit.full.zero_()
    assert all(not p.abs().sum() for p in model.parameters()), "parameters must be views of the buffer"


@pytest.mark.parametrize("numel,world_size", [(1, 4), (2, 3), (10, 4), (7, 7), (13, 1)])
def test_padding_sits_in_the_last_shards(numel, world_size):
    p = nn.Parameter(torch.arange(1.0, numel + 1))
    pads = []
    for rank in range(world_size):
        q = nn.Parameter(p.detach().clone())
        unit = FlatUnit.pack([("w", q)], group_index=0, dp_rank=rank, dp_world_size=world_size)
        m = unit.shard_numel
        assert m == -(-numel // world_size)
        shard = shard_of(unit.full, rank, world_size)
        assert shard.untyped_storage().data_ptr() == unit.full.untyped_storage().data_ptr()
        assert torch.equal(shard, torch.cat([p.detach(), torch.zeros(world_size * m - numel)])[rank * m:(rank + 1) * m])
        assert unit.shard_pad_elements() == int((shard == 0).sum())  # the values are 1..n: zeros are padding
        pads.append(unit.shard_pad_elements())
    assert sum(pads) == world_size * -(-numel // world_size) - numel == pad_range(numel, 0, world_size * m)


def test_shard_of_rejects_unpadded_buffers():
    with pytest.raises(ValueError, match="padded to a multiple of 3"):
        shard_of(torch.zeros(10), 0, 3)


def test_buckets_follow_backward_order_and_cap():
    model = MLP([8, 8, 8, 8], seed=0)  # 6 tensors: 64, 8, 64, 8, 64, 8 floats
    groups = resolve_param_groups(model, None)
    units = bucket_units(groups, bucket_cap_bytes=72 * 4, dp_rank=0, dp_world_size=3)
    assert [u.names for u in units] == [("4.weight", "4.bias"), ("2.weight", "2.bias"), ("0.weight", "0.bias")]
    assert all(u.padded_numel == 72 for u in units)


def test_stage3_units_tied_weight_goes_to_the_root():
    model = GPT(GPTConfig(vocab_size=31, block_size=8, n_layer=3, n_head=2, n_embd=8))
    modules = default_unit_modules(model)
    assert modules == [model.wte, model.wpe, *model.blocks, model.ln_f, model.lm_head]
    units = module_units(model, resolve_param_groups(model, None), modules, dp_rank=0, dp_world_size=2)
    owners = {u.module: u.names for u in units}
    assert owners[model] == ("wte.weight",)  # shared by wte and lm_head
    assert model.wte not in owners and model.lm_head not in owners
    assert owners[model.blocks[1]] == tuple(f"blocks.1.{n}" for n, _ in model.blocks[1].named_parameters())
    assert sum(u.numel for u in units) == sum(p.numel() for p in model.parameters())


def test_param_groups_are_checked():
    model = MLP([2, 3, 1])
    weights = [model[0].weight, model[2].weight]
    with pytest.raises(ValueError, match=r"\['0.bias', '2.bias'\] are in no param group"):
        resolve_param_groups(model, [{"params": weights}])
    with pytest.raises(ValueError, match="appears in two param groups"):
        resolve_param_groups(model, [{"params": weights}, {"params": [model[0].weight, model[0].bias, model[2].bias]}])
    with pytest.raises(ValueError, match="not a parameter of the model"):
        resolve_param_groups(model, [{"params": [torch.zeros(2, requires_grad=True)]}])
    model[0].bias.requires_grad_(False)
    groups = resolve_param_groups(model, [{"params": weights, "lr": 0.1}, {"params": [model[0].bias, model[2].bias]}])
    assert [n for n, _ in groups[1].named] == ["2.bias"] and groups[0].options == {"lr": 0.1}


def test_zero_rejects_bad_arguments_with_a_fix():
    model = MLP([2, 2])
    with pytest.raises(ValueError, match="stage must be one of"):
        ZeRO(model, optimizer_class=torch.optim.SGD, stage=4, lr=0.1)
    with pytest.raises(TypeError, match="not an instance"):
        ZeRO(model, optimizer_class=torch.optim.SGD(model.parameters(), lr=0.1), stage=1)
    with pytest.raises(RuntimeError, match="need a process group"):
        ZeRO(model, optimizer_class=torch.optim.SGD, stage=1, lr=0.1)


def test_expected_comm_is_the_papers_volume_with_padding():
    model = MLP([5, 7, 3], seed=0)  # 42 + 7... = 5*7+7+7*3+3 = 66 parameters, one bucket
    units = bucket_units(resolve_param_groups(model, None), bucket_cap_bytes=2**20, dp_rank=0, dp_world_size=4)
    psi_padded = 4 * -(-66 // 4)
    assert expected_comm(units, 4, 1) == (2 * psi_padded * 3 // 4 * 4, 2 * 3)
    assert expected_comm(units, 4, 3) == (3 * psi_padded * 3 // 4 * 4, 3 * 3)
    assert expected_comm(units, 1, 2) == (0, 0)


def test_paper_table():
    """ZeRO paper Figure 1: Ψ = 7.5B, N = 64, mixed-precision Adam (K = 12)."""
    got = [zero_memory_per_rank(7_500_000_000, 64, s, precision="mixed", optimizer="adam").total / GB
           for s in range(4)]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]
