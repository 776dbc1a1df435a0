"""Public tests of a11: your categoriser, op costs, step tables and progressive layer dropping on small
hand-made cases, against closed forms and the course's GPT computed here.

One task at a time: `pytest assignments/a11_profiling -m task11_2`. The grader runs more: the op
names of real CPU and GPU traces, hidden shapes and dtypes, hidden profiles, hidden schedules, gates
sampled thousands of times, and dropped blocks in hidden GPTs.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from autograder.checks import student_module
from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.testing import assert_close, expect_equal

categories = student_module("profile_categories", default=__file__)
cost = student_module("profile_cost", default=__file__)
tables = student_module("profile_tables", default=__file__)
pld = student_module("profile_pld", default=__file__)

NAMES = {"aten::addmm": "matmul", "aten::mm": "matmul",
         "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
         "aten::native_layer_norm": "normalization", "aten::_softmax": "normalization", "aten::gelu": "activation",
         "aten::add": "elementwise", "aten::mul_": "elementwise", "aten::embedding": "other", "aten::view": "other",
         "AddmmBackward0": "matmul", "GeluBackward0": "activation",
         "autograd::engine::evaluate_function: NativeLayerNormBackward0": "normalization",
         "aten::_foreach_mul_": "optimizer", "c10d::allreduce_": "communication", "nccl:all_reduce": "communication"}


@pytest.mark.task11_1
@pytest.mark.parametrize("name,category", NAMES.items())
def test_task11_1_categories_of_a_gpt_step(name, category):
    expect_equal(categories.categorise(name), category, what=f"categorise({name!r})")


@pytest.mark.task11_2
def test_task11_2_matmul_costs_2mnk_and_moves_each_operand_once():
    m, k, n = 37, 53, 29
    mm = cost.op_cost("aten::mm", [[m, k], [k, n]], ["float", "float"])
    expect_equal((mm.flops, mm.bytes), (2 * m * n * k, 4 * (m * k + k * n + m * n)),
                 what="op_cost(aten::mm 37x53 @ 53x29)")
    addmm = cost.op_cost("aten::addmm", [[n], [m, k], [k, n], [], []], ["float"] * 3 + ["Scalar"] * 2)
    expect_equal((addmm.flops, addmm.bytes), (2 * m * n * k, 4 * (n + m * k + k * n + m * n)),
                 what="op_cost(aten::addmm, bias [29])")


@pytest.mark.task11_2
def test_task11_2_elementwise_and_layer_norm_are_memory_bound():
    add = cost.op_cost("aten::add", [[1000], [1000], []], ["float", "float", "Scalar"])
    expect_equal(add.bytes, 3 * 1000 * 4, what="op_cost(aten::add of two 1000-element fp32 tensors).bytes")
    assert 1 <= add.flops / 1000 <= 20, f"op_cost(aten::add).flops = {add.flops}: 1 to 20 per element"
    rows, h = 64, 96
    bf16 = "c10::BFloat16"
    ln = cost.op_cost("aten::native_layer_norm", [[rows, h], [], [h], [h], []],
                      [bf16, "ScalarList", bf16, bf16, "Scalar"])
    assert 2 * rows * h * 2 <= ln.bytes <= (2 * rows * h + 2 * rows + 4 * h) * 2, f"LayerNorm bf16 bytes {ln.bytes}"
    assert ln.flops / ln.bytes < 20, "LayerNorm's intensity is a few FLOPs per byte: memory-bound on any GPU"
    view = cost.op_cost("aten::view", [[4, 6], []], ["float", "ScalarList"])
    assert view is None, f"op_cost(aten::view) = {view}: expected None (no tensor work this model prices)"


def _profile(steps: int):
    """Two ops per phase per step; the forward's matmul 3 ms, its GeLU 1 ms, and so on."""
    times = {"forward": [("aten::addmm", "matmul", 3e-3), ("aten::gelu", "activation", 1e-3)],
             "backward": [("AddmmBackward0", "matmul", 6e-3), ("GeluBackward0", "activation", 2e-3)],
             "optimizer": [("aten::_foreach_mul_", "optimizer", 1e-3), ("aten::_foreach_add_", "optimizer", 1e-3)]}
    ops = [SimpleNamespace(name=n, phase=p, category=c, seconds=s, step=i, cost=None, shapes=())
           for i in range(steps) for p, row in times.items() for n, c, s in row]
    kernels = [SimpleNamespace(**vars(o) | {"cost": SimpleNamespace(flops=1e9, bytes=1e6)}) for o in ops
               if o.category == "matmul"]
    return SimpleNamespace(ops=ops, kernels=kernels, steps=steps, phase_seconds={"forward": 5e-3 * steps,
                           "backward": 9e-3 * steps, "optimizer": 2e-3 * steps}, device="cpu",
                           by_step=[{"forward": 5e-3, "backward": 9e-3, "optimizer": 2e-3}] * steps)


@pytest.mark.task11_3
@pytest.mark.parametrize("steps", [1, 3])
def test_task11_3_time_by_category_and_phase_per_step(steps):
    got = tables.category_seconds(_profile(steps))
    want = {("forward", "matmul"): 3e-3, ("forward", "activation"): 1e-3, ("backward", "matmul"): 6e-3,
            ("backward", "activation"): 2e-3, ("optimizer", "optimizer"): 2e-3}
    for key, seconds in want.items():
        assert_close(got.get(key, 0.0), seconds, rtol=1e-9, what=f"category_seconds(...)[{key}] with {steps} steps")


@pytest.mark.task11_3
def test_task11_3_mfu_of_a_16_ms_step():
    machine = SimpleNamespace(peak_flops=1e12, bandwidth=1e11, device="cpu")
    row = tables.step_mfu(_profile(2), machine, num_params=10**6, tokens=1000)
    assert_close(row["step ms"], 16.0, rtol=1e-9, what="step_mfu: step ms")
    assert_close(row["model GFLOP (6NT)"], 6.0, rtol=1e-9, what="step_mfu: 6·N·T in GFLOP")
    assert_close(row["MFU %"], 100 * 6e9 / 16e-3 / 1e12, rtol=1e-9, what="step_mfu: MFU %")
    assert_close(row["counted GFLOP"], 2.0, rtol=1e-9, what="step_mfu: counted GFLOP per step")


@pytest.mark.task11_4
def test_task11_4_theta_starts_at_one_and_decays_towards_theta_bar():
    assert_close(pld.theta(0), 1.0, rtol=1e-12, what="theta(0)")
    values = [pld.theta(t) for t in (0, 10, 100, 1000, 10_000, 100_000)]
    assert all(a >= b for a, b in zip(values, values[1:])), f"theta must not increase: {values}"
    assert_close(values[-1], 0.5, rtol=1e-9, what="theta(100000) with the defaults θ̄ = 0.5, γ = 0.001")


@pytest.mark.task11_4
@pytest.mark.parametrize("t", [0, 700])
def test_task11_4_keep_probabilities_fall_with_depth_to_theta(t):
    p = pld.keep_probabilities(t, 12)
    expect_equal(len(p), 12, what="one probability per layer")
    assert all(a >= b for a, b in zip(p, p[1:])), f"deeper layers keep less: {p}"
    assert_close(p[-1], pld.theta(t), rtol=1e-9, what=f"keep_probabilities({t}, 12)[-1]: the deepest layer at θ(t)")
    assert_close(sum(p), 12 - 13 * (1 - pld.theta(t)) / 2, rtol=1e-9, what="expected kept layers Σ p_i")


@pytest.mark.task11_4
def test_task11_4_gates_follow_their_probabilities():
    gen, probs, n = torch.Generator().manual_seed(0), [1.0, 0.7, 0.3, 0.0], 3000
    kept = torch.tensor([pld.sample_gates(probs, gen) for _ in range(n)], dtype=torch.float64).mean(0)
    for f, p in zip(kept.tolist(), probs):
        assert abs(f - p) <= 5 * math.sqrt(p * (1 - p) / n), f"kept in {f:.3f} of draws, p = {p}"
    first, again = (torch.Generator().manual_seed(7) for _ in range(2))
    assert [pld.sample_gates(probs, first) for _ in range(20)] == [pld.sample_gates(probs, again) for _ in range(20)], \
        "two generators with the same seed gave other gates: draw from the generator given"


@pytest.mark.task11_4
def test_task11_4_a_dropped_block_is_the_identity():
    cfg = GPTConfig(vocab_size=40, block_size=10, n_layer=3, n_head=2, n_embd=16)
    idx, targets = make_batch(cfg, 2, seed=1)
    logits = pld.pld_forward(GPT(cfg, seed=0), idx, targets, [True, False, True], [1.0] * 3)[0]
    short = GPT(cfg, seed=0)
    short.blocks = torch.nn.ModuleList([short.blocks[0], short.blocks[2]])
    assert_close(logits, short(idx)[0], rtol=1e-5, what="pld_forward with block 1 dropped vs the model without it")
