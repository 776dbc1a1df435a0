"""The same training step four ways: eager, MLP checkpointed, compiled (torch.compile, inductor), and
on the course's hand-fused kernels (fused.py: LayerNorm, attention, cross-entropy; on a GPU only).

techniques-for-large-scale-training.md, "Graph Compilation": graph mode builds the step's graph and
optimises it as a whole, "kernels can be fused into a single kernel" — the automatic alternative to
writing fused kernels by hand (module 1); it costs a compilation and can recompile unexpectedly.
training-speedup-lecture.md, "Profiling Time of Elementary Operations": "GeLU in PyTorch saves 4(!)
intermediate activations" and "many activation functions can be speeded up by recalculating
activations (checkpointing)".  Checkpointing the MLP (fc → GeLU → proj) keeps only its input and
runs fc and GeLU again in the backward: per layer 2·b·s·4h elements (the fc and GeLU outputs) fewer
kept after the forward, for one more fc and GeLU.  Inductor's partitioner chooses what to save by a
min-cut and may recompute cheap elementwise ops itself; the saved bytes say whether it did (on the CPU
shape of `python -m scaletrain.bench profile` it kept as much as eager: 18.0 vs 17.9 MB).

Measured per variant: the step's time (bench.compare_many: round-robin, the median of the per-round
ratios to eager with p20-p80, as notebooks 02-04 quote), and memory: on a CPU the bytes autograd keeps
for the backward (`memory_measure.track_saved_tensors`: after the forward, and the peak over forward
and backward); on a GPU the allocator's peak over the step as well.
"""

from __future__ import annotations

import copy
import importlib.util
import shutil
from typing import Callable

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from scaletrain import bench
from scaletrain.memory_measure import track_saved_tensors
from scaletrain.models import GPT
from scaletrain.profile.fused import FUSED_BACKEND, FusedGPT, fused_unavailable

__all__ = ["BASELINE", "COMPILED", "FUSED", "CheckpointedMLP", "checkpoint_mlps", "compile_unavailable",
           "measure_memory", "compare_variants"]

BASELINE = "eager"
COMPILED = "compiled (inductor)"
FUSED = f"fused kernels ({FUSED_BACKEND})"


class CheckpointedMLP(nn.Module):
    """The block's MLP under activation checkpointing: only its input is kept for the backward.
    Reentrant mode saves that input through `save_for_backward`, so the saved-tensor tracker sees it."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return checkpoint(self.mlp, x, use_reentrant=True)


def checkpoint_mlps(model: GPT) -> GPT:
    """A copy of `model` (same weights) whose every block checkpoints its MLP."""
    out = copy.deepcopy(model)
    for block in out.blocks:
        block.mlp = CheckpointedMLP(block.mlp)
    return out


def compile_unavailable(device: str) -> str | None:
    """Why torch.compile (inductor) cannot run on `device` here, or None when it can: on a CPU
    inductor writes C++ and needs a compiler; on a GPU it writes Triton."""
    if device.startswith("cuda"):
        return None if importlib.util.find_spec("triton") else "inductor on a GPU needs Triton, not installed"
    if not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")):
        return "inductor on a CPU compiles C++ and no C++ compiler (g++, c++, clang++) is on PATH"
    return None


def measure_memory(model: nn.Module, batch: tuple, device: str = "cpu") -> dict[str, float]:
    """Bytes kept for the backward after the forward and at their peak (and, on a GPU, the
    allocator's peak over the forward and backward), one step of `model(*batch) -> (logits, loss)`."""
    params = list(model.parameters())
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
    with track_saved_tensors(params) as tracker:
        loss = model(*batch)[1]
        after_forward = tracker.bytes
        loss.backward()
    out = {"saved MB": after_forward / 1e6, "peak saved MB": tracker.peak / 1e6, "loss": loss.item()}
    if device.startswith("cuda"):
        out["peak allocated MB"] = (torch.cuda.max_memory_allocated(device) - start) / 1e6
    for p in params:
        p.grad = None
    return out


def _steps(models: dict[str, nn.Module], batch: tuple) -> dict[str, Callable[[], None]]:
    def make(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

        def step():
            model(*batch)[1].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    return {name: make(model) for name, model in models.items()}


def compare_variants(model: GPT, batch: tuple, *, device: str = "cpu", rounds: int = 10, warmup: int = 2,
                     compile: bool = True) -> tuple[list[dict], dict[str, str]]:
    """The table eager / checkpointed MLP / compiled / fused kernels for `model` on `batch`, and
    {variant: why its row is missing}.  Memory is measured before any timed step."""
    models: dict[str, nn.Module] = {BASELINE: model, "checkpointed MLP": checkpoint_mlps(model)}
    left_out = {COMPILED: compile_unavailable(device) if compile else "not asked for (compile=False)",
                FUSED: fused_unavailable(device)}
    if left_out[COMPILED] is None:
        models[COMPILED] = torch.compile(copy.deepcopy(model))
    if left_out[FUSED] is None:
        models[FUSED] = FusedGPT(model, FUSED_BACKEND)
    memory = {name: measure_memory(m, batch, device) for name, m in models.items()}  # compiles here
    cmps = bench.compare_many(_steps(models, batch), BASELINE, warmup=warmup, reps=rounds, device=device)
    rows = [{"variant": name, "ms": c.candidate.median * 1e3, "p20": c.candidate.p20 * 1e3,
             "p80": c.candidate.p80 * 1e3, "time / eager": c.ratio, "p20-p80": f"{c.ratio_p20:.2f}-{c.ratio_p80:.2f}",
             **{k: v for k, v in memory[name].items()}} for name, c in cmps.items()]
    return rows, {name: why for name, why in left_out.items() if why is not None}
