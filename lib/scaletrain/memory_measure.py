"""Measure the memory of one real training step on CPU, from the tensors themselves.

`scaletrain.memory` predicts bytes; this module counts them, so the two can be compared:
  * parameters, gradients, optimizer state: the storages of `model.parameters()`, of their
    `.grad`, and of every tensor in `optimizer.state`, each storage counted once (a tied
    weight, or a view, shares its storage);
  * activations: every tensor autograd saves for the backward pass, seen through
    `torch.autograd.graph.saved_tensors_hooks`, counted once per storage (Q, K and V are
    views of one QKV output), parameters excluded (a Linear saves its weight too).
What is *not* counted: transient buffers freed inside the forward (e.g. the QKV output's
views before they are saved, softmax workspaces), the allocator's caching and fragmentation,
the autograd graph's own bookkeeping. Those are why a real GPU needs the seed's ~20% margin.

The pack hook wraps each saved tensor in a small object whose `__del__` releases it; autograd
drops that object when the saved tensor is consumed in the backward, so the tracker also
sees the *peak* of live saved bytes over forward and backward, which is what activation
checkpointing changes.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from scaletrain.memory import MemoryBreakdown
from scaletrain.models import GPT, GPTConfig, make_batch

__all__ = ["MeasuredMemory", "measure_training_step", "storage_bytes", "make_optimizer", "CheckpointedBlock",
           "track_saved_tensors"]


@dataclass(frozen=True, kw_only=True)
class MeasuredMemory:
    """Bytes counted during one fp32 step (forward, backward, optimizer step) on CPU."""
    params: int
    grads: int
    optimizer: int
    activations: int              # saved tensors alive at the end of the forward
    activations_peak: int         # max of live saved tensors over forward + backward
    num_param_tensors: int        # Adam keeps one 4-byte `step` scalar per parameter tensor
    # forward saves by the innermost module's class; "GPT" is the model's own forward (the
    # cross-entropy), "CheckpointedBlock" the inputs kept by checkpointing
    saved_by_module: dict[str, int] = field(default_factory=dict)

    @property
    def states(self) -> MemoryBreakdown:
        return MemoryBreakdown(params=self.params, grads=self.grads, optimizer=self.optimizer)


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (shared storages and views count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def make_optimizer(name: str, params, *, lr: float = 1e-3) -> torch.optim.Optimizer:
    """The torch optimizer behind each name of `scaletrain.memory.OPTIMIZERS`."""
    makers = {"adam": lambda: torch.optim.Adam(params, lr=lr),
              "adamw": lambda: torch.optim.AdamW(params, lr=lr),
              "sgd": lambda: torch.optim.SGD(params, lr=lr),
              "sgd_momentum": lambda: torch.optim.SGD(params, lr=lr, momentum=0.9)}
    if name not in makers:
        raise ValueError(f"make_optimizer: unknown optimizer {name!r}; choose one of {', '.join(makers)}")
    return makers[name]()


class _Saved:
    """What the pack hook hands to autograd: the tensor plus a release on garbage collection."""
    __slots__ = ("tensor", "tracker", "key")

    def __init__(self, tensor, tracker, key):
        self.tensor, self.tracker, self.key = tensor, tracker, key

    def __del__(self):
        self.tracker.release(self.key)


class _SavedTracker:
    """Live saved bytes, deduplicated by storage; parameters' storages are skipped."""

    def __init__(self, param_ptrs: set[int]):
        self.param_ptrs = param_ptrs
        self.live: dict[int, list[int]] = {}   # storage ptr -> [references, nbytes]
        self.bytes = self.peak = 0
        self.by_module: Counter[str] = Counter()
        self.module_stack = ["(outside modules)"]

    def pack(self, t: torch.Tensor):
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in self.param_ptrs or st.nbytes() == 0:
            return t
        entry = self.live.setdefault(key, [0, st.nbytes()])
        if entry[0] == 0:
            self.bytes += entry[1]
            self.peak = max(self.peak, self.bytes)
            self.by_module[self.module_stack[-1]] += entry[1]
        entry[0] += 1
        return _Saved(t, self, key)

    def enter(self, module, _inputs) -> None:   # forward pre-hook: attribute saves to this module
        self.module_stack.append(type(module).__name__)

    def leave(self, _module, _inputs, _output) -> None:   # returning None keeps the output
        self.module_stack.pop()

    def holds(self, t: torch.Tensor) -> bool:
        """Whether `t`'s storage is among the live saved tensors."""
        return t.untyped_storage().data_ptr() in self.live

    @staticmethod
    def unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def release(self, key: int) -> None:
        entry = self.live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.bytes -= entry[1]
            del self.live[key]


@contextlib.contextmanager
def track_saved_tensors(params=()):
    """Count what autograd saves for backward inside the block, for any module or function.

    Yields the tracker: `.bytes` (live saved bytes now), `.peak` (their maximum so far, forward
    and backward), `.holds(t)` (is `t`'s storage saved now). Storages of `params` are skipped,
    as in `measure_training_step`. Used by `scaletrain.checkpointing` to check a plan's memory.
    """
    tracker = _SavedTracker({p.untyped_storage().data_ptr() for p in params})
    with torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack):
        yield tracker


class CheckpointedBlock(nn.Module):
    """Full activation checkpointing of one block. Reentrant mode saves the block's input
    through `save_for_backward`, which the tracker sees; non-reentrant mode would hide it."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=True)


def measure_training_step(model: GPT | None = None, *, batch_size: int = 4, seq_len: int | None = None,
                          optimizer: str = "adam", checkpointing: bool = False, seed: int = 0) -> MeasuredMemory:
    """Run one fp32 training step of `model` (default: `GPT(GPTConfig())`) and count its bytes.

    The model is modified by the step (one optimizer update) and, with `checkpointing=True`,
    its blocks are wrapped for the step only. Predictions to compare with:
    `memory.model_states_bytes(num_params, precision="fp32", optimizer=...)` (Adam adds
    4·num_param_tensors bytes of `step` scalars) and `memory.tiny_gpt_activation_bytes(...)`.
    """
    model = GPT(GPTConfig()) if model is None else model
    if not isinstance(model, GPT):
        raise TypeError(f"measure_training_step: model must be a scaletrain.models.GPT, got {type(model).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"measure_training_step: batch_size must be a positive int, got {batch_size!r}")
    params = list(model.parameters())
    opt = make_optimizer(optimizer, params)
    idx, targets = make_batch(model.cfg, batch_size, seed=seed, seq_len=seq_len)
    tracker = _SavedTracker({p.untyped_storage().data_ptr() for p in params})
    blocks = model.blocks
    handles = []
    try:
        if checkpointing:
            model.blocks = nn.ModuleList(CheckpointedBlock(b) for b in blocks)
        handles = [h for m in model.modules() for h in (m.register_forward_pre_hook(tracker.enter),
                                                         m.register_forward_hook(tracker.leave))]
        with torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack):
            _, loss = model(idx, targets)
            at_forward_end, by_module = tracker.bytes, dict(tracker.by_module)
            loss.backward()
        del loss
    finally:
        model.blocks = blocks
        for h in handles:
            h.remove()
    opt.step()
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return MeasuredMemory(params=storage_bytes(params),
                          grads=storage_bytes(p.grad for p in params if p.grad is not None),
                          optimizer=storage_bytes(state), activations=at_forward_end,
                          activations_peak=tracker.peak, num_param_tensors=len(params),
                          saved_by_module=by_module)
