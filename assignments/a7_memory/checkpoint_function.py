# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/checkpointing/function.py by `python -m autograder release`; edit the source.
"""Activation checkpointing by hand: keep a function's inputs, recompute its insides in backward.

Chen et al. (2016), "Training Deep Nets with Sublinear Memory Cost"; course seed "Techniques for
large-scale training", Gradient Checkpointing: instead of the activations a function saves for
its backward (its *tape*), keep only its inputs; in the backward, run the function again with
autograd recording and backpropagate through that fresh tape. Memory: inputs instead of the
tape; time: one extra forward of the function.

Two details make the recomputation *the same* computation:
  * randomness: dropout draws new masks each time it runs. The forward saves the RNG state
    (CPU, and each CUDA device the inputs live on) and the backward restores it for the
    recomputation, inside `torch.random.fork_rng` so the caller's RNG stream is untouched
    afterwards. Without it, the gradient belongs to a different dropout mask than the loss.
  * which tensors need gradients: the recomputation starts from *detached* copies of the inputs
    (same storage, new autograd leaves), so its backward stops there and hands the input
    gradients back to the outer graph; parameter gradients accumulate directly.

This is torch.utils.checkpoint's reentrant mode (`use_reentrant=True`): the inputs are saved with
`save_for_backward`, which is what `scaletrain.memory_measure.track_saved_tensors` sees. The
autograd Function's `forward` and `backward` are task 7.2 of assignment a7.

    y = checkpoint(block, x)                         # block's tape is not kept
    y = checkpoint_sequential(blocks, 3, x)          # 3 segments; the last one is not checkpointed
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

__all__ = ["checkpoint", "checkpoint_sequential", "CheckpointFunction"]


def _cuda_devices(tensors: Sequence[Any]) -> list[int]:
    """The CUDA devices the tensor arguments live on: their RNG states are saved too."""
    return sorted({t.device.index or 0 for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda})


class CheckpointFunction(torch.autograd.Function):
    """`apply(fn, preserve_rng_state, *args)`: fn(*args) without keeping its tape (task 7.2)."""

    @staticmethod
    def forward(ctx, fn: Callable[..., Any], preserve_rng_state: bool, *args: Any):
        """Run `fn(*args)` under `torch.no_grad()` and return its output (a tensor or a tuple of
        tensors). Keep for the backward: `fn`; the tensor arguments through
        `ctx.save_for_backward` (so memory trackers see them) and the other arguments as they
        are, with their positions; and, when `preserve_rng_state`, the CPU RNG state
        (`torch.get_rng_state()`) and that of every CUDA device in `_cuda_devices(args)`
        (`torch.cuda.get_rng_state(device)`), taken *before* `fn` runs.
        """
        raise NotImplementedError('a7 task 7.2: implement `forward` (see assignments/a7_memory/README.md)')

    @staticmethod
    def backward(ctx, *grad_outputs: torch.Tensor):
        """Recompute `fn` on detached inputs (each `requires_grad_` as its original) with grad
        enabled and the saved RNG states restored inside `torch.random.fork_rng(devices=...)`,
        then `torch.autograd.backward` from the outputs that require grad with `grad_outputs`.
        Return one entry per `forward` argument: None for `fn` and `preserve_rng_state`, the
        input's `.grad` for a tensor input (None when it needs none), None for other arguments.
        """
        raise NotImplementedError('a7 task 7.2: implement `backward` (see assignments/a7_memory/README.md)')


def checkpoint(fn: Callable[..., Any], *args: Any, preserve_rng_state: bool = True):
    """`fn(*args)` whose activations are recomputed in the backward instead of kept.

    Outside grad mode (evaluation, or the first pass of an enclosing checkpoint) it is `fn(*args)`.
    When no tensor argument requires grad (token ids into an embedding), an empty leaf that does
    is passed along, so the Function still gets a backward and the parameters inside `fn` their
    gradients; it holds no bytes.
    """
    if not callable(fn):
        raise TypeError(f"checkpoint: fn must be callable, got {type(fn).__name__}")
    if not torch.is_grad_enabled():
        return fn(*args)
    if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        return CheckpointFunction.apply(fn, preserve_rng_state, *args)
    anchor = torch.empty(0, requires_grad=True)
    return CheckpointFunction.apply(lambda *a: fn(*a[:-1]), preserve_rng_state, *args, anchor)


def checkpoint_sequential(functions: Sequence[Callable[[Any], Any]], segments: int, x: Any, *,
                          preserve_rng_state: bool = True):
    """Run `functions` in order, as `segments` segments of len // segments functions each, every
    segment but the last checkpointed (the last one's tape is needed right away by the backward).

    Chen et al.'s √n rule is segments ≈ √n: n/segments activations of one segment at a time plus
    `segments` stored inputs. Same split as torch.utils.checkpoint.checkpoint_sequential.
    """
    functions = list(functions)
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= max(len(functions), 1):
        raise ValueError(f"checkpoint_sequential: segments must be an int in [1, {len(functions)}], got {segments!r}")
    size = len(functions) // segments

    def run(lo: int, hi: int):
        def segment(y):
            for f in functions[lo:hi]:
                y = f(y)
            return y
        return segment

    end = 0
    for start in range(0, size * (segments - 1), size):
        end = start + size
        x = checkpoint(run(start, end), x, preserve_rng_state=preserve_rng_state)
    return run(end, len(functions))(x)
