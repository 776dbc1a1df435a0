"""a8's hidden inputs, from the grading seed: bucket layouts, ranks and initial Q's (8.1), sizes
and chunk sizes (8.2), layers and settings (8.3), and gradients with a fixed part for the
accumulated bias; the public tests' cases run here too."""

from __future__ import annotations

import math
import random

from .names import P


def _drift_grads(shapes, steps: int, seed: int, scale: float):
    """Per step, per rank: a fixed part, the same every step, that the compressor keeps missing (a
    rank-2 matrix where rank-1 PowerSGD keeps one direction; a ramp whose magnitudes one sign-scale
    can't follow), plus rank noise of `scale`."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    parts = [(torch.randn(s[0], 2, generator=gen) @ torch.randn(2, math.prod(s[1:]), generator=gen)).reshape(-1)
             if len(s) > 1 else torch.linspace(-1.0, 1.0, s[0]) for s in shapes]
    fixed = torch.cat(parts)
    return [[(fixed + scale * torch.randn(fixed.numel(), generator=gen)).float() for _ in range(P)]
            for _ in range(steps)]


def _layouts(rng: random.Random):
    """Hidden bucket layouts, then the public tests' (16×12, 7, 20×10 at rank 2; issue 27)."""
    a, b = rng.randint(21, 37), rng.randint(11, 19)
    return [
        ([(a, b), (rng.randint(3, 9),), (rng.randint(9, 13), 4, 3), (40, 2)], rng.choice([1, 3])),
        ([(rng.randint(25, 31), rng.randint(14, 18)), (5,), (b, a)], rng.choice([4, 5])),
        ([(16, 12), (7,), (20, 10)], 2),
    ]


def _q0(shapes, rank: int, gen) -> list:
    import torch

    from scaletrain.compression.powersgd import should_compress

    qs = []
    for shape in shapes:
        n, m = shape[0], math.prod(shape) // shape[0]
        r = min(n, m, rank)
        if len(shape) > 1 and should_compress(n, m, r):
            qs.append(torch.randn(m, r, generator=gen))
    return qs


def _ps_case(shapes, rank: int, n_steps: int, seed: int, *, buckets=(0,), error_feedback=True, grads=None) -> dict:
    """A case for the probe: `buckets` interleaved (bucket j uses `shapes` rotated by j)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    layouts = {index: shapes[j:] + shapes[:j] for j, index in enumerate(buckets)}
    q0 = {str(index): _q0(layout, rank, gen) for index, layout in layouts.items()}
    steps = []
    for t in range(n_steps):
        index = buckets[t % len(buckets)]
        n = sum(math.prod(s) for s in layouts[index])
        g = grads[t] if grads is not None else [torch.randn(n, generator=gen) for _ in range(P)]
        steps.append({"index": index, "shapes": layouts[index], "grads": g})
    return {"stem": "powersgd", "kind": "powersgd", "rank": rank, "error_feedback": error_feedback,
            "q0": q0, "steps": steps}


def _codec_cases(rng: random.Random, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    cases = []
    for n, chunk in ((1, None), (31, None), (33, 8), (rng.randint(100, 300), rng.randint(7, 50)), (1000, 1000),
                     (rng.randint(64, 200), 64)):
        x = torch.randn(n, generator=gen) * rng.choice([1e-3, 1.0, 50.0])
        x[rng.randrange(n)] = 0.0  # sign(0) := +1
        cases.append((x, chunk))
    return cases + [(torch.tensor([0.5, -2.0, 0.0, 1.5, -1.0]), 3)]  # the public test's: a last chunk of 2


def _ob_case(n: int, chunk: int | None, n_steps: int, seed: int, grads=None) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    steps = [{"index": 2, "shapes": [(n,)],
              "grads": grads[t] if grads is not None else [torch.randn(n, generator=gen) for _ in range(P)]}
             for t in range(n_steps)]
    return {"stem": "onebit", "kind": "onebit", "chunk_numel": chunk, "error_feedback": True, "steps": steps}


def _lamb_cases(rng: random.Random, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    shapes = [(rng.randint(5, 9), rng.randint(3, 7)), (rng.randint(10, 17),), (3, 4, 2), (4, 3), (6,)]
    params = [torch.randn(s, generator=gen) * rng.choice([0.02, 1.0, 3.0]) for s in shapes]
    params[3] = torch.zeros(shapes[3])                 # a zero layer: ‖x‖ = 0, trust 1
    settings = [dict(lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, bias_correction=True, max_trust=None),
                dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0, bias_correction=False, max_trust=2.0)]
    cases = []
    for s in settings:
        grads = [[torch.randn(p.shape, generator=gen) * 0.1 for p in params] for _ in range(6)]
        for step in grads:
            step[4] = torch.zeros(shapes[4])            # a layer without gradient: m = 0, u = λx
        cases.append((params, grads, s))
    return cases + [_public_lamb_case(gen)]


def _public_lamb_case(gen):
    """The public test's layers (6×4 and a small 5-vector), settings and 3 steps, hidden values."""
    import torch
    params = [torch.randn(6, 4, generator=gen), torch.randn(5, generator=gen) * 0.01]
    grads = [[torch.randn(p.shape, generator=gen) for p in params] for _ in range(3)]
    return params, grads, dict(lr=0.02, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1, bias_correction=True,
                               max_trust=None)
