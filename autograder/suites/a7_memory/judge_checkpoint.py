"""a7 task 7.2's verdicts: outputs, gradients and the caller's random stream bitwise against plain
backpropagation, and what the block kept after the forward."""

from __future__ import annotations

import random

from autograder import checks
from autograder.suites import paired

from .inputs import PUBLIC_BLOCK, _block_specs, _inputs
from .judge_scaler import start_worker
from .names import C_CK_HELD, C_CK_ONCE, C_CK_PLAIN, C_CK_RNG, PROBE


def _reference_checkpoint(spec: dict, inputs, seed: int) -> dict:
    """Plain backpropagation of the same block under the same seeds (no checkpointing)."""
    import torch

    from autograder.probes.a7_memory import build_block

    torch.set_num_threads(1)
    module, fn, _ = build_block(spec, seed)
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    args = (leaves[0], 3.0, leaves[1]) if spec["kind"] == "two_inputs" else tuple(leaves)
    torch.manual_seed(seed + 1)
    out = fn(*args)
    out.pow(2).sum().backward()
    return {"out": out.detach(), "grads": [p.grad for p in module.parameters()], "input_grads": [x.grad for x in leaves],
            "rng_after": torch.rand(4)}


def _equal(got, want, what: str) -> None:
    import torch

    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: got {type(got).__name__}, expected a tensor of shape {tuple(want.shape)}")
    if got.shape != want.shape or not torch.equal(got, want):
        err = "shape " + str(tuple(got.shape)) if got.shape != want.shape else \
            f"max difference {(got - want).abs().max().item():.3g}"
        raise AssertionError(f"{what} differs from plain backpropagation ({err}); it must be bitwise equal")


def _checkpoint_cases(ctx, salt: int, dropout: bool):
    for k, seed in enumerate(checks.trial_seeds(2, salt=salt)):
        rng = random.Random(seed)
        public = [PUBLIC_BLOCK] if dropout and k == 0 else []
        for spec, shapes in _block_specs(rng, dropout) + public:
            inputs = _inputs(spec, shapes, seed)
            want = _reference_checkpoint(spec, inputs, seed % 10_000)
            got = ctx.untrusted().call(PROBE + "checkpoint_run", "checkpoint_function", spec, inputs, seed % 10_000)
            yield f"checkpoint on {spec}", got, want


def _verify_values(label: str, got: dict, want: dict) -> None:
    _equal(got["out"], want["out"], f"{label}: the output")
    for i, (g, w) in enumerate(paired(got["grads"], want["grads"], f"{label}: parameter gradients")):
        _equal(g, w, f"{label}: parameter gradient {i}")
    for i, (g, w) in enumerate(paired(got["input_grads"], want["input_grads"], f"{label}: input gradients")):
        _equal(g, w, f"{label}: the gradient of input {i}")
    _equal(got["rng_after"], want["rng_after"],
           f"{label}: the random numbers drawn after backward (recompute inside torch.random.fork_rng)")


def group_checkpoint(ctx):
    start_worker(ctx)
    with ctx.check(C_CK_PLAIN):
        for label, got, want in _checkpoint_cases(ctx, salt=4, dropout=False):
            _verify_values(label, got, want)
    runs = []
    with ctx.check(C_CK_RNG):
        for label, got, want in _checkpoint_cases(ctx, salt=5, dropout=True):
            runs.append((label, got, want))
            _verify_values(label, got, want)
    with ctx.check(C_CK_HELD):
        runs = runs or list(_checkpoint_cases(ctx, salt=5, dropout=True))  # the dropout check stopped early
        for label, got, want in runs:
            held = got["held_after_forward"]
            assert held["count"] == 0, (
                f"{label}: after the forward, {held['count']} storage(s) the block made are still alive (op, bytes: "
                f"{[tuple(h) for h in held['first']]}...): the block's own activations must not be kept, "
                "only its inputs")
    with ctx.check(C_CK_ONCE):
        runs = runs or list(_checkpoint_cases(ctx, salt=5, dropout=True))
        for label, got, want in runs:
            assert got["calls"] == [1, 1] and got["grad_enabled"] == [False, True], (
                f"{label}: the block ran {got['calls'][0]} time(s) in forward and {got['calls'][1]} in backward, with "
                f"grad enabled {got['grad_enabled']}; expected once without grad, then once with grad in backward")
