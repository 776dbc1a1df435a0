"""a7's probes: the student's loss scaler, checkpoint Function and planner run on the inputs the
trusted side sends; outputs come back as data.

- `scale_trajectory`: the student's `DynamicLossScaler.update` on a given overflow pattern: the
  scale and clean-step counter after every step.
- `train_fp16`: `scaletrain.precision.MixedPrecision` (the given master-weight wrapper) driven by
  the student's scaler, on a tiny GPT in fp16 with infs planted at given steps: the 16-bit
  parameters and the scale after every step, and the steps it skipped.
- `checkpoint_run`: the student's `checkpoint` around a block built from a spec (`build_block`,
  shared with the trusted side), under a given RNG seed: output, gradients, input gradients, the
  next random numbers drawn afterwards, the storages made during the forward that are still alive
  after it (`_storages_made`), and how many times the block ran in forward and in backward, with
  grad or without. torch.utils.checkpoint is a trap while it runs.
- `plans`: the student's `plan_rotor` on chains given as data, each answer a plan as nested
  tuples (`schedule.to_data`), or the ValueError it raised.

Nothing here knows an expected value: the reference runs, GradScaler's trajectory, the brute
force and the plans' memory and time are computed on the trusted side (autograder/suites/a7_memory/).
"""

from __future__ import annotations

import contextlib
import gc

from autograder.checks import forbid_calls, student_module
from autograder.wire import short

TORCH_CHECKPOINT = ("torch.utils.checkpoint.checkpoint", "torch.utils.checkpoint.checkpoint_sequential")


def load(*stems: str) -> bool:
    """Import the student's files (starts the worker, so import errors surface first)."""
    for stem in stems:
        student_module(stem)
    return True


# ---------------------------------------------------------------- task 7.1

def scale_trajectory(stem: str, settings: dict, overflows: list) -> list:
    scaler = student_module(stem).DynamicLossScaler(**settings)
    out = []
    for bad in overflows:
        scaler.update(bool(bad))
        out.append((float(scaler.scale), int(scaler.growth_tracker)))
    return out


def train_fp16(stem: str, config: dict, settings: dict, steps: int, poison: list, seed: int) -> dict:
    scaler = student_module(stem).DynamicLossScaler(**settings)   # first: it fixes the submission folder
    import torch

    from scaletrain.models import GPT, GPTConfig
    from scaletrain.precision.master import MixedPrecision, train_with_overflows

    torch.set_num_threads(1)   # the trusted side's reference runs single-threaded too: same sums
    cfg = GPTConfig(**config)
    mp = MixedPrecision(GPT(cfg, seed=seed), torch.optim.SGD, dtype=torch.float16, lr=0.05)
    mp.scaler = scaler
    return train_with_overflows(mp, cfg, steps=steps, poison=poison, seed=seed)


# ---------------------------------------------------------------- task 7.2 (specs shared with the trusted side)

def build_block(spec: dict, seed: int):
    """(module, fn(*inputs) -> output, input shapes) from a spec: {"kind": "block", "config": {...}}
    a GPT block; {"kind": "mlp", "sizes": [...], "dropout": p}; {"kind": "two_inputs", "width": w,
    "dropout": p} a function of (a, scale, b) with a float argument between two tensors."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from scaletrain.models import Block, GPTConfig

    torch.manual_seed(seed)
    kind = spec["kind"]
    if kind == "block":
        module = Block(GPTConfig(**spec["config"])).train()
        return module, (lambda x: module(x)), 1
    if kind == "mlp":
        sizes, layers = spec["sizes"], []
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            layers += [nn.Linear(a, b)] + ([nn.GELU(), nn.Dropout(spec["dropout"])] if i < len(sizes) - 2 else [])
        module = nn.Sequential(*layers).train()
        return module, (lambda x: module(x)), 1
    if kind == "two_inputs":
        module = nn.Linear(spec["width"], spec["width"])
        p = spec["dropout"]
        return module, (lambda a, scale, b: F.dropout(module(a) * scale + b, p, training=True)), 2
    raise ValueError(f"unknown block kind {kind!r}")


@contextlib.contextmanager
def _storages_made():
    """Yields a list that gets (weak reference to its storage, bytes, op) for every tensor an aten op
    makes inside the block: the probe's own dispatch mode, below any the student pushes. A weak
    reference to the storage (not to a tensor object, nor a count kept by a hook) says whether the
    memory is still held, by the tape, by a saved-tensor hook or by anything else."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    made: list = []

    class Made(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):  # else the first dispatch imports torch._dynamo (~2.5 s)
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage()
                    made.append((StorageWeakRef(st), st.nbytes(), func.overloadpacket.__name__))
            return out

    with Made():
        yield made


def _still_held(made: list, *keep) -> list:
    """[(op, bytes)] of the storages in `made` that are alive, other than those of the tensors `keep`
    (the output, the inputs, the parameters, and views of them)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    gc.collect()  # a reference cycle is garbage, not a kept tape
    known = {StorageWeakRef(t.untyped_storage()) for t in keep}
    return [(op, n) for ref, n, op in made if not ref.expired() and ref not in known]


def _counted(fn, calls: list):
    """`fn`, noting for each call whether grad was enabled (the module's hooks are the student's to clear)."""
    import torch

    def block(*args):
        calls.append(torch.is_grad_enabled())
        return fn(*args)
    return block


def checkpoint_run(stem: str, spec: dict, inputs: list, seed: int) -> dict:
    ck = student_module(stem)   # first: it fixes the submission folder the library's shims read
    import torch

    torch.set_num_threads(1)
    module, fn, _ = build_block(spec, seed)
    calls: list = []
    leaves = [x.detach().requires_grad_(True) for x in inputs]
    args = (leaves[0], 3.0, leaves[1]) if spec["kind"] == "two_inputs" else tuple(leaves)
    torch.manual_seed(seed + 1)
    with forbid_calls(*TORCH_CHECKPOINT, modules=(ck,)):
        with _storages_made() as made:
            out = ck.checkpoint(_counted(fn, calls), *args)
        held = _still_held(made, out, *leaves, *module.parameters())
        forward_calls = len(calls)
        out.pow(2).sum().backward()
    return {"out": out.detach(), "grads": [None if p.grad is None else p.grad for p in module.parameters()],
            "input_grads": [x.grad for x in leaves], "rng_after": torch.rand(4),
            "held_after_forward": {"count": len(held), "first": held[:4]},
            "calls": [forward_calls, len(calls) - forward_calls], "grad_enabled": calls}


# ---------------------------------------------------------------- task 7.3

def plans(stem: str, cases: list) -> list:
    """Per (chain fields, budget): {"plan": nested tuples} | {"value_error": msg} | {"malformed": repr}."""
    planner = student_module(stem)   # first: it fixes the submission folder the library's shims read
    from scaletrain.checkpointing.chain import Chain
    from scaletrain.checkpointing.schedule import to_data

    out = []
    for fields, budget in cases:
        try:
            got = planner.plan_rotor(Chain(**fields), budget)
        except ValueError as exc:
            out.append({"value_error": short(str(exc), 300)})
            continue
        try:
            out.append({"plan": to_data(got)})
        except (ValueError, AttributeError) as exc:
            out.append({"malformed": short(f"{exc}: {got!r}", 300)})
    return out

