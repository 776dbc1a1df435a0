"""a10's references, computed on the trusted side before any student code runs, token by token and
in plain Python where the rule is discrete: nothing here calls scaletrain.moe.

    top-k       softmax, a descending sort (not topk), the gates renormalised for k > 1 (GShard)
    balance     Switch eq. 4-6: N·Σ fᵢ·Pᵢ, fᵢ over the k·T choices; ∂/∂p[t, i] = N·fᵢ/T
    capacity    ⌈k·T·cf/E⌉ in exact fractions, at least 1
    kept        GShard's priority: first choices of every token in token order, then second choices...
    layer       each token through each kept expert, one at a time, with autograd
"""

from __future__ import annotations

import math
from fractions import Fraction


def _torch():
    import torch
    return torch


def top_k(logits, k: int, normalize, w) -> dict:
    torch = _torch()
    x = logits.detach().clone().requires_grad_(True)
    probs = torch.softmax(x, dim=-1)
    order = torch.sort(probs.detach(), dim=-1, descending=True, stable=True).indices[:, :k]
    top = probs.gather(1, order)
    if (k > 1) if normalize is None else normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    (top * w).sum().backward()
    return {"probs": probs.detach(), "experts": order, "gates": top.detach(), "grad": x.grad}


def balance(probs, experts) -> dict:
    """Loss and its gradient with respect to `probs` (T, N), from the (T, k) choices."""
    torch = _torch()
    t, n = probs.shape
    counts = [0] * n
    for e in experts.reshape(-1).tolist():
        counts[e] += 1
    f = [c / experts.numel() for c in counts]
    p = [sum(probs[:, i].tolist()) / t for i in range(n)]
    loss = n * sum(fi * pi for fi, pi in zip(f, p))
    grad = torch.tensor([[n * fi / t for fi in f]] * t, dtype=probs.dtype)
    return {"loss": loss, "grad": grad}


def capacity(*, tokens: int, num_experts: int, capacity_factor: float, k: int = 1) -> int:
    return max(1, math.ceil(Fraction(k * tokens) * Fraction(capacity_factor) / num_experts))


def kept(experts: list[list[int]], num_experts: int, cap: int) -> tuple[list[list[int]], list[list[bool]]]:
    """(position, kept) per (token, choice), in GShard's priority order."""
    t, k = len(experts), len(experts[0]) if experts else 0
    seen = [0] * num_experts
    position = [[0] * k for _ in range(t)]
    for j in range(k):
        for i in range(t):
            e = experts[i][j]
            position[i][j] = seen[e]
            seen[e] += 1
    return position, [[pos < cap for pos in row] for row in position]


def dispatch_combine(job: dict) -> dict:
    """Rows x[token], combine as a per-token sum, and the gradients of (rows·w_rows) and (out·w)."""
    torch = _torch()
    token, gate, x, y = job["token"].tolist(), job["gate"], job["x"], job["y"]
    t, h = x.shape
    out = torch.zeros(t, h, dtype=y.dtype)
    x_grad = torch.zeros_like(x)
    for row, tok in enumerate(token):
        out[tok] += gate[row] * y[row]
        x_grad[tok] += job["w_rows"][row]
    w_of_row = job["w"][job["token"]]
    return {"rows": x[job["token"]], "out": out, "x_grad": x_grad, "y_grad": gate[:, None] * w_of_row,
            "gate_grad": (y * w_of_row).sum(-1)}


def layer(job: dict, x, w) -> dict:
    """The MoE layer of job["cfg"] with job["weights"] on x (..., h), token by token; gradients of
    (out·w).sum() + aux, keyed as the probe keys them."""
    torch = _torch()
    import torch.nn.functional as F

    cfg, wt = job["cfg"], job["weights"]
    params = {name: t.detach().clone().requires_grad_(True) for name, t in wt.items()}
    xs = x.detach().clone().requires_grad_(True)
    flat = xs.reshape(-1, xs.shape[-1])
    t, e, k = flat.shape[0], cfg["num_experts"], cfg["top_k"]
    logits = flat @ params["router"].t()
    routed = top_k(logits.detach(), k, None, torch.zeros(t, k, dtype=logits.dtype))["experts"].tolist()
    probs = torch.softmax(logits, dim=-1)
    chosen = torch.tensor(routed)
    gates = probs.gather(1, chosen)
    if k > 1:
        gates = gates / gates.sum(-1, keepdim=True)
    cap = (capacity(tokens=t, num_experts=e, capacity_factor=cfg["capacity_factor"], k=k)
           if cfg["routing"] == "capacity" else t * k)
    _, keep = kept(routed, e, cap)
    rows = []
    for i in range(t):
        acc = torch.zeros(flat.shape[1], dtype=flat.dtype)
        for j in range(k):
            if keep[i][j]:
                ex = routed[i][j]
                hidden = F.gelu(flat[i] @ params["w1"][ex] + params["b1"][ex])
                acc = acc + gates[i, j] * (hidden @ params["w2"][ex] + params["b2"][ex])
        rows.append(acc)
    out = torch.stack(rows).view_as(xs)
    f = torch.bincount(chosen.reshape(-1), minlength=e).to(probs.dtype) / chosen.numel()
    aux = cfg["aux_loss_coef"] * e * (f * probs.mean(0)).sum() + cfg["z_loss_coef"] * (
        logits.logsumexp(-1).square().mean())
    ((out * w).sum() + aux).backward()
    per_expert = [0] * e
    for i in range(t):
        for j in range(k):
            per_expert[routed[i][j]] += keep[i][j]
    return {"out": out.detach(), "aux": aux.detach(), "dropped": sum(not v for row in keep for v in row),
            "dropped_tokens": sum(not any(row) for row in keep), "kept": per_expert,
            "grads": {"x": xs.grad, **{n: p.grad for n, p in params.items()}}}
