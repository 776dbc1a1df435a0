"""Time to a validation loss: does progressive layer dropping or the curriculum pay on this model?

additional-techniques.md §2 and §4: both speedups change the training, so a step is cheaper (a
dropped layer, a shorter sequence) but may learn less; the figure that decides is the wall time to a
fixed validation loss, not the time per step.  Zhang & He 2020 (PLD) report it for BERT pre-training
(24 layers; "2.5× faster to the same accuracy"); Li et al. 2022 (curriculum) for GPT-2 pre-training at
large batch.  Here both run on the tiny GPT (`scaletrain.models.GPT`) and the course's corpus
(`scaletrain.data`: bytes of the handouts, the last tenth held out for validation), against the
baseline with the same initial weights, the same batches and the same optimizer, each seed's three
runs back to back so that a drift of a shared machine hits them alike.

One run: train until the validation loss (evaluated every `eval_every` steps on fixed held-out
windows, the full model at the full length, its time not counted) is ≤ `target`, or `max_steps`.
The run's curve is (step, training wall seconds, validation loss) at each evaluation; it reached the
target at the first evaluation ≤ target (so steps are known to within `eval_every`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from scaletrain.data import corpus, windows
from scaletrain.models import GPT, GPTConfig
from scaletrain.profile.curriculum import seq_len_at, truncate
from scaletrain.profile.pld import keep_probabilities, pld_forward, sample_gates

__all__ = ["METHODS", "BASELINE", "Setup", "QUICK", "FULL", "Run", "train_to_loss", "measure", "summary"]

BASELINE = "baseline"
METHODS = (BASELINE, "pld", "curriculum")


@dataclass(frozen=True, kw_only=True)
class Setup:
    """One time-to-loss experiment.  PLD's γ is the paper's 0.001 scaled to a run of 10² steps, not
    10⁵ (θ(t) reaches θ̄ within the run); the curriculum grows 8 → s over `curriculum_steps`."""
    cfg: GPTConfig = field(default_factory=lambda: GPTConfig(block_size=32, n_layer=4, n_head=4, n_embd=32))
    batch: int = 16
    lr: float = 3e-3
    target: float = 3.35         # nats per byte; the corpus's unigram entropy is 3.42: below it needs context
    max_steps: int = 300
    eval_every: int = 5
    val_windows: int = 32
    theta_bar: float = 0.5       # DeepSpeed's default
    gamma: float = 0.02
    curriculum_start: int = 8
    curriculum_steps: int = 60


QUICK = Setup()
# Not run in this repository's sessions yet: minutes per run on a CPU, nine runs for three seeds.
FULL = Setup(cfg=GPTConfig(block_size=64, n_layer=8, n_head=4, n_embd=64), target=2.6, max_steps=3000,
             eval_every=10, val_windows=64, gamma=0.003, curriculum_start=8, curriculum_steps=400)


@dataclass(frozen=True)
class Run:
    """One method, one seed: the validation curve at each evaluation and the target it aimed at."""
    method: str
    seed: int
    target: float
    steps: tuple[int, ...]
    walls: tuple[float, ...]     # training seconds before that evaluation (evaluations not counted)
    losses: tuple[float, ...]

    @property
    def reached(self) -> int | None:
        """Index of the first evaluation at or below the target, None if the run never got there."""
        return next((i for i, v in enumerate(self.losses) if v <= self.target), None)

    @property
    def steps_to_target(self) -> int | None:
        return None if self.reached is None else self.steps[self.reached]

    @property
    def wall_to_target(self) -> float | None:
        return None if self.reached is None else self.walls[self.reached]


def _held_out(tokens: torch.Tensor, setup: Setup) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed validation windows from the corpus's last tenth (training windows start before it)."""
    s, lo = setup.cfg.block_size, len(tokens) * 9 // 10
    starts = torch.linspace(lo, len(tokens) - s - 2, setup.val_windows).long().tolist()
    return windows(tokens, starts, s)


def _loss(method: str, model: GPT, batch: tuple, t: int, setup: Setup, gates: torch.Generator) -> torch.Tensor:
    """The step's training loss under `method` at step t."""
    if method == "pld":
        probs = keep_probabilities(t, setup.cfg.n_layer, theta_bar=setup.theta_bar, gamma=setup.gamma)
        return pld_forward(model, *batch, sample_gates(probs, gates), probs)[1]
    if method == "curriculum":
        s = seq_len_at(t, full=setup.cfg.block_size, start=setup.curriculum_start,
                       total_steps=setup.curriculum_steps)
        return model(*truncate(*batch, s))[1]
    return model(*batch)[1]


def train_to_loss(method: str, setup: Setup = QUICK, *, seed: int = 0, tokens: torch.Tensor | None = None) -> Run:
    """Train a fresh GPT(seed) with `method` until the validation loss is ≤ setup.target or max_steps."""
    if method not in METHODS:
        raise ValueError(f"train_to_loss: unknown method {method!r}; choose one of {', '.join(METHODS)}")
    tokens = corpus() if tokens is None else tokens
    val, split = _held_out(tokens, setup), len(tokens) * 9 // 10
    model = GPT(setup.cfg, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=setup.lr, weight_decay=0.0, foreach=True)
    data, gates = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    curve, wall = [], 0.0
    for t in range(setup.max_steps + 1):
        if t % setup.eval_every == 0 or t == setup.max_steps:
            with torch.no_grad():
                curve.append((t, wall, model(*val)[1].item()))
            if curve[-1][2] <= setup.target or t == setup.max_steps:
                break
        start = time.perf_counter()
        starts = torch.randint(0, split - setup.cfg.block_size - 1, (setup.batch,), generator=data).tolist()
        loss = _loss(method, model, windows(tokens, starts, setup.cfg.block_size), t, setup, gates)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        wall += time.perf_counter() - start
    steps, walls, losses = zip(*curve)
    return Run(method, seed, setup.target, steps, walls, losses)


def measure(setup: Setup = QUICK, *, seeds: int = 3, methods: tuple[str, ...] = METHODS) -> list[Run]:
    """Every method for seeds 0..seeds-1, the methods of one seed back to back (one thread)."""
    tokens, threads = corpus(), torch.get_num_threads()
    torch.set_num_threads(1)  # a second thread on a shared 2-core box only adds noise
    try:
        return [train_to_loss(m, setup, seed=s, tokens=tokens) for s in range(seeds) for m in methods]
    finally:
        torch.set_num_threads(threads)


def _mean_sd(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.3g} ± {sd:.2g}" if xs else "-"


def summary(runs: list[Run]) -> list[dict]:
    """Per method: runs that reached the target, steps and wall seconds to it (mean ± sd over seeds),
    and the per-seed ratio of wall time to the baseline's (mean, min-max) among seeds where both reached."""
    base = {r.seed: r.wall_to_target for r in runs if r.method == BASELINE}
    rows = []
    for method in dict.fromkeys(r.method for r in runs):
        mine = [r for r in runs if r.method == method]
        hit = [r for r in mine if r.reached is not None]
        ratios = [r.wall_to_target / base[r.seed] for r in hit if base.get(r.seed)]
        rows.append({"method": method, "reached": f"{len(hit)}/{len(mine)}",
                     "steps": _mean_sd([r.steps_to_target for r in hit]),
                     "wall s": _mean_sd([r.wall_to_target for r in hit]),
                     "wall / baseline": f"{statistics.mean(ratios):.2f}" if ratios else "-",
                     "min-max": f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"})
    return rows
