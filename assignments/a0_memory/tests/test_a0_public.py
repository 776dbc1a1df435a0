"""Public tests of a0: the worked numbers of the seed and the ZeRO paper, and one real measurement.

The grader runs more: hidden random configurations for every task. Run one task with
`pytest assignments/a0_memory -m task0_3`.
"""

import pytest

from autograder.checks import student_module
from scaletrain.testing import assert_close, expect_equal

mem = student_module("memory", default=__file__)


@pytest.mark.task0_1
def test_task0_1_param_count_equals_a_real_gpt():
    from scaletrain.models import GPT, GPTConfig

    cfg = GPTConfig()
    n = mem.gpt_num_params(vocab_size=cfg.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer,
                           hidden=cfg.n_embd)
    expect_equal(n, sum(p.numel() for p in GPT(cfg).parameters()),
                 what=f"gpt_num_params(vocab_size={cfg.vocab_size}, block_size={cfg.block_size}, "
                      f"n_layer={cfg.n_layer}, hidden={cfg.n_embd}) against the parameters of scaletrain.models.GPT")


@pytest.mark.task0_1
def test_task0_1_seed_gpt1_has_147m_params():
    n = mem.gpt_num_params(vocab_size=40512, block_size=512, n_layer=12, hidden=768, tied_embeddings=False)
    expect_equal(n, 147_675_648, what="gpt_num_params of the seed's GPT-1 (V 40512, s 512, 12 layers, h 768, untied)")


@pytest.mark.task0_2
@pytest.mark.parametrize("precision,optimizer,expected", [
    ("fp32", "adam", (4, 4, 8)), ("mixed", "adam", (2, 2, 12)), ("fp32", "sgd", (4, 4, 0))])
def test_task0_2_bytes_per_param(precision, optimizer, expected):
    expect_equal(tuple(mem.bytes_per_param(precision=precision, optimizer=optimizer)), expected,
                 what=f"bytes_per_param(precision={precision!r}, optimizer={optimizer!r}) as (weights, grads, optimizer)")


@pytest.mark.task0_3
def test_task0_3_seed_gpt1_activations():
    kw = dict(seq_len=512, hidden=768, n_layer=12, n_head=12)
    call = "activation_bytes(seed GPT-1: s 512, h 768, 12 layers, 12 heads, batch_size={}{})"
    expect_equal(mem.activation_bytes(batch_size=1, **kw), 349_175_808, what=call.format(1, ""))
    expect_equal(mem.activation_bytes(batch_size=64, **kw), 64 * 349_175_808, what=call.format(64, ""))
    # checkpointing: 2·s·b·h per layer kept, plus one layer recomputed
    expect_equal(mem.activation_bytes(batch_size=1, checkpointing=True, **kw), 2 * 512 * 768 * 12 + 349_175_808 // 12,
                 what=call.format(1, ", checkpointing=True"))


@pytest.mark.task0_4
def test_task0_4_zero_paper_table():
    gb = [round(mem.zero_memory_per_rank(7_500_000_000, 64, stage, precision="mixed").total / 1e9, 1)
          for stage in range(4)]
    expect_equal(gb, [120.0, 31.4, 16.6, 1.9],
                 what="zero_memory_per_rank(7.5B parameters, 64 ranks, stage 0..3, mixed).total in GB (ZeRO paper, Figure 1)")


@pytest.mark.task0_4
def test_task0_4_uneven_shards_round_up():
    # 10 parameters on 3 ranks: each shard holds ceil(10/3) = 4
    expect_equal(mem.zero_memory_per_rank(10, 3, 3).total, 16 * 4,
                 what="zero_memory_per_rank(10 parameters, 3 ranks, stage 3).total (mixed precision Adam)")


@pytest.mark.task0_4
def test_task0_4_seed_gpt1_total_at_batch_64():
    # needs tasks 0.2, 0.3 and 0.4: 2,940 MB fixed + 64 × 349,175,808 B
    expect_equal(mem.seed_gpt1_example(batch_size=64).total, 25_287_251_712,
                 what="seed_gpt1_example(batch_size=64).total (uses your 0.2, 0.3 and 0.4)")


@pytest.mark.task0_5
def test_task0_5_flops_and_mfu():
    expect_equal(mem.training_flops(num_params=10**9, num_tokens=10**6), 6 * 10**15,
                 what="training_flops(num_params=1e9, num_tokens=1e6)")
    expect_equal(mem.training_flops(num_params=10**9, num_tokens=10**6, recompute=True), 8 * 10**15,
                 what="training_flops(num_params=1e9, num_tokens=1e6, recompute=True)")
    assert_close(mem.mfu(num_params=10**9, tokens_per_second=1e5, peak_flops_per_second=1e15), 0.6, rtol=1e-6,
                 what="mfu(num_params=1e9, tokens_per_second=1e5, peak_flops_per_second=1e15)")


@pytest.mark.task0_6
@pytest.mark.parametrize("checkpointing", [False, True])
def test_task0_6_tiny_gpt_matches_measurement(checkpointing):
    from scaletrain.memory_measure import measure_training_step
    from scaletrain.models import GPT, GPTConfig

    cfg = GPTConfig()
    measured = measure_training_step(GPT(cfg), batch_size=4, checkpointing=checkpointing)
    est = mem.tiny_gpt_activation_bytes(batch_size=4, seq_len=cfg.block_size, hidden=cfg.n_embd, n_layer=cfg.n_layer,
                                        n_head=cfg.n_head, vocab_size=cfg.vocab_size, checkpointing=checkpointing)
    assert_close(est, measured.activations_peak, rtol=0.01,
                 what=f"tiny_gpt_activation_bytes(batch_size=4, default GPTConfig, checkpointing={checkpointing}) "
                      f"against the measured peak of a training step")
