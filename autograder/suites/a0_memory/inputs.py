"""a0's hidden inputs: seeded configurations, each list led by the public tests' own cases (issue 27:
a hidden suite runs every public case)."""

from __future__ import annotations

import random

from autograder import checks

TRIALS = 25


def trials(salt: int, public: list[dict], draw) -> list[dict]:
    """The public tests' keyword arguments (assignments/a0_memory/tests/; issue 27: a hidden suite
    runs every public case), then TRIALS hidden draws `draw(rng)`."""
    return public + [draw(random.Random(seed)) for seed in checks.trial_seeds(TRIALS, salt=salt)]


def param_shape(rng: random.Random) -> dict:
    return dict(vocab_size=rng.randint(50, 260_000), block_size=rng.randint(8, 32_768), n_layer=rng.randint(1, 128),
                hidden=rng.randint(1, 200) * 64 + rng.choice([0, 8, 24]), tied_embeddings=rng.random() < 0.5)


def zero_case(rng: random.Random) -> dict:
    psi = rng.choice([rng.randint(1, 999), rng.randint(10**6, 10**12)])
    return dict(num_params=psi, world_size=rng.choice([1, 2, 3, 7, 8, 64, 1000, 1024]), stage=rng.randint(0, 3),
                precision=rng.choice(_memory().PRECISIONS), optimizer=rng.choice(_memory().OPTIMIZERS))


def random_shape(rng: random.Random, *, tp: bool = False) -> dict:
    """A transformer shape with irregular sizes: odd head counts, h not a power of two."""
    t = rng.choice([1, 2, 3, 4, 8]) if tp else 1
    n_head = t * rng.randint(1, 12)
    return dict(seq_len=rng.randint(7, 4099), batch_size=rng.randint(1, 48),
                hidden=n_head * rng.choice([8, 24, 64, 80, 128]), n_layer=rng.randint(1, 80),
                n_head=n_head, tp=t)


def tiny_configs():
    """(config, batch, sequence): small GPTs that build and run in well under a second each,
    irregular heads, V ≠ h; then the public tests' default GPT at batch 4 (issue 27)."""
    from scaletrain.models import GPTConfig
    return [(GPTConfig(vocab_size=83, block_size=24, n_layer=3, n_embd=36, n_head=3), 3, 21),
            (GPTConfig(vocab_size=300, block_size=16, n_layer=2, n_embd=40, n_head=5), 2, 16),
            (GPTConfig(), 4, GPTConfig().block_size)]


def _memory():
    from scaletrain import memory
    return memory
