"""a10's hidden inputs, drawn from the grading seed; each list starts with the public tests' own cases
(assignments/a10_moe/tests/; a hidden suite runs every public case). Capacity factors are binary
fractions (0.5 ... 2.0), so k·T·cf/E is exact in floats and only the rounding rule is graded."""

from __future__ import annotations

import random

from autograder import checks

# the public tests' router logits: four tokens, three experts, no ties
PUBLIC_PROBS = [[0.1, 0.6, 0.3], [0.5, 0.22, 0.28], [0.2, 0.1, 0.7], [0.05, 0.8, 0.15]]
FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
RANK_WORLD = 4


def _t():
    import torch
    return torch


def _gen(seed: int):
    return _t().Generator().manual_seed(seed)


def _randn(gen, *shape, scale: float = 1.0, dtype=None):
    torch = _t()
    return torch.randn(*shape, generator=gen, dtype=dtype or torch.float64) * scale


def _public_logits():
    torch = _t()
    return torch.log(torch.tensor(PUBLIC_PROBS, dtype=torch.float64))


def _choices(gen, t: int, e: int, k: int, skew: bool):
    """(T, k) distinct experts per token; with `skew`, half the first choices on expert 0."""
    torch = _t()
    experts = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    if skew:
        for i in range(t // 2):
            row = experts[i].tolist()
            if 0 in row:
                row.remove(0)
            experts[i] = torch.tensor([0] + row[:k - 1])
    return experts


def route_jobs(seed: int) -> list[dict]:
    rng, gen = random.Random(seed), _gen(seed)
    jobs = [{"name": f"public k={k}", "logits": _public_logits(), "k": k, "normalize": None} for k in (1, 2)]
    jobs.append({"name": "public k=1 normalize=True", "logits": _public_logits(), "k": 1, "normalize": True})
    for i in range(6):
        t, e = rng.randint(5, 37), rng.choice((3, 5, 6, 8))
        k = rng.randint(1, min(3, e))
        normalize = rng.choice((None, None, k == 1, k != 1))
        dtype = _t().float32 if i == 0 else _t().float64
        jobs.append({"name": f"T={t} E={e} k={k} normalize={normalize} {dtype}", "k": k, "normalize": normalize,
                     "logits": _randn(gen, t, e, scale=2.0).to(dtype)})
    for job in jobs:
        job["w"] = _randn(gen, job["logits"].shape[0], job["k"]).to(job["logits"].dtype)
    return jobs


def balance_jobs(seed: int) -> list[dict]:
    rng, gen = random.Random(seed + 1), _gen(seed + 1)
    probs = _public_logits().softmax(-1)
    jobs = [{"name": f"public k={k}", "probs": probs, "experts": probs.topk(k, dim=-1).indices} for k in (1, 2)]
    for _ in range(6):
        t, n = rng.randint(7, 40), rng.choice((3, 4, 6, 8))
        k = rng.randint(1, min(3, n))
        jobs.append({"name": f"T={t} N={n} k={k}", "probs": _randn(gen, t, n, scale=1.5).softmax(-1),
                     "experts": _choices(gen, t, n, k, skew=rng.random() < 0.7)})
    return jobs


def bound_jobs() -> list[dict]:
    """Uniform routing (loss 1) at k = 1, 2 and one expert taking every token (loss N)."""
    torch = _t()
    jobs = []
    for n, k, t in ((4, 1, 12), (5, 2, 15), (7, 1, 14)):
        experts = torch.tensor([[(i + j) % n for j in range(k)] for i in range(t)])
        jobs.append({"name": f"uniform N={n} k={k}", "probs": torch.full((t, n), 1 / n, dtype=torch.float64),
                     "experts": experts, "want": 1.0})
    for n in (3, 6):
        probs = torch.zeros(10, n, dtype=torch.float64)
        probs[:, 0] = 1.0
        jobs.append({"name": f"collapsed N={n}", "probs": probs, "experts": torch.zeros(10, 1, dtype=torch.long),
                     "want": float(n)})
    return jobs


def capacity_jobs(seed: int) -> list[dict]:
    public = [dict(tokens=10, num_experts=4, capacity_factor=1.0, k=1), dict(tokens=8, num_experts=4,
              capacity_factor=1.0, k=1), dict(tokens=13, num_experts=4, capacity_factor=1.25, k=2),
              dict(tokens=3, num_experts=8, capacity_factor=0.5, k=1)]
    draws = []
    for s in checks.trial_seeds(20, salt=seed % 997):
        rng = random.Random(s)
        draws.append(dict(tokens=rng.choice((rng.randint(1, 9), rng.randint(10, 300))), num_experts=rng.randint(2, 16),
                          capacity_factor=rng.choice(FACTORS), k=rng.randint(1, 2)))
    return public + draws


def keep_jobs(seed: int) -> list[dict]:
    torch, rng, gen = _t(), random.Random(seed + 2), _gen(seed + 2)
    jobs = [{"name": "public docstring example", "experts": torch.tensor([[0], [0], [1], [0]]), "num_experts": 2,
             "capacity": 2}]
    for _ in range(6):
        t, e = rng.randint(6, 31), rng.randint(3, 7)
        k, c = rng.randint(1, min(3, e)), rng.randint(1, 5)
        jobs.append({"name": f"T={t} E={e} k={k} C={c}", "experts": _choices(gen, t, e, k, skew=True),
                     "num_experts": e, "capacity": c})
    return jobs


def group_jobs(seed: int) -> list[dict]:
    torch, rng, gen = _t(), random.Random(seed + 3), _gen(seed + 3)
    jobs = [{"name": "public docstring example", "token": torch.tensor([0, 1, 2, 3]),
             "expert": torch.tensor([2, 0, 2, 1]), "gate": torch.tensor([0.7, 0.9, 0.6, 0.8], dtype=torch.float64),
             "num_experts": 3}]
    for _ in range(4):
        n, e = rng.randint(5, 30), rng.randint(3, 8)
        used = torch.randperm(e, generator=gen)[:max(1, e - 2)]  # two experts nobody chose
        jobs.append({"name": f"N={n} E={e}", "token": torch.randint(0, 12, (n,), generator=gen),
                     "expert": used[torch.randint(0, len(used), (n,), generator=gen)],
                     "gate": torch.rand(n, generator=gen, dtype=torch.float64), "num_experts": e})
    return jobs


def dispatch_jobs(seed: int) -> list[dict]:
    """Groups as a student's `group_by_expert` might make them: grouped by expert, rows shuffled
    inside each group; some tokens without rows."""
    torch, rng, gen = _t(), random.Random(seed + 4), _gen(seed + 4)
    public = _gen(0)  # the public test's docstring groups, x (5, 3) and y (4, 3) from seed 0
    jobs = [{"name": "public docstring groups", "tokens": 5, "token": torch.tensor([1, 3, 0, 2]), "counts": [1, 1, 2],
             "gate": torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=torch.float64), "x": _randn(public, 5, 3),
             "y": _randn(public, 4, 3), "w": torch.ones(5, 3, dtype=torch.float64), "w_rows": _randn(gen, 4, 3)}]
    for i in range(4):
        t, h, e = rng.randint(5, 15), rng.choice((3, 6)), rng.randint(2, 5)
        n = rng.randint(t // 2, 2 * t)
        expert = torch.sort(torch.randint(0, e, (n,), generator=gen)).values
        token = torch.randint(0, t - 1, (n,), generator=gen)  # the last token never chosen: its row is 0
        counts = torch.bincount(expert, minlength=e).tolist()
        jobs.append({"name": f"T={t} N={n} E={e} h={h}", "tokens": t, "token": token, "counts": counts,
                     "gate": torch.rand(n, generator=gen, dtype=torch.float64), "x": _randn(gen, t, h),
                     "y": _randn(gen, n, h), "w": _randn(gen, t, h), "w_rows": _randn(gen, n, h)})
    return jobs


def _layer_weights(gen, e: int, h: int, f: int, scale: float) -> dict:
    return {"router": _randn(gen, e, h, scale=scale), "w1": _randn(gen, e, h, f, scale=0.4),
            "b1": _randn(gen, e, f, scale=0.1), "w2": _randn(gen, e, f, h, scale=0.4),
            "b2": _randn(gen, e, h, scale=0.1)}


LAYER_CONFIGS = (dict(routing="capacity", top_k=1, capacity_factor=1.0), dict(routing="capacity", top_k=2,
                 capacity_factor=0.75), dict(routing="dropless", top_k=2), dict(routing="capacity", top_k=1,
                 capacity_factor=0.5))


def layer_jobs(seed: int) -> list[dict]:
    rng, gen = random.Random(seed + 5), _gen(seed + 5)
    jobs = []
    for kw in LAYER_CONFIGS:
        e, h, f, b, s = rng.choice((4, 5)), 6, rng.choice((5, 7)), rng.choice((1, 2)), rng.choice((9, 13))
        cfg = dict(num_experts=e, ffn_hidden=f, aux_loss_coef=0.1, z_loss_coef=0.01, **kw)
        jobs.append({"name": " ".join(f"{k}={v}" for k, v in cfg.items()) + f" x=({b}, {s}, {h})", "cfg": cfg,
                     "weights": _layer_weights(gen, e, h, f, scale=1.5), "x": _randn(gen, b, s, h),
                     "w": _randn(gen, b, s, h)})
    return jobs


def rank_jobs(seed: int) -> list[dict]:
    """All-to-alls on p = 2, 3, 4 (the group of the first p ranks) and expert-parallel layers."""
    torch, rng, gen = _t(), random.Random(seed + 6), _gen(seed + 6)
    jobs = [_a2a_job(gen, "public equal p=3", 3, None, 4, torch.float32, rows=6),
            _a2a_job(gen, "public variable p=3", 3, [[1, 0, 2], [3, 1, 0], [0, 2, 2]], 4, torch.float32)]
    for p in (2, 3, 4):
        m, width = rng.randint(1, 3), rng.choice((3, 5))
        dtype = rng.choice((torch.float32, torch.float64))
        jobs.append(_a2a_job(gen, f"equal p={p} m={m} width={width}", p, None, width, dtype, rows=p * m))
        splits = [[rng.choice((0, 1, 2, 3, 4)) for _ in range(p)] for _ in range(p)]
        splits[rng.randrange(p)][rng.randrange(p)] = 0  # at least one empty chunk
        for given in (False, True):
            jobs.append(_a2a_job(gen, f"variable p={p} splits={splits} recv_splits {'given' if given else 'exchanged'}",
                                 p, splits, width, dtype, recv_given=given))
    for ep, e in ((2, 6), (4, 4)):
        cfg = dict(num_experts=e, ffn_hidden=5, routing="capacity", top_k=2, capacity_factor=0.75, aux_loss_coef=0.1,
                   z_loss_coef=0.01)
        jobs.append({"name": f"expert parallel ep={ep} E={e}", "kind": "ep", "p": ep, "cfg": cfg,
                     "weights": _layer_weights(gen, e, 6, 5, scale=1.5),
                     "x": [_randn(gen, 7 + 3 * r, 6) for r in range(ep)],  # uneven tokens per rank
                     "w": [_randn(gen, 7 + 3 * r, 6) for r in range(ep)]})
    return jobs


def _a2a_job(gen, name, p, splits, width, dtype, *, rows=None, recv_given=False) -> dict:
    send = [rows] * p if splits is None else [sum(row) for row in splits]
    recv = [rows] * p if splits is None else [sum(row[r] for row in splits) for r in range(p)]
    return {"name": name, "kind": "a2a", "p": p, "splits": splits, "recv_given": recv_given,
            "x": [_randn(gen, send[r], width).to(dtype) for r in range(p)],
            "w": [_randn(gen, recv[r], width).to(dtype) for r in range(p)]}
