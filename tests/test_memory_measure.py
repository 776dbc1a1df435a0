"""Estimate vs measurement: scaletrain.memory's predictions against bytes counted in a real CPU step."""

import pytest
import torch

from scaletrain import memory as M
from scaletrain.memory_measure import measure_training_step, storage_bytes
from scaletrain.models import GPT, GPTConfig

# irregular shapes: odd head counts, seq_len below block_size, vocabulary larger than b·s
CASES = [(GPTConfig(), 4, 64), (GPTConfig(vocab_size=97, block_size=40, n_layer=3, n_embd=48, n_head=3), 3, 37),
         (GPTConfig(vocab_size=1000, block_size=16, n_layer=5, n_embd=20, n_head=5), 2, 13)]
IDS = ["default", "L3h48", "L5V1000"]
REL_TOL = 0.01  # the stated tolerance; on torch 2.13 CPU the agreement is exact


def _estimate(cfg, b, s, checkpointing):
    return M.tiny_gpt_activation_bytes(batch_size=b, seq_len=s, hidden=cfg.n_embd, n_layer=cfg.n_layer,
                                       n_head=cfg.n_head, vocab_size=cfg.vocab_size, checkpointing=checkpointing)


@pytest.mark.parametrize("cfg,b,s", CASES, ids=IDS)
def test_saved_activations_match_the_tiny_gpt_estimate(cfg, b, s):
    plain = measure_training_step(GPT(cfg), batch_size=b, seq_len=s)
    assert plain.activations == pytest.approx(_estimate(cfg, b, s, False), rel=REL_TOL)
    # nothing new is saved during the backward, so the peak is the end of the forward
    assert plain.activations_peak == plain.activations
    assert sum(plain.saved_by_module.values()) == plain.activations
    ckpt = measure_training_step(GPT(cfg), batch_size=b, seq_len=s, checkpointing=True)
    assert ckpt.activations_peak == pytest.approx(_estimate(cfg, b, s, True), rel=REL_TOL)
    # checkpointing keeps only block inputs: 4·s·b·h bytes per layer through the forward
    assert ckpt.saved_by_module["CheckpointedBlock"] == cfg.n_layer * 4 * s * b * cfg.n_embd
    assert ckpt.activations < plain.activations


@pytest.mark.parametrize("optimizer", M.OPTIMIZERS)
def test_model_states_match_the_estimate(optimizer):
    cfg = CASES[1][0]
    measured = measure_training_step(GPT(cfg), batch_size=2, optimizer=optimizer)
    n = M.gpt_num_params(vocab_size=cfg.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer,
                         hidden=cfg.n_embd)
    est = M.model_states_bytes(n, precision="fp32", optimizer=optimizer)
    # torch's Adam/AdamW keep a 4-byte float32 `step` scalar per parameter tensor on CPU
    steps = 4 * measured.num_param_tensors if optimizer.startswith("adam") else 0
    assert (measured.params, measured.grads, measured.optimizer) == (est.params, est.grads, est.optimizer + steps)


def test_checkpointing_changes_memory_not_the_update():
    cfg = CASES[1][0]
    plain, ckpt = GPT(cfg, seed=3), GPT(cfg, seed=3)
    measure_training_step(plain, batch_size=3, seq_len=37)
    measure_training_step(ckpt, batch_size=3, seq_len=37, checkpointing=True)
    assert type(ckpt.blocks[0]).__name__ == "Block"  # the wrapper is removed after the step
    for p, q in zip(plain.parameters(), ckpt.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7)


def test_storage_bytes_counts_shared_storage_once():
    x = torch.zeros(10, 6)
    assert storage_bytes([x, x[2:], x.t(), torch.zeros(3, dtype=torch.float64)]) == 240 + 24


def test_measure_rejects_bad_input():
    with pytest.raises(TypeError, match="must be a scaletrain.models.GPT"):
        measure_training_step(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        measure_training_step(GPT(GPTConfig(n_layer=1)), optimizer="lion")
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        measure_training_step(GPT(GPTConfig(n_layer=1)), batch_size=0)
