"""scaletrain.memory against closed forms, the seed's GPT-1 example and the ZeRO paper's table."""

from fractions import Fraction

import pytest
import torch.nn as nn

from scaletrain import memory as M
from scaletrain.models import GPT, GPTConfig

CONFIGS = [GPTConfig(), GPTConfig(vocab_size=97, block_size=37, n_layer=3, n_embd=48, n_head=3),
           GPTConfig(vocab_size=1000, block_size=16, n_layer=1, n_embd=20, n_head=5)]


def _shape(cfg):
    return dict(vocab_size=cfg.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer, hidden=cfg.n_embd)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"L{c.n_layer}h{c.n_embd}V{c.vocab_size}")
def test_num_params_equals_a_real_gpt(cfg):
    model = GPT(cfg)
    assert M.gpt_num_params(**_shape(cfg)) == sum(p.numel() for p in model.parameters())
    # untie the head: a second V·h tensor appears, and the count must follow it
    model.lm_head.weight = nn.Parameter(model.wte.weight.detach().clone())
    assert M.gpt_num_params(**_shape(cfg), tied_embeddings=False) == sum(p.numel() for p in model.parameters())


def test_num_params_of_the_seed_gpt1():
    shape = {k: v for k, v in M.GPT1.items() if k != "n_head"}
    n = M.gpt_num_params(**shape, tied_embeddings=False)
    assert n == 147_675_648 and 147 * M.MB <= n < 148 * M.MB  # the seed's "~147m"


@pytest.mark.parametrize("precision,optimizer,expected", [
    ("fp32", "adam", (4, 4, 8)), ("fp32", "adamw", (4, 4, 8)), ("fp32", "sgd", (4, 4, 0)),
    ("fp32", "sgd_momentum", (4, 4, 4)), ("mixed", "adam", (2, 2, 12)), ("mixed", "adamw", (2, 2, 12)),
    ("mixed", "sgd", (2, 2, 4)), ("mixed", "sgd_momentum", (2, 2, 8))])
def test_bytes_per_param_table(precision, optimizer, expected):
    assert M.bytes_per_param(precision=precision, optimizer=optimizer) == expected
    states = M.model_states_bytes(1000, precision=precision, optimizer=optimizer)
    assert (states.params, states.grads, states.optimizer) == tuple(1000 * x for x in expected)


def _korthikanti(s, b, h, L, a, t):
    """The seed's per-sample form, in exact rationals: s·b·h·L·(10 + 24/t + 5·a·s/(h·t))."""
    return s * b * h * L * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t))


@pytest.mark.parametrize("s,b,h,L,a,t", [(512, 1, 768, 12, 12, 1), (2048, 3, 4096, 32, 32, 8),
                                         (37, 5, 48, 3, 3, 3), (100, 2, 60, 7, 6, 2)])
def test_activation_bytes_is_korthikanti(s, b, h, L, a, t):
    kw = dict(seq_len=s, batch_size=b, hidden=h, n_layer=L, n_head=a)
    assert M.activation_bytes(**kw, tp=t) == _korthikanti(s, b, h, L, a, t)
    # without TP, the 2022 paper's s·b·h·(34 + 5·a·s/h) per layer
    assert M.activation_bytes(**kw) == s * b * h * L * (34 + Fraction(5 * a * s, h))
    one_layer = M.activation_bytes(**{**kw, "n_layer": 1}, tp=t)
    assert M.activation_bytes(**kw, tp=t, checkpointing=True) == 2 * s * b * h * L + one_layer
    # fp32 activations: every element doubles, the 1-byte dropout masks (2·sbh + a·s²·b) do not
    masks = L * (2 * s * b * h + a * s * s * b // t)
    assert M.activation_bytes(**kw, tp=t, bytes_per_element=4) == 2 * (M.activation_bytes(**kw, tp=t) - masks) + masks


def test_seed_gpt1_example_numbers():
    ex = M.seed_gpt1_example(batch_size=1)
    assert ex.states.total == 2_940 * M.MB                # "2940m" fixed bytes
    assert ex.activations == 349_175_808                  # per sequence
    at64 = M.seed_gpt1_example(batch_size=64)
    assert at64.total == 2_940 * M.MB + 64 * 349_175_808 == 25_287_251_712
    assert round(at64.total / M.GB, 1) == 25.3
    # the ZeRO paper's 16 B/param is 4 B/param below the seed's double-counted master copy
    zero_view = M.model_states_bytes(147 * M.MB, precision="mixed", optimizer="adamw").total
    assert zero_view == 2_352 * M.MB == ex.states.total - 4 * 147 * M.MB


def test_zero_paper_table():
    psi, n = 7_500_000_000, 64
    gb = [round(M.zero_memory_per_rank(psi, n, stage, precision="mixed").total / M.GB, 1) for stage in range(4)]
    assert gb == [120.0, 31.4, 16.6, 1.9]


@pytest.mark.parametrize("psi,n", [(6_400, 64), (1_000_003, 7), (10, 3), (5, 8)])
def test_zero_fp32_closed_forms(psi, n):
    shard = -(-psi // n)
    totals = [M.zero_memory_per_rank(psi, n, stage).total for stage in range(4)]
    assert totals == [16 * psi, 8 * psi + 8 * shard, 4 * psi + 12 * shard, 16 * shard]
    assert totals == sorted(totals, reverse=True)
    s3 = M.zero_memory_per_rank(psi, n, 3, precision="mixed", optimizer="sgd_momentum")
    assert (s3.params, s3.grads, s3.optimizer) == (2 * shard, 2 * shard, 8 * shard)


def test_zero_on_one_rank_is_plain_training():
    for stage in range(4):
        assert M.zero_memory_per_rank(12_345, 1, stage) == M.model_states_bytes(12_345)


def test_flops_and_mfu():
    assert M.training_flops(num_params=7 * 10**9, num_tokens=10**12) == 42 * 10**21
    assert M.training_flops(num_params=7 * 10**9, num_tokens=10**12, recompute=True) == 56 * 10**21
    # 1B params at 100k tokens/s on a 1 PFLOP/s device: 6e14 / 1e15
    assert M.mfu(num_params=10**9, tokens_per_second=1e5, peak_flops_per_second=1e15) == pytest.approx(0.6)


def test_tiny_gpt_variant_is_the_seed_formula_adapted():
    """fp32 seed formula, minus dropout masks and the a·s² terms, plus LN stats and logsumexp."""
    s, b, h, L, a, V = 37, 3, 48, 3, 3, 97
    kw = dict(seq_len=s, batch_size=b, hidden=h, n_layer=L, n_head=a)
    seed_fp32 = M.activation_bytes(**kw, bytes_per_element=4)
    layers = seed_fp32 - L * (2 * s * b * h + 9 * a * s * s * b) + L * (16 * s * b + 4 * a * s * b)
    outside = 8 * s * b + 8 * s + 8 * s * b * h + 8 * s * b + 4 * s * b * V + 8 * s * b + 4
    assert M.tiny_gpt_activation_bytes(**kw, vocab_size=V) == layers + outside


def test_training_memory_composes_the_parts():
    kw = dict(seq_len=512, batch_size=8, hidden=768, n_layer=12, n_head=12)
    tm = M.training_memory(num_params=10**8, **kw, zero_stage=2, world_size=4, checkpointing=True)
    assert tm.states == M.zero_memory_per_rank(10**8, 4, 2, precision="mixed")
    assert tm.activations == M.activation_bytes(**kw, checkpointing=True)
    assert tm.total == tm.states.total + tm.activations
    fp32 = M.training_memory(num_params=10**8, **kw, precision="fp32")
    assert fp32.activations == M.activation_bytes(**kw, bytes_per_element=4)


@pytest.mark.parametrize("call,exc,words", [
    (lambda: M.gpt_num_params(vocab_size=0, block_size=8, n_layer=1, hidden=8), ValueError, "vocab_size must be >= 1"),
    (lambda: M.gpt_num_params(vocab_size=8, block_size=8, n_layer=2.0, hidden=8), TypeError, "n_layer must be an int"),
    (lambda: M.bytes_per_param(optimizer="lion"), ValueError, "choose one of adam, adamw"),
    (lambda: M.bytes_per_param(precision="fp16"), ValueError, "choose one of fp32, mixed"),
    (lambda: M.activation_bytes(seq_len=8, batch_size=1, hidden=10, n_layer=1, n_head=3), ValueError,
     "hidden=10 must be divisible by n_head=3"),
    (lambda: M.activation_bytes(seq_len=8, batch_size=1, hidden=12, n_layer=1, n_head=6, tp=4), ValueError,
     "divisible by tp=4"),
    (lambda: M.activation_bytes(seq_len=8, batch_size=1, hidden=12, n_layer=1, n_head=6, bytes_per_element=3),
     ValueError, "bytes_per_element must be 2"),
    (lambda: M.zero_memory_per_rank(100, 4, 4), ValueError, "stage must be 0, 1, 2 or 3"),
    (lambda: M.zero_memory_per_rank(100, 0, 1), ValueError, "world_size must be >= 1"),
    (lambda: M.zero_memory_per_rank(True, 2, 1), TypeError, "num_params must be an int"),
    (lambda: M.training_flops(num_params=10, num_tokens=-1), ValueError, "num_tokens must be >= 1"),
    (lambda: M.mfu(num_params=10, tokens_per_second=0, peak_flops_per_second=1e12), ValueError,
     "tokens_per_second must be a positive number"),
    (lambda: M.tiny_gpt_activation_bytes(batch_size=1, seq_len=8, hidden=8, n_layer=1, n_head=2, vocab_size=0),
     ValueError, "vocab_size must be >= 1"),
    (lambda: M.MemoryBreakdown(params=-1, grads=0, optimizer=0), ValueError, "params must be >= 0"),
    (lambda: M.MemoryBreakdown(1, 2, 3), TypeError, "positional"),
])
def test_bad_input_names_the_problem(call, exc, words):
    with pytest.raises(exc, match=words):
        call()
