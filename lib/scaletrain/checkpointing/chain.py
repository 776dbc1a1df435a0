"""A chain of stages as the planner sees it: per stage, bytes kept and seconds spent.

Rotor's model (Beaumont et al., 2019, "Optimal checkpointing for heterogeneous chains", §3): a
network is a chain F_1 … F_n (the last stage computes the loss); stage i reads x_{i-1} and
writes x_i. Per stage the planner needs
  * a_i  `input_bytes[i]`: bytes of its input x_{i-1}, what a checkpoint of that input costs;
  * t_i  `tape_bytes[i]`: bytes autograd saves when F_i runs with grad (its *tape*), not counting
         the input's storage; `saves_input[i]`: whether the tape also holds x_{i-1};
  * u_f, u_b  `forward_s[i]`, `backward_s[i]`: the time of F_i and of B_i.
Memory here is what `scaletrain.memory_measure.track_saved_tensors` counts: tensors saved for
backward (tapes and checkpointed inputs), one storage once. Gradients in flight and the
forward's transient outputs are not counted; they are what a real GPU adds on top.

One rule keeps the accounting additive: a stage must not save its own output (the next stage's
input), or that storage would belong to two stages' tapes. `profile_chain` checks it; a stage
that ends in ReLU or sigmoid (which save their result) should end before that op instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn as nn

from scaletrain.memory_measure import track_saved_tensors

__all__ = ["Chain", "profile_chain", "gpt_stages"]


@dataclass(frozen=True, kw_only=True)
class Chain:
    """Per-stage costs of a chain of n stages; index i is stage F_{i+1} of the seed's notation."""
    input_bytes: tuple[int, ...]
    tape_bytes: tuple[int, ...]
    saves_input: tuple[bool, ...]
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    names: tuple[str, ...] = ()

    def __post_init__(self):
        n = len(self.input_bytes)
        if n == 0:
            raise ValueError("Chain: needs at least one stage")
        fields = ("tape_bytes", "saves_input", "forward_s", "backward_s") + (("names",) if self.names else ())
        for name in fields:
            if len(getattr(self, name)) != n:
                raise ValueError(f"Chain: {name} has {len(getattr(self, name))} entries, input_bytes has {n}")
        for name in ("input_bytes", "tape_bytes"):
            for i, v in enumerate(getattr(self, name)):
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError(f"Chain: {name}[{i}] must be an int >= 0, got {v!r}")
        for name in ("forward_s", "backward_s"):
            for i, v in enumerate(getattr(self, name)):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                    raise ValueError(f"Chain: {name}[{i}] must be a number >= 0, got {v!r}")

    @property
    def n(self) -> int:
        return len(self.input_bytes)

    def tape(self, i: int, held: bool) -> int:
        """Bytes F_i^e adds: its tape, plus its input when the tape saves it and no checkpoint
        holds that storage already (`held`)."""
        return self.tape_bytes[i] + (self.input_bytes[i] if self.saves_input[i] and not held else 0)

    def label(self, i: int) -> str:
        return self.names[i] if self.names else f"F{i + 1}"


def _min_time(fn, reps: int) -> float:
    """Fastest of `reps` timed calls after one warm-up: a shared machine's noise only ever adds time,
    and the planner wants each stage's cost, not the load of the moment."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def profile_chain(stages: Sequence[nn.Module], x: torch.Tensor, *, reps: int = 3,
                  names: Sequence[str] | None = None) -> Chain:
    """Run each stage once with grad on the output of the previous one and measure its Chain row.

    Bytes come from `track_saved_tensors` (exact, so a plan's predicted peak is what a run
    measures); times are the fastest of `reps` forward and forward + backward runs (perf_counter),
    the backward being their difference. The last
    stage must return the scalar loss. Parameters are never counted.
    """
    stages = list(stages)
    if not stages:
        raise ValueError("profile_chain: no stages")
    params = [p for s in stages for p in s.parameters()]
    rows = []
    for i, stage in enumerate(stages):
        leaf = x.detach().requires_grad_(x.is_floating_point())
        with track_saved_tensors(params) as tracker:
            y = stage(leaf)
            saved, saves_input, saves_output = tracker.bytes, tracker.holds(leaf), tracker.holds(y)
        if saves_output:
            raise ValueError(f"profile_chain: stage {i} ({type(stage).__name__}) saves its own output for backward "
                             "(e.g. it ends in ReLU); end the stage before that op so each storage has one owner")
        if i == len(stages) - 1 and y.numel() != 1:
            raise ValueError(f"profile_chain: the last stage must return the scalar loss, got shape {tuple(y.shape)}")
        a = x.untyped_storage().nbytes()
        grad = torch.ones_like(y) if i == len(stages) - 1 else torch.randn_like(y)

        def fwd_bwd(stage=stage, leaf=leaf, grad=grad):
            torch.autograd.backward(stage(leaf), grad)

        with torch.no_grad():
            forward = _min_time(lambda: stage(leaf), reps)
        total = _min_time(fwd_bwd, reps)
        for p in params:
            p.grad = None
        rows.append((a, saved - (a if saves_input else 0), saves_input, forward, max(total - forward, 0.0)))
        x = y.detach()
    a, t, s, f, b = zip(*rows)
    return Chain(input_bytes=a, tape_bytes=t, saves_input=s, forward_s=f, backward_s=b,
                 names=tuple(names) if names else tuple(type(m).__name__ for m in stages))


class _Embed(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.wte, self.wpe = gpt.wte, gpt.wpe

    def forward(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))


class _Head(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.ln_f, self.lm_head = gpt.ln_f, gpt.lm_head

    def forward(self, x):
        return self.lm_head(self.ln_f(x))


class _Loss(nn.Module):
    def __init__(self, targets):
        super().__init__()
        self.targets = targets

    def forward(self, logits):
        return nn.functional.cross_entropy(logits.flatten(0, 1), self.targets.flatten())


def gpt_stages(model, targets: torch.Tensor) -> tuple[nn.ModuleList, list[str]]:
    """`scaletrain.models.GPT` as a chain: embedding, each block, head, loss (the seed's "Loss").

    Running the stages in order computes exactly `model(idx, targets)[1]`; the stages share the
    model's parameters (the tied embedding included), so gradients land in `model`.
    """
    stages = nn.ModuleList([_Embed(model), *model.blocks, _Head(model), _Loss(targets)])
    names = ["embed", *(f"block{i + 1}" for i in range(len(model.blocks))), "head", "Loss"]
    return stages, names
