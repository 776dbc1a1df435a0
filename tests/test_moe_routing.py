"""scaletrain.moe in one process: routers and auxiliary losses on hand-computed cases, capacity's
slots and drops against a plain Python count, dispatch and combine against a dense per-token sum,
and the MoE layer and GPT against a reference that runs every token through its experts one by one."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from scaletrain.mesh import ParallelDims
from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.moe import (MoE, MoEConfig, MoEGPT, apply_capacity, combine, dispatch, expert_capacity,
                            expert_choice_routing, group_by_expert, load_balancing_loss, router_z_loss,
                            top_k_routing)
from scaletrain.moe.cost import MIXTRAL_8X7B, ep_step_bytes, flops_per_token, layer_params, model_params
from scaletrain.moe.gpt import moe_block_indices
from scaletrain.testing import assert_close

LOGITS = torch.log(torch.tensor([[0.1, 0.6, 0.3],     # token 0: experts 1 then 2
                                 [0.5, 0.22, 0.28],   # token 1: experts 0 then 2
                                 [0.2, 0.1, 0.7],     # token 2: experts 2 then 0
                                 [0.05, 0.8, 0.15]],  # token 3: experts 1 then 2
                                dtype=torch.float64))


def test_top1_switch_gates_are_the_router_probabilities():
    r = top_k_routing(LOGITS, 1)
    assert r.experts.squeeze(1).tolist() == [1, 0, 2, 1]
    assert_close(r.gates.squeeze(1), torch.tensor([0.6, 0.5, 0.7, 0.8], dtype=torch.float64))
    assert_close(r.probs.sum(1), torch.ones(4, dtype=torch.float64))


def test_top2_gshard_gates_are_renormalised_over_the_pair():
    r = top_k_routing(LOGITS, 2)
    assert r.experts.tolist() == [[1, 2], [0, 2], [2, 0], [1, 2]]
    want = torch.tensor([[0.6 / 0.9, 0.3 / 0.9], [0.5 / 0.78, 0.28 / 0.78], [0.7 / 0.9, 0.2 / 0.9],
                         [0.8 / 0.95, 0.15 / 0.95]], dtype=torch.float64)
    assert_close(r.gates, want)
    raw = top_k_routing(LOGITS, 2, normalize=False)  # the probabilities themselves
    assert_close(raw.gates[0], torch.tensor([0.6, 0.3], dtype=torch.float64))
    with pytest.raises(ValueError, match="k must be in 1..3"):
        top_k_routing(LOGITS, 4)


def test_top1_router_gets_a_task_gradient_only_without_renormalisation():
    logits = LOGITS.clone().requires_grad_()
    top_k_routing(logits, 1).gates.sum().backward()
    assert logits.grad.abs().sum() > 0
    logits.grad = None
    top_k_routing(logits, 1, normalize=True).gates.sum().backward()  # every gate is exactly 1
    assert logits.grad.abs().max() < 1e-12


def test_load_balancing_loss_by_hand():
    r = top_k_routing(LOGITS, 1)  # chosen [1, 0, 2, 1]: f = (1/4, 2/4, 1/4)
    p = torch.tensor([0.1 + 0.5 + 0.2 + 0.05, 0.6 + 0.22 + 0.1 + 0.8, 0.3 + 0.28 + 0.7 + 0.15],
                     dtype=torch.float64) / 4
    want = 3 * (0.25 * p[0] + 0.5 * p[1] + 0.25 * p[2])
    assert load_balancing_loss(r.probs, r.experts).item() == pytest.approx(want.item(), rel=1e-12)
    # top-2: every choice counted, divided by k·T = 8: f = (2/8, 2/8, 4/8)
    r2 = top_k_routing(LOGITS, 2)
    want2 = 3 * (2 / 8 * p[0] + 2 / 8 * p[1] + 4 / 8 * p[2])
    assert load_balancing_loss(r2.probs, r2.experts).item() == pytest.approx(want2.item(), rel=1e-12)


@pytest.mark.parametrize("e", [2, 5, 8])
def test_load_balancing_loss_is_one_when_uniform_and_e_when_collapsed(e):
    t = 4 * e
    uniform = torch.full((t, e), 1.0 / e, dtype=torch.float64)
    experts = torch.arange(t).remainder(e)[:, None]
    assert load_balancing_loss(uniform, experts).item() == pytest.approx(1.0, rel=1e-12)
    collapsed = F.one_hot(torch.zeros(t, dtype=torch.long), e).double()
    assert load_balancing_loss(collapsed, torch.zeros(t, 1, dtype=torch.long)).item() == pytest.approx(e)


def test_load_balancing_gradient_pushes_probability_off_the_busy_expert():
    logits = torch.zeros(6, 3, dtype=torch.float64, requires_grad=True)
    busy = torch.tensor([[0], [0], [0], [0], [1], [2]])  # expert 0 over-subscribed
    load_balancing_loss(logits.softmax(-1), busy).backward()
    assert (logits.grad[:, 0] > 0).all() and (logits.grad[:, 1:] < 0).all()  # descent lowers expert 0


def test_router_z_loss_by_hand():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]], dtype=torch.float64)
    want = (math.log(2.0) ** 2 + math.log(4.0) ** 2) / 2
    assert router_z_loss(logits).item() == pytest.approx(want, rel=1e-12)
    shifted = logits + 5  # same softmax, larger logits: the z-loss alone sees it
    assert router_z_loss(shifted) > router_z_loss(logits)


def test_expert_choice_each_expert_takes_its_best_tokens():
    choice = expert_choice_routing(LOGITS, 2)
    probs = LOGITS.exp()
    assert choice.tokens.tolist() == [[1, 2], [3, 0], [2, 0]]  # columns of S, best first
    assert_close(choice.gates, torch.tensor([[0.5, 0.2], [0.8, 0.6], [0.7, 0.3]], dtype=torch.float64))
    assert sorted(set(range(4)) - set(choice.tokens.reshape(-1).tolist())) == []  # here every token is taken
    assert_close(choice.gates, probs.t().gather(1, choice.tokens))
    with pytest.raises(ValueError, match="capacity must be in 1..4"):
        expert_choice_routing(LOGITS, 5)


def test_expert_capacity_formula():
    assert expert_capacity(tokens=64, num_experts=8, capacity_factor=1.0) == 8
    assert expert_capacity(tokens=64, num_experts=8, capacity_factor=1.25) == 10
    assert expert_capacity(tokens=64, num_experts=8, capacity_factor=1.25, k=2) == 20
    assert expert_capacity(tokens=30, num_experts=3, capacity_factor=0.1) == 1  # 0.1·30/3 = 1, not 1.0000001
    assert expert_capacity(tokens=7, num_experts=3, capacity_factor=1.0) == 3
    assert expert_capacity(tokens=1, num_experts=64, capacity_factor=1.0) == 1


def _slots_by_hand(experts: list[list[int]], e: int, c: int) -> tuple[list[list[bool]], int]:
    """GShard's order, counted in plain Python: every first choice in token order, then every second."""
    t, k = len(experts), len(experts[0])
    used, kept = [0] * e, [[False] * k for _ in range(t)]
    for j in range(k):
        for i in range(t):
            if used[experts[i][j]] < c:
                kept[i][j] = True
            used[experts[i][j]] += 1
    return kept, sum(not x for row in kept for x in row)


def test_capacity_docstring_example():
    cap = apply_capacity(torch.tensor([[0], [0], [1], [0]]), 2, 2)
    assert cap.position.squeeze(1).tolist() == [0, 1, 0, 2]
    assert cap.kept.squeeze(1).tolist() == [True, True, True, False]
    assert (cap.dropped, cap.dropped_tokens) == (1, 1)


@pytest.mark.parametrize("t,e,k,c", [(13, 4, 1, 3), (17, 5, 2, 4), (9, 3, 2, 2), (31, 7, 3, 5), (6, 4, 2, 1)])
def test_capacity_keeps_first_choices_first_and_counts_drops(t, e, k, c):
    gen = torch.Generator().manual_seed(t * e + k)
    experts = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    skew = experts.clone()
    skew[: t // 2, 0] = 0  # half the tokens' first choice on expert 0: drops for sure
    for ex in (experts, skew):
        cap = apply_capacity(ex, e, c)
        kept, dropped = _slots_by_hand(ex.tolist(), e, c)
        assert cap.kept.tolist() == kept
        assert cap.dropped == dropped
        assert cap.dropped_tokens == sum(not any(row) for row in kept)
        per_expert = torch.bincount(ex[cap.kept], minlength=e)
        assert per_expert.max() <= c
    assert apply_capacity(skew, e, c).dropped > 0


def test_dispatch_and_combine_equal_a_dense_per_token_sum():
    gen = torch.Generator().manual_seed(0)
    t, e, h = 11, 4, 6
    x = torch.randn(t, h, dtype=torch.float64, generator=gen)
    token = torch.tensor([0, 3, 3, 5, 7, 10, 2, 2, 9])
    expert = torch.tensor([2, 0, 1, 2, 0, 3, 1, 0, 2])
    gate = torch.rand(9, dtype=torch.float64, generator=gen)
    groups = group_by_expert(token, expert, gate, e)
    assert groups.counts == [3, 2, 3, 1]
    rows = dispatch(x, groups)
    assert torch.equal(rows, x[groups.token])
    weights = torch.randn(e, h, h, dtype=torch.float64, generator=gen)
    expert_of_row = torch.repeat_interleave(torch.arange(e), torch.tensor(groups.counts))
    y = torch.einsum("nh,nhf->nf", rows, weights[expert_of_row])
    out = combine(y, groups, t)
    want = torch.zeros(t, h, dtype=torch.float64)
    for tok, ex, g in zip(token.tolist(), expert.tolist(), gate.tolist()):
        want[tok] += g * (x[tok] @ weights[ex])
    assert_close(out, want)
    untouched = [i for i in range(t) if i not in token.tolist()]
    assert torch.equal(out[untouched], torch.zeros(len(untouched), h, dtype=torch.float64))


def _per_token_reference(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """Every token through its chosen experts one at a time, with the layer's own weights."""
    cfg, ex = layer.cfg, layer.experts
    logits = x @ layer.router.weight.t()
    probs = logits.softmax(-1)
    t = x.shape[0]
    out = torch.zeros_like(x)
    if cfg.routing == "expert_choice":
        c = expert_capacity(tokens=t, num_experts=cfg.num_experts, capacity_factor=cfg.capacity_factor)
        picks = [(int(i), e, probs[i, e]) for e in range(cfg.num_experts) for i in probs[:, e].topk(c).indices]
    else:
        top = probs.topk(cfg.top_k, dim=-1)
        gates = top.values / top.values.sum(-1, keepdim=True) if cfg.top_k > 1 else top.values
        kept, _ = _slots_by_hand(top.indices.tolist(), cfg.num_experts,
                                 expert_capacity(tokens=t, num_experts=cfg.num_experts, k=cfg.top_k,
                                                 capacity_factor=cfg.capacity_factor)
                                 if cfg.routing == "capacity" else t * cfg.top_k)
        picks = [(i, int(top.indices[i, j]), gates[i, j]) for i in range(t) for j in range(cfg.top_k) if kept[i][j]]
    for i, e, g in picks:
        hidden = F.gelu(x[i] @ ex.w1[e] + ex.b1[e])
        out[i] += g * (hidden @ ex.w2[e] + ex.b2[e])
    return out


CONFIGS = [dict(routing="capacity", top_k=1, capacity_factor=1.0), dict(routing="capacity", top_k=2, capacity_factor=0.6),
           dict(routing="dropless", top_k=2), dict(routing="expert_choice", capacity_factor=1.5)]


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: f"{kw['routing']}-k{kw.get('top_k', 1)}")
@pytest.mark.parametrize("gemm", ["grouped", "loop", "padded"])
def test_moe_layer_equals_the_per_token_reference(kw, gemm):
    torch.manual_seed(0)
    layer = MoE(6, MoEConfig(num_experts=5, ffn_hidden=7, gemm=gemm, **kw)).double()
    layer.reset_parameters(torch.Generator().manual_seed(1), n_layer=2)
    with torch.no_grad():
        for p in (layer.experts.b1, layer.experts.b2):
            p.normal_()  # biases are zero at init: make them count
        layer.router.weight.mul_(100)  # confident, uneven routing: drops at low capacity
    x = torch.randn(2, 13, 6, dtype=torch.float64)
    out = layer(x)
    assert out.shape == x.shape
    assert_close(out.view(-1, 6), _per_token_reference(layer, x.view(-1, 6)))
    s = layer.stats
    assert int(s.kept.sum()) + s.dropped == (26 * layer.cfg.top_k if kw["routing"] != "expert_choice" else int(s.kept.sum()))
    if kw.get("capacity_factor") == 0.6:
        assert s.dropped > 0


def test_dropped_tokens_ride_the_residual_exactly():
    cfg = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=8)
    model = MoEGPT(cfg, MoEConfig(num_experts=4, capacity_factor=0.25, routing="capacity"), seed=3)
    layer = model.blocks[1].mlp
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0] = 5.0  # every token prefers expert 0: most overflow it
    block, seen = model.blocks[1], {}
    block.ln2.register_forward_hook(lambda m, i, o: seen.update(mid=i[0]))  # x after attention, before the MLP
    block.register_forward_hook(lambda m, i, o: seen.update(out=o))
    idx, targets = make_batch(cfg, 2, seed=0)
    model(idx, targets)
    s = layer.stats
    assert s.dropped_tokens > 0 and s.dropped == s.dropped_tokens  # k = 1: a dropped pair is a dropped token
    slots, _ = _slots_by_hand(s.experts.tolist(), 4, expert_capacity(tokens=s.tokens, num_experts=4, capacity_factor=0.25))
    kept = torch.tensor([row[0] for row in slots])
    mid, out = seen["mid"].view(-1, 8), seen["out"].view(-1, 8)
    assert torch.equal(out[~kept], mid[~kept])  # x + 0: bit for bit
    assert int((~kept).sum()) == s.dropped_tokens
    assert not torch.equal(out[kept], mid[kept])


def test_moe_gpt_keeps_the_dense_gpt_weights_and_adds_the_aux_losses():
    cfg = GPTConfig(vocab_size=32, block_size=8, n_layer=4, n_head=2, n_embd=8)
    moe = MoEConfig(num_experts=4, every=2, aux_loss_coef=0.1, z_loss_coef=0.01)
    model, dense = MoEGPT(cfg, moe, seed=5), dict(GPT(cfg, seed=5).named_parameters())
    assert moe_block_indices(4, 2) == [1, 3] and moe_block_indices(3, 1) == [0, 1, 2]
    assert [i for i, b in enumerate(model.blocks) if isinstance(b.mlp, MoE)] == [1, 3]
    for name, p in model.named_parameters():
        if name in dense:
            assert torch.equal(p, dense[name]), name
    logits, loss = model(*make_batch(cfg, 2, seed=1))
    aux = sum(0.1 * m.stats.load_balance + 0.01 * m.stats.z_loss for m in model.moe_layers())
    assert loss.item() == pytest.approx(model.last_ce.item() + aux, rel=1e-6)
    loss.backward()
    assert model.blocks[1].mlp.router.weight.grad.abs().sum() > 0


def test_moe_arithmetic():
    # Mixtral 8x7B: "47B parameters, 13B active" (Jiang et al. 2024)
    mixtral = model_params(**MIXTRAL_8X7B)
    assert round(mixtral["total"] / 1e9, 1) == 46.7 and round(mixtral["active"] / 1e9, 1) == 12.9
    assert layer_params(hidden=4, ffn_hidden=16, num_experts=3) == 3 * (2 * 4 * 16 + 16 + 4) + 4 * 3
    dense = flops_per_token(hidden=64, ffn_hidden=256, num_experts=1, top_k=1) - 6 * 64
    assert flops_per_token(hidden=64, ffn_hidden=256, num_experts=8, top_k=1) == dense + 6 * 64 * 8
    # ep_step_bytes on a hand case: 2 ranks, 4 experts (2 each), 8-byte rows
    counts = [[1, 2, 3, 4], [5, 6, 7, 0]]
    # rank 0 sends 3+4 rows to rank 1 and receives 5+6 from it, both twice; 2 counts of 8 bytes
    assert ep_step_bytes(counts, rank=0, row_bytes=8) == (2 * 7 + 2 * 11) * 8 + 16
    assert ep_step_bytes(counts, rank=1, row_bytes=8) == (2 * 11 + 2 * 7) * 8 + 16


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="routing must be one of"):
        MoEConfig(routing="random")
    with pytest.raises(ValueError, match="top_k must be in 1..num_experts = 4"):
        MoEConfig(top_k=5)
    with pytest.raises(ValueError, match="leaves no MoE block"):
        MoEGPT(GPTConfig(n_layer=1), MoEConfig(every=2))


def test_mesh_ep_splits_the_data_parallel_ranks():
    dims = ParallelDims(dp=4, pp=1, tp=2, ep=2)
    assert dims.groups("ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.groups("edp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dims.groups("dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    c = dims.coords(6)
    assert (c.dp, c.ep, c.edp, c.tp) == (3, 1, 1, 0)
    assert ParallelDims(dp=3).groups("ep") == [[0], [1], [2]]
    with pytest.raises(ValueError, match="ep = 2 must divide dp = 3"):
        ParallelDims(dp=3, ep=2)
