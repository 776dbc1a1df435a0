"""scaletrain.profile (module 11): the categoriser on known ops, FLOPs from recorded shapes against
2mnk and against the model's own parameter count, the roofline's bound against its closed form, the
categories tiling the profiled step, and the Chrome trace as valid JSON."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.profile import (CATEGORIES, Machine, attainable, categorise, category_seconds, category_table,
                                op_cost, op_table, profile_steps, training_step)
from scaletrain.profile.tables import UNACCOUNTED

CFG = GPTConfig(vocab_size=96, block_size=24, n_layer=2, n_head=3, n_embd=48)
BATCH = 5


@pytest.mark.parametrize("name,category", [
    ("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::bmm", "matmul"), ("aten::linear", "matmul"),
    ("autograd::engine::evaluate_function: AddmmBackward0", "matmul"), ("MmBackward0", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0", "attention"),
    ("aten::native_layer_norm", "normalization"), ("NativeLayerNormBackward0", "normalization"),
    ("aten::_softmax", "normalization"), ("aten::gelu", "activation"), ("GeluBackward0", "activation"),
    ("aten::threshold_backward", "activation"), ("aten::add", "elementwise"), ("aten::mul_", "elementwise"),
    ("AddBackward0", "elementwise"), ("torch::autograd::AccumulateGrad", "elementwise"),
    ("aten::_foreach_mul_", "optimizer"), ("c10d::allreduce_", "communication"), ("nccl:all_reduce", "communication"),
    ("gloo:all_gather", "communication"), ("aten::embedding", "other"), ("aten::view", "other"),
    ("Optimizer.step#AdamW.step", "optimizer"), ("aten::glu_backward", "activation"),
    ("aten::native_dropout_backward", "elementwise"),
    ("aten::addmv_like_unknown", "other")])
def test_the_categoriser_names_known_ops(name, category):
    assert categorise(name) == category and category in CATEGORIES


@pytest.mark.parametrize("m,k,n", [(37, 53, 29), (1, 7, 300)])
def test_matmul_flops_from_shapes_are_2mnk(m, k, n):
    assert op_cost("aten::mm", [[m, k], [k, n]]).flops == 2 * m * n * k
    assert op_cost("aten::addmm", [[n], [m, k], [k, n]]).flops == 2 * m * n * k
    assert op_cost("aten::bmm", [[3, m, k], [3, k, n]]).flops == 3 * 2 * m * n * k
    # bytes: every operand read and the output written once, fp32 and bf16
    assert op_cost("aten::mm", [[m, k], [k, n]], ["float", "float"]).bytes == 4 * (m * k + k * n + m * n)
    assert op_cost("aten::mm", [[m, k], [k, n]], ["c10::BFloat16"] * 2).bytes == 2 * (m * k + k * n + m * n)


class _Linear(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x, y):
        out = self.fc(x)
        return out, (out - y).pow(2).mean()


def test_a_profiled_linear_costs_2mnk_forward_and_twice_that_backward():
    m, k, n = 37, 53, 29
    model = _Linear(k, n)
    x = torch.randn(m, k, requires_grad=True)  # its gradient too: dX and dW, the two products of the backward
    step = training_step(model, (x, torch.randn(m, n)), torch.optim.SGD(model.parameters(), lr=0.1))
    prof = profile_steps(step, steps=2, warmup=1)
    flops = {p: sum(k.cost.flops for k in prof.kernels if k.phase == p and categorise(k.name) == "matmul") / 2
             for p in ("forward", "backward")}
    assert flops["forward"] == 2 * m * n * k
    assert flops["backward"] == 2 * flops["forward"]


@pytest.fixture(scope="module")
def gpt_profile(tmp_path_factory):
    torch.manual_seed(0)
    model = GPT(CFG, seed=0)
    step = training_step(model, make_batch(CFG, BATCH, seed=1), torch.optim.AdamW(model.parameters(), lr=1e-3))
    path = tmp_path_factory.mktemp("trace") / "step.json"
    return model, profile_steps(step, steps=2, warmup=1, trace_path=path)


def test_forward_matmul_flops_are_2_tokens_times_the_linear_weights(gpt_profile):
    """Independent reference: every weight of a linear layer (lm_head tied to wte included) is one
    multiply-add per token in the forward."""
    model, prof = gpt_profile
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    tokens = BATCH * CFG.block_size
    counted = sum(k.cost.flops for k in prof.kernels if k.phase == "forward" and categorise(k.name) == "matmul")
    assert counted / prof.steps == 2 * tokens * weights
    backward = sum(k.cost.flops for k in prof.kernels if k.phase == "backward" and categorise(k.name) == "matmul")
    # the first layer's qkv input is the embedding (needs its gradient), so every linear has dX and dW
    assert backward == 2 * counted


def test_causal_attention_flops_are_half_of_4_b_s2_h_per_layer(gpt_profile):
    """The GPT's attention is causal (the profiler's concrete inputs say so): 4·b·s²·h / 2 per layer
    forward (Q·Kᵀ and P·V, the masked half skipped), 5/2 of it backward (S recomputed, dV, dP, dQ, dK)."""
    _, prof = gpt_profile
    per_step = {p: sum(k.cost.flops for k in prof.kernels if k.phase == p and k.category == "attention") / prof.steps
                for p in ("forward", "backward")}
    forward = CFG.n_layer * 4 * BATCH * CFG.block_size ** 2 * CFG.n_embd / 2
    assert per_step == {"forward": forward, "backward": 2.5 * forward}


def test_the_categories_tile_the_profiled_step(gpt_profile):
    _, prof = gpt_profile
    rows = {r["category"]: r for r in category_table(prof)}
    step = rows["step (profiled)"]
    ops = sum(r["step ms"] for name, r in rows.items() if name in CATEGORIES)
    # outer ops only: their times never exceed the phases they sit in (a nested op counted twice would)
    for phase in ("forward", "backward", "optimizer"):
        inside = sum(v for (p, _), v in category_seconds(prof).items() if p == phase) * 1e3
        assert 0 < inside <= step[f"{phase} ms"] * 1.001, phase
    # and none is lost: per step, one matmul op per linear layer (4 per block and lm_head), forward and backward
    # (how much of the wall time they cover depends on the machine's load: Python between tiny ops)
    for phase in ("forward", "backward"):
        count = sum(o.category == "matmul" and o.phase == phase for o in prof.ops)
        assert count == prof.steps * (4 * CFG.n_layer + 1), phase
    assert ops + rows[UNACCOUNTED]["step ms"] == pytest.approx(step["step ms"], rel=1e-9)
    assert {"matmul", "attention", "normalization", "activation", "optimizer"} <= rows.keys()
    assert rows["optimizer"]["forward ms"] == 0 and rows["optimizer"]["backward ms"] == 0


def test_the_roofline_bound_is_min_of_peak_and_intensity_times_bandwidth(gpt_profile):
    machine = Machine(peak_flops=100e9, bandwidth=10e9, device="cpu")  # ridge at 10 FLOP/B
    big = op_cost("aten::mm", [[512, 512], [512, 512]])   # I = 2·512³ / (3·512²·4) = 85 FLOP/B
    add = op_cost("aten::add", [[1000], [1000]])          # 1000 FLOPs / (3·1000·4 B)
    assert attainable(machine, big.intensity) == 100e9
    assert attainable(machine, add.intensity) == pytest.approx(10e9 / 12)
    _, prof = gpt_profile
    for row in op_table(prof, machine):
        expected = min(machine.peak_flops, row["MFLOP"] / row["MB"] * machine.bandwidth) / 1e9
        assert row["bound GFLOP/s"] == pytest.approx(expected)
        assert row["limit"] == ("compute" if row["FLOP/B"] >= 10 else "memory")
    kinds = {r["op"]: r["limit"] for r in op_table(prof, machine)}
    assert kinds["gelu"] == kinds["native_layer_norm"] == "memory"


def test_the_median_step_is_one_real_step(gpt_profile):
    _, prof = gpt_profile
    totals = [sum(d.values()) for d in prof.by_step]
    one = prof.median_step()
    assert len(totals) == prof.steps == 2 and one.steps == 1
    assert sum(one.phase_seconds.values()) == min(totals)  # the lower median of two
    # each step runs the same ops
    assert 2 * len(one.ops) == len(prof.ops) and 2 * len(one.kernels) == len(prof.kernels)
    assert sum(r["step ms"] for r in category_table(one) if r["category"] == "step (profiled)") == \
        pytest.approx(min(totals) * 1e3)


def test_the_chrome_trace_is_valid_json_with_the_phases(gpt_profile):
    _, prof = gpt_profile
    trace = json.loads(prof.trace_path.read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"phase:forward", "phase:backward", "phase:optimizer", "aten::addmm"} <= names


def test_device_side_twins_of_the_phase_markers_are_not_phases():
    """On a GPU every record_function range has a device-side twin of the same name, on the GPU's
    clock (the first H200 profile took them for phases: 5 steps out of 3, a backward of 0 ms).
    The phases are the host's ranges: twins added change nothing."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from scaletrain.profile import trace

    model = GPT(CFG, seed=0)
    step = training_step(model, make_batch(CFG, BATCH, seed=1), torch.optim.AdamW(model.parameters(), lr=1e-3))
    step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
        step()
    events = list(prof.events())
    twins = [SimpleNamespace(name=e.name, device_type=DeviceType.CUDA, cpu_parent=None, input_shapes=None,
                             time_range=SimpleNamespace(start=e.time_range.start + 700, end=e.time_range.end + 900))
             for e in events if e.name.startswith("phase:")]
    assert len(twins) == 6
    ops, kernels, by_step = trace._records(events, cuda=False)
    assert len(by_step) == 2 and all(d["backward"] > 0 for d in by_step)
    assert trace._records(events + twins, cuda=False) == (ops, kernels, by_step)


def test_on_a_gpu_each_phase_waits_for_its_kernels(monkeypatch):
    """A phase's range is its kernels' time only if it ends by waiting for them (the host queues them):
    training_step waits once per phase, on the loss's device."""
    from types import SimpleNamespace

    from scaletrain.profile import trace

    waited = []
    monkeypatch.setattr(trace, "_finish", lambda t: waited.append(t.shape))
    model = GPT(CFG, seed=0)
    training_step(model, make_batch(CFG, BATCH, seed=1), torch.optim.AdamW(model.parameters(), lr=1e-3))()
    assert waited == [torch.Size([])] * 3
    monkeypatch.undo()
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    trace._finish(torch.zeros(()))  # a CPU tensor: nothing to wait for
    trace._finish(SimpleNamespace(is_cuda=True, device="cuda:0"))
    assert synced == ["cuda:0"]
