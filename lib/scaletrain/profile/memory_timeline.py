"""Memory by tensor kind over a training step: parameters, gradients, optimizer state, activations.

training-speedup-lecture.md, "GPT-2 Profiling: Memory": where a step's bytes are, and when.  The
model states have closed forms (Rajbhandari et al. 2020, ZeRO §3.1, fp32 here): parameters Ψ·4 bytes
always; gradients Ψ·4 from the backward until `zero_grad(set_to_none=True)`; Adam's momentum and
variance 2Ψ·4 from the first `optimizer.step()` on (torch adds a 4-byte `step` per tensor).  The
activations (what autograd keeps for the backward) grow layer by layer through the forward, peak at
its end, and are released layer by layer, last first, through the backward while the gradients grow.

Measured, not predicted, by accounting live tensors at marks (works on any device, no profiler):
the storages of the parameters, their `.grad` and the optimizer's state (`memory_measure.storage_bytes`,
a tied weight counted once), and the saved-tensor bytes (`memory_measure.track_saved_tensors`).  Marks:
the start, after each block's forward (a forward hook), the loss, after each block's backward (a hook
on the gradient of the block's input, computed once the block's backward is done), the end of the
backward, after `optimizer.step()` and after `zero_grad`.  Transient buffers freed inside an op are
not seen (the allocator's view is the GPU's `torch.cuda.memory_allocated`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scaletrain.memory_measure import storage_bytes, track_saved_tensors
from scaletrain.models import GPT

__all__ = ["KINDS", "Mark", "memory_timeline"]

KINDS = ("parameters", "optimizer state", "gradients", "activations")  # the longest-lived first (a plot's base)


@dataclass(frozen=True)
class Mark:
    """The bytes of each kind at one point of step `step`, in phase forward / backward / optimizer."""
    step: int
    phase: str
    label: str
    bytes: dict[str, int]


def _hook_blocks(model: GPT, mark) -> list:
    """Forward hooks that mark after each block's forward and hook its input's gradient (backward)."""
    def after_forward(i):
        def hook(_module, inputs, _output):
            mark("forward", f"block {i}")
            if inputs[0].requires_grad:
                inputs[0].register_hook(lambda _grad: mark("backward", f"block {i}"))
        return hook
    return [block.register_forward_hook(after_forward(i)) for i, block in enumerate(model.blocks)]


def memory_timeline(model: GPT, batch: tuple, optimizer: torch.optim.Optimizer, *, steps: int = 2) -> list[Mark]:
    """`steps` training steps of `model(*batch) -> (logits, loss)` with `optimizer`, the bytes of each
    kind at every mark (the first step shows the optimizer's state appear; later ones its steady state)."""
    params = list(model.parameters())
    marks: list[Mark] = []
    with track_saved_tensors(params) as saved:
        def mark(phase: str, label: str) -> None:
            state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
            marks.append(Mark(step, phase, label, {
                "parameters": storage_bytes(params),
                "gradients": storage_bytes(p.grad for p in params if p.grad is not None),
                "optimizer state": storage_bytes(state), "activations": saved.bytes}))

        handles = _hook_blocks(model, mark)
        try:
            for step in range(steps):
                mark("forward", "start")
                loss = model(*batch)[1]
                mark("forward", "loss")
                loss.backward()
                mark("backward", "end")
                optimizer.step()
                mark("optimizer", "step")
                optimizer.zero_grad(set_to_none=True)
                mark("optimizer", "zero_grad")
        finally:
            for h in handles:
                h.remove()
    return marks
