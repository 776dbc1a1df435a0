"""Knowledge distillation (scaletrain.infer.distill) against its formulas: the loss equals
α·T²·F.kl_div + (1 − α)·F.cross_entropy, the soft term's gradient is T·(q − p)/N in closed form and
tends to (z_s − z_t)/(V·N) for large T whatever T (the T² factor), the teacher gets no gradient,
and `fit` moves a student towards its teacher more than the labels alone do."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from scaletrain.infer import distillation_loss, fit
from scaletrain.models import GPT, GPTConfig
from scaletrain.testing import assert_close


def _logits(seed: int, shape=(3, 5, 11)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z_s, z_t = (torch.randn(shape, generator=g, dtype=torch.float64) * 3 for _ in range(2))
    return z_s, z_t, torch.randint(0, shape[-1], shape[:-1], generator=g)


@pytest.mark.parametrize("temperature,alpha", [(1.0, 0.5), (2.0, 0.9), (4.0, 0.3), (0.5, 1.0), (3.0, 0.0)])
def test_loss_is_the_weighted_kl_and_cross_entropy(temperature, alpha):
    z_s, z_t, y = _logits(int(temperature * 10))
    V = z_s.shape[-1]
    log_q, log_p = ((z / temperature).log_softmax(-1).reshape(-1, V) for z in (z_s, z_t))
    kl = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
    want = alpha * temperature**2 * kl + (1 - alpha) * F.cross_entropy(z_s.reshape(-1, V), y.flatten())
    assert_close(distillation_loss(z_s, z_t, y, temperature=temperature, alpha=alpha), want, rtol=1e-12)


@pytest.mark.parametrize("temperature", [0.7, 2.0, 5.0])
def test_soft_gradient_is_t_times_q_minus_p_over_n(temperature):
    z_s, z_t, y = _logits(7)
    z_s.requires_grad_(True)
    distillation_loss(z_s, z_t, y, temperature=temperature, alpha=1.0).backward()
    n = z_s.shape[0] * z_s.shape[1]
    q, p = (z_s.detach() / temperature).softmax(-1), (z_t / temperature).softmax(-1)
    assert_close(z_s.grad, temperature**2 * (q - p) / temperature / n, rtol=1e-10)


def test_t_squared_keeps_the_soft_gradient_independent_of_t():
    z_s, z_t, y = _logits(3)
    z_s, z_t = z_s - z_s.mean(-1, keepdim=True), z_t - z_t.mean(-1, keepdim=True)  # Hinton §2.1's zero-mean logits
    n, V = z_s.shape[0] * z_s.shape[1], z_s.shape[-1]
    grads = {}
    for temperature in (50.0, 100.0, 200.0):
        z = z_s.clone().requires_grad_(True)
        distillation_loss(z, z_t, y, temperature=temperature, alpha=1.0).backward()
        grads[temperature] = z.grad
    limit = (z_s - z_t) / (V * n)
    assert all((g - limit).norm() / limit.norm() < 0.1 for g in grads.values())
    assert_close(grads[100.0], grads[200.0], rtol=0.05)  # without T², T = 200's would be a quarter of T = 100's


def test_the_teacher_gets_no_gradient():
    z_s, z_t, y = _logits(1)
    z_s.requires_grad_(True)
    z_t.requires_grad_(True)
    distillation_loss(z_s, z_t, y).backward()
    assert z_t.grad is None and z_s.grad is not None


@pytest.mark.parametrize("kwargs,name", [({"temperature": 0.0}, "temperature"), ({"alpha": 1.5}, "alpha"),
                                         ({"alpha": -0.1}, "alpha")])
def test_bad_arguments_name_themselves(kwargs, name):
    z_s, z_t, y = _logits(0)
    with pytest.raises(ValueError, match=name):
        distillation_loss(z_s, z_t, y, **kwargs)


def _random_batches(vocab: int, seq: int, seed: int, *, successor: bool = False):
    """(idx, targets) of random tokens: the next token random, or idx + 1 (a law the labels teach)."""
    g = torch.Generator().manual_seed(seed)
    while True:
        idx = torch.randint(0, vocab, (8, seq + 1), generator=g)
        yield (idx[:, :-1], (idx[:, :-1] + 1) % vocab) if successor else (idx[:, :-1], idx[:, 1:])


@torch.no_grad()
def _kl_to(teacher, student, idx) -> float:
    return float(F.kl_div(student(idx)[0].log_softmax(-1).flatten(0, 1), teacher(idx)[0].log_softmax(-1).flatten(0, 1),
                          log_target=True, reduction="batchmean"))


SMALL = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16)


def test_fit_distils_towards_the_teacher():
    teacher = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=32), seed=1).eval()
    with torch.no_grad():
        teacher.wte.weight.mul_(30.0)  # sharp next-token laws the random labels do not follow
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    held_out = next(_random_batches(16, 8, seed=99))[0]
    kl = {}
    for name, source in (("scratch", None), ("distilled", teacher)):
        student = GPT(SMALL, seed=0)
        losses = fit(student, _random_batches(16, 8, seed=0), 20, lr=1e-2, teacher=source, alpha=1.0)
        kl[name] = _kl_to(teacher, student, held_out)
        assert not student.training and len(losses) == 20
    assert kl["distilled"] < 0.6 * kl["scratch"], kl
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())  # the teacher only reads


def test_fit_without_a_teacher_learns_the_labels():
    student = GPT(SMALL, seed=0)
    losses = fit(student, _random_batches(16, 8, seed=0, successor=True), 50, lr=1e-2)
    assert losses[0] > 0.8 * math.log(16) and losses[-1] < 0.4 * math.log(16), (losses[0], losses[-1])
