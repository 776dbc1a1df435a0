"""a7's hidden inputs, from the grading seed: overflow patterns and scaler settings (7.1), blocks
and their inputs (7.2), chains and budgets (7.3); the public tests' cases run here too."""

from __future__ import annotations

import random

from autograder import checks


TRIALS = 8
# the public tests' cases (assignments/a7_memory/tests/): each runs here too (issue 27)
PUBLIC_SCALER = (dict(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3),
                 [bool(b) for b in (0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0)])
PUBLIC_BLOCK = ({"kind": "block", "config": dict(n_embd=12, n_head=3, dropout=0.3)}, [(2, 7, 12)])
PUBLIC_CHAIN = dict(input_bytes=(3, 5, 5, 5, 2), tape_bytes=(8, 20, 20, 20, 9),
                    saves_input=(True, True, True, True, False), forward_s=(1, 3, 3, 3, 1), backward_s=(2, 6, 6, 6, 1))


def _scaler_trials(salt: int, odd: bool):
    if not odd:
        yield PUBLIC_SCALER
    for seed in checks.trial_seeds(TRIALS, salt=salt):
        rng = random.Random(seed)
        if odd:
            settings = dict(init_scale=rng.choice([1000.0, 3.0e38, 12345.678, 1e-3]),
                            growth_factor=rng.choice([1.5, 3.0, 1.1, 7.0]), backoff_factor=rng.choice([0.3, 0.7, 0.9]),
                            growth_interval=rng.randint(1, 3))
        else:
            settings = dict(init_scale=2.0 ** rng.randint(0, 24), growth_factor=2.0,
                            backoff_factor=rng.choice([0.5, 0.25]), growth_interval=rng.randint(1, 6))
        overflows = [rng.random() < rng.choice([0.1, 0.3, 0.5]) for _ in range(rng.randint(25, 60))]
        yield settings, overflows


FP16_CONFIG = dict(vocab_size=31, block_size=8, n_layer=1, n_head=2, n_embd=8)
FP16_SETTINGS = dict(init_scale=2.0**20, growth_interval=3)


def _block_specs(rng: random.Random, dropout: bool) -> list[tuple[dict, list[tuple[int, ...]]]]:
    """(spec, input shapes): a GPT block with odd sizes, an MLP, a function of two tensors and a float."""
    p = (lambda lo, hi: rng.uniform(lo, hi)) if dropout else (lambda lo, hi: 0.0)
    heads = rng.choice([1, 3])
    width = heads * rng.choice([4, 5, 6])
    b, s = rng.randint(1, 3), rng.randint(3, 11)
    return [({"kind": "block", "config": dict(n_embd=width, n_head=heads, block_size=16, dropout=p(0.2, 0.5))},
             [(b, s, width)]),
            ({"kind": "mlp", "sizes": [rng.randint(3, 9), rng.randint(10, 20), rng.randint(2, 7)], "dropout": p(0.2, 0.5)},
             [(rng.randint(2, 9), 0)]),
            ({"kind": "two_inputs", "width": rng.randint(3, 8), "dropout": p(0.3, 0.6)}, [(rng.randint(2, 6), 0)] * 2)]


def _inputs(spec: dict, shapes, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    first = {"mlp": lambda: spec["sizes"][0], "two_inputs": lambda: spec["width"]}.get(spec["kind"])
    return [torch.randn(*(shape[:-1] + (first(),) if first else shape), generator=gen) for shape in shapes]


def _hidden_chain(rng: random.Random, n: int, *, floats: bool):
    from scaletrain.checkpointing.chain import Chain

    big = rng.choice([10, 1000, 10**6])
    return Chain(input_bytes=tuple(rng.randint(1, big) for _ in range(n)),
                 tape_bytes=tuple(rng.randint(0, 3 * big) for _ in range(n)),
                 saves_input=tuple(rng.random() < 0.75 for _ in range(n)),
                 forward_s=tuple(rng.uniform(0.1, 3.0) if floats else rng.randint(1, 9) for _ in range(n)),
                 backward_s=tuple(rng.uniform(0.2, 6.0) if floats else rng.randint(1, 18) for _ in range(n)))


def _fields(chain) -> dict:
    return {"input_bytes": chain.input_bytes, "tape_bytes": chain.tape_bytes, "saves_input": chain.saves_input,
            "forward_s": chain.forward_s, "backward_s": chain.backward_s}


def _planner_cases(salt: int, tight: bool):
    """(chain, budget) pairs: budgets between the lowest peak and plain backpropagation's (tight:
    the lowest peak itself and just above it), so the search itself is exercised."""
    from scaletrain.checkpointing.chain import Chain
    from scaletrain.checkpointing.planner import min_peak, store_all_peak

    cases = []
    for seed in checks.trial_seeds(TRIALS, salt=salt):
        rng = random.Random(seed)
        chain = _hidden_chain(rng, rng.randint(2, 11), floats=rng.random() < 0.4)
        lo, hi = min_peak(chain), store_all_peak(chain)
        picks = [lo, lo + (hi - lo) // 50] if tight else [rng.randint(lo, max(lo, hi - 1)) for _ in range(3)]
        cases += [(chain, budget) for budget in picks]
    chain = Chain(**PUBLIC_CHAIN)  # the public test's: every third budget from the lowest peak up
    lo, hi = min_peak(chain), store_all_peak(chain)
    return cases + [(chain, b) for b in ([lo] if tight else range(lo, hi + 1, 3))]
