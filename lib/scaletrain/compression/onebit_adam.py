"""1-bit Adam: Adam's variance frozen after a warm-up, then momentum exchanged at 1 bit per element
through a compressed allreduce with error compensation on the worker and the server side.

Tang et al., 2021, "1-bit Adam: Communication Efficient Large-Scale Training with Adam's Convergence
Speed", Algorithm 1; seminar notes §1.2.8.1.1; `additional-techniques.md` §3 ("1-Bit Compressive
Optimizers"). Adam's update m/√v is non-linear in the gradient, so error feedback cannot be applied
to it directly; after the variance v has stabilized it is frozen, and the remaining update is
momentum SGD preconditioned by a constant 1/√v, which is linear in the momentum m, so m can be
compressed with error feedback.

    warm-up (t ≤ T_w): g ← mean over ranks of the gradients (fp32 ring allreduce)
                       m ← β₁m + (1−β₁)g,  v ← β₂v + (1−β₂)g²,  x ← x − lr·(m/(√v+ε) + λx)
    compression (t > T_w): m ← β₁m + (1−β₁)g_local             (v frozen: the value at T_w)
                       m ← compressed_allreduce(m)               (identical on every rank)
                       x ← x − lr·(m/(√v+ε) + λx)
As in the authors' implementation (DeepSpeed's OnebitAdam) there is no bias correction by default:
v is frozen as accumulated. That is harmless after thousands of warm-up steps, but after T_w = 30
steps with β₂ = 0.999 the accumulated v is only 1 − β₂^30 ≈ 3 % of the bias-corrected one (and m
96 %), so every step is about 5.6× torch Adam's. `bias_correction=True` divides as torch's Adam
does: m by 1 − β₁^t at every step and v by 1 − β₂^t during warm-up, which freezes
v̂ = v_{T_w}/(1 − β₂^{T_w}), the very value Adam used at step T_w (no jump in step size when the
warm-up ends); the warm-up is then torch's Adam on the mean gradient, step for step.

compressed_allreduce (Tang et al., Algorithm 1, "Compression stage"; p ranks, every rank "server"
of one chunk): the flat tensor (padded to p·c, c = ⌈n/p⌉) plus the worker error e_w is split into p
chunks; each chunk is compressed to signs + one scale (‖chunk‖₁/valid elements) and chunk j is sent
to rank j (p−1 messages); rank j averages the p decompressed chunks it holds, adds its server error
e_s, compresses again (e_s ← z − C(z)) and the compressed results are all-gathered with our ring
(p−1 messages). Each message is ⌈c/32⌉ + 1 int32 words, so one rank sends exactly

    2(p − 1) · 4 · (⌈c/32⌉ + 1) bytes   vs   2(p − 1) · 4 · c  for the fp32 ring allreduce  (≈ 1/32).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch
import torch.distributed as dist

from scaletrain.comm import record_send, ring_all_gather, ring_allreduce
from scaletrain.compression.onebit import pack_signs, unpack_signs

__all__ = ["compressed_allreduce_bytes", "CompressedAllreduceState", "compressed_allreduce", "OneBitAdam"]


def compressed_allreduce_bytes(n: int, p: int) -> int:
    """Bytes one rank sends in `compressed_allreduce` of n elements over p ranks."""
    return 2 * (p - 1) * 4 * (math.ceil(math.ceil(n / p) / 32) + 1)


def _compress(chunk: torch.Tensor, valid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(message = sign words + scale as int32, decompressed chunk with zeros past `valid`)."""
    scale = chunk[:valid].abs().sum() / max(valid, 1)
    words = pack_signs(chunk)
    dec = _decompress(words, scale.reshape(1).view(torch.int32), chunk.numel(), valid)
    return torch.cat([words, scale.reshape(1).view(torch.int32)]), dec


def _decompress(words: torch.Tensor, scale_word: torch.Tensor, c: int, valid: int) -> torch.Tensor:
    out = unpack_signs(words, c) * scale_word.view(torch.float32)
    out[valid:] = 0
    return out


class CompressedAllreduceState:
    """The worker error (p·c elements) and server error (c elements) of one tensor, kept by the caller."""

    def __init__(self):
        self.worker_error: torch.Tensor | None = None
        self.server_error: torch.Tensor | None = None


def compressed_allreduce(x: torch.Tensor, state: CompressedAllreduceState, group: Any = None) -> torch.Tensor:
    """≈ the mean of the flat fp32 `x` over the ranks, sent at 1 bit per element (see module doc)."""
    p, r = dist.get_world_size(group), dist.get_rank(group)
    n = x.numel()
    c = math.ceil(n / p)
    y = torch.zeros(p * c)
    y[:n] = x.reshape(-1)
    if state.worker_error is None:
        state.worker_error, state.server_error = torch.zeros(p * c), torch.zeros(c)
    y += state.worker_error
    valid = [max(0, min(c, n - j * c)) for j in range(p)]
    messages, decoded = zip(*(_compress(y[j * c:(j + 1) * c], valid[j]) for j in range(p)))
    state.worker_error = y - torch.cat(decoded)
    # phase 1: chunk j to rank j (an all-to-all of 1-bit messages), every send counted
    words = messages[0].numel()
    received = [torch.empty(words, dtype=torch.int32) for _ in range(p)]
    received[r] = messages[r]
    handles = []
    for j in range(p):
        if j == r:
            continue
        peer = j if group is None else dist.get_global_rank(group, j)
        handles.append(dist.irecv(received[j], src=peer, group=group))
        handles.append(dist.isend(messages[j].contiguous(), dst=peer, group=group))
        record_send(messages[j].numel() * 4)
    for h in handles:
        h.wait()
    z = sum(_decompress(m[:-1], m[-1:], c, valid[r]) for m in received) / p
    z += state.server_error
    mine, z_hat = _compress(z, valid[r])
    state.server_error = z - z_hat
    # phase 2: all-gather the servers' compressed chunks with our ring
    gathered = ring_all_gather(mine, p * words, group=group).view(p, words)
    out = torch.cat([_decompress(gathered[j, :-1], gathered[j, -1:], c, valid[j]) for j in range(p)])
    return out[:n].view_as(x)


class OneBitAdam(torch.optim.Optimizer):
    """1-bit Adam over the ranks of `group`; it synchronizes gradients itself (use it on an unwrapped
    module whose replicas start identical, e.g. after `scaletrain.dp.broadcast_module`).

    Args: lr, betas, eps, weight_decay (added to the update, as DeepSpeed does), warmup_steps (T_w:
    steps of full-precision Adam before v is frozen), bias_correction (torch Adam's; default off, as
    in DeepSpeed: see the module doc), group."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, warmup_steps: int = 100,
                 bias_correction: bool = False, group: Any = None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.warmup_steps, self.bias_correction, self.group = warmup_steps, bias_correction, group
        self.steps = 0
        self.comm = CompressedAllreduceState()

    def _params(self):
        return [x for g in self.param_groups for x in g["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._params()
        for x in params:
            if x.grad is None:
                x.grad = torch.zeros_like(x)
            if not self.state[x]:
                self.state[x]["exp_avg"], self.state[x]["exp_avg_sq"] = torch.zeros_like(x), torch.zeros_like(x)
        self.steps += 1
        p = dist.get_world_size(self.group)
        grads = torch.cat([x.grad.reshape(-1) for x in params])
        momenta = torch.cat([self.state[x]["exp_avg"].reshape(-1) for x in params])
        b1, b2 = self.param_groups[0]["betas"]
        if self.steps <= self.warmup_steps:
            ring_allreduce(grads, op="sum", group=self.group)
            grads /= p
            momenta.mul_(b1).add_(grads, alpha=1 - b1)
        else:
            momenta.mul_(b1).add_(grads, alpha=1 - b1)
            momenta = compressed_allreduce(momenta, self.comm, self.group)
        # torch Adam's corrections: v's stops changing when v freezes, so v̂ freezes with it
        m_scale, v_scale = 1.0, 1.0
        if self.bias_correction:
            m_scale = 1 - b1 ** self.steps
            v_scale = 1 - b2 ** min(self.steps, self.warmup_steps)
        o = 0
        for group in self.param_groups:
            for x in group["params"]:
                k = x.numel()
                st = self.state[x]
                st["exp_avg"].copy_(momenta[o:o + k].view_as(x))
                if self.steps <= self.warmup_steps:
                    g = grads[o:o + k].view_as(x)
                    st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
                update = (st["exp_avg"] / m_scale) / ((st["exp_avg_sq"] / v_scale).sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(x, alpha=group["weight_decay"])
                x.sub_(update, alpha=group["lr"])
                o += k
        return loss
