"""Memory by tensor kind over a step (issue 35 item 1): each kind measured at the step's marks against
its closed form (ZeRO §3.1, fp32: parameters and gradients Ψ·4 bytes, Adam's two moments 2Ψ·4 plus a
4-byte step per tensor; the activations `memory.tiny_gpt_activation_bytes`), and when each is held:
activations peak at the end of the forward and are all released by the end of the backward."""

from __future__ import annotations

import pytest
import torch

from scaletrain.memory import tiny_gpt_activation_bytes
from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.profile.memory_timeline import KINDS, memory_timeline

CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=3, n_head=2, n_embd=24)
B = 3


@pytest.fixture(scope="module")
def run():
    model = GPT(CFG, seed=0)
    params = list(model.parameters())
    marks = memory_timeline(model, make_batch(CFG, B, seed=1), torch.optim.AdamW(params, lr=1e-3), steps=2)
    return marks, sum(p.numel() for p in params), len(params)


def _at(marks, step, phase, label):
    return next(m.bytes for m in marks if (m.step, m.phase, m.label) == (step, phase, label))


def test_model_states_match_their_closed_forms(run):
    marks, psi, tensors = run
    assert all(set(m.bytes) == set(KINDS) and m.bytes["parameters"] == 4 * psi for m in marks)  # tied weight once
    assert all(m.bytes["gradients"] == 0 for m in marks if m.phase == "forward")
    for step in (0, 1):
        assert _at(marks, step, "backward", "end")["gradients"] == 4 * psi
        assert _at(marks, step, "optimizer", "step")["gradients"] == 4 * psi
        assert _at(marks, step, "optimizer", "zero_grad")["gradients"] == 0
    adam = 2 * 4 * psi + 4 * tensors
    first = [m for m in marks if m.step == 0]
    before_step = first[:[m.label for m in first].index("step")]
    assert before_step and all(m.bytes["optimizer state"] == 0 for m in before_step)  # Adam allocates lazily
    assert _at(marks, 0, "optimizer", "step")["optimizer state"] == adam
    assert all(m.bytes["optimizer state"] == adam for m in marks if m.step == 1)


def test_activations_peak_at_the_end_of_the_forward_and_are_released_by_the_backward(run):
    marks, _, _ = run
    for step in (0, 1):
        seq = [m for m in marks if m.step == step]
        acts = [m.bytes["activations"] for m in seq]
        end_of_forward = max(i for i, m in enumerate(seq) if m.phase == "forward")
        assert acts[end_of_forward] == max(acts) == tiny_gpt_activation_bytes(
            batch_size=B, seq_len=CFG.block_size, hidden=CFG.n_embd, n_layer=CFG.n_layer, n_head=CFG.n_head,
            vocab_size=CFG.vocab_size)
        assert acts[:end_of_forward + 1] == sorted(acts[:end_of_forward + 1])           # grows through the forward
        backward = [m.bytes for m in seq if m.phase == "backward"]
        assert [b["activations"] for b in backward] == sorted((b["activations"] for b in backward), reverse=True)
        assert [b["gradients"] for b in backward] == sorted(b["gradients"] for b in backward)
        assert backward[-1]["activations"] == 0


def test_every_block_is_marked_forward_then_backward_in_reverse(run):
    marks, _, _ = run
    labels = [(m.phase, m.label) for m in marks if m.step == 0 and m.label.startswith("block")]
    blocks = [f"block {i}" for i in range(CFG.n_layer)]
    assert labels == [("forward", b) for b in blocks] + [("backward", b) for b in reversed(blocks)]
