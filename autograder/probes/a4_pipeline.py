"""a4's probes: the student's generators, dry run and executor, run on the inputs the trusted
side sends, their outputs returned as data.

- `generate`: a generator's schedule as `[(rank, [(stage, kind, microbatch), ...]), ...]` (or the
  ValueError it raised).
- `validate`: the student's `validate` on a schedule given as data: accepted, or the ValueError's
  type, message, `rank` and `action`.
- `run_executor`: the student's `PipelineExecutor` on 3 ranks, one step per case (stage modules
  built from the given spec and parameters, the given batch and schedule). Per rank and case:
  the parameter gradients, what `step` returned, what it still holds (`in_flight`), and a trace
  recorded by wrappers around the stage modules, which the executor never sees as anything but its stages:
  every forward (its stage, a copy of its input, how many stage outputs were alive), every
  gradient that reached a stage output (which forward it belongs to), every weight-gradient
  accumulation. The trusted side reads the order of actions and the activations held from it.

Nothing here knows a schedule's expected order, a gradient or a loss: those exist only on the
trusted side (autograder/suites/a4_pipeline/).
"""

from __future__ import annotations

from autograder import wire
from autograder.checks import student_module
from autograder.wire import short

_SCALARS = (int, str)


def load(*stems: str) -> None:
    """Import the student's files (starts the worker before the timed calls)."""
    for stem in stems:
        student_module(stem)


def _field(value):
    return value if type(value) in _SCALARS else f"<{type(value).__name__}> {short(repr(value), 120)}"


def schedule_as_data(schedule):
    """{rank: [Action]} -> [(rank, [(stage, kind, microbatch) | {"not_action": ...}])]."""
    if not isinstance(schedule, dict):
        return {"not_a_dict": f"{type(schedule).__name__}: {short(repr(schedule), 200)}"}
    out = []
    for rank, actions in schedule.items():
        rows = []
        for a in actions if isinstance(actions, (list, tuple)) else [actions]:
            if type(a).__name__ == "Action" and all(hasattr(a, f) for f in ("stage", "kind", "microbatch")):
                rows.append((_field(a.stage), _field(a.kind), _field(a.microbatch)))
            else:
                rows.append({"not_action": short(repr(a), 200)})
        out.append((_field(rank), rows))
    return out


def generate(stem: str, function: str, *args):
    try:
        schedule = getattr(student_module(stem), function)(*args)
    except ValueError as exc:
        return {"value_error": short(f"{type(exc).__name__}: {exc}")}
    return {"schedule": schedule_as_data(schedule)}


def validate(stem: str, schedule, p: int, m: int, v: int):
    module = student_module(stem)
    built = {rank: [module.Action(s, k, i) for s, k, i in actions] for rank, actions in schedule}
    try:
        module.validate(built, p, m, v)
    except ValueError as exc:
        rank, action = getattr(exc, "rank", None), getattr(exc, "action", None)
        return {"raised": type(exc).__name__, "message": short(str(exc)),
                "rank": rank if rank is None else _field(rank),
                "action": None if action is None else short(str(action), 200)}
    return {"accepted": True}


# ---------------------------------------------------------------- the executor, on 3 ranks

def prepare_executor(stem: str) -> None:
    """Import the student's executor (and torch) and start the ranks' fork server (which loads
    torch once for all ranks), while the trusted side computes its reference."""
    import multiprocessing.forkserver

    from scaletrain.launch import _context

    student_module(stem)
    if _context().get_start_method() == "forkserver":
        multiprocessing.forkserver.ensure_running()


def run_executor(stem: str, cases: list, timeout_s: float):
    """Every case in one spawn of p ranks: [per rank: [per case: outputs]]. The cases' tensors
    cross to the ranks and back as wire data: pickled, torch would hand them over as shared memory
    through a socket to this process, which the sandbox breaks (ConnectionResetError)."""
    from scaletrain.launch import RankError, spawn

    p = len(cases[0]["schedule"])
    try:
        per_rank = spawn(_executor_rank, p, stem, wire.encode(cases), timeout_s=timeout_s)
    except RankError as exc:
        raise _as_rank_failure(exc) from None
    return [wire.decode(out) for out in per_rank]


def _as_rank_failure(exc) -> Exception:
    """A rank's failure, under its own type name (so the trusted side classifies it as the rank's
    exception: NotImplementedError -> failed, TypeError -> error), naming the rank and the line."""
    import re
    from pathlib import Path

    where = ""
    for filename, line in reversed(re.findall(r'File "([^"]+)", line (\d+)', exc.remote_traceback or "")):
        if Path(filename).name.startswith("pp_"):
            where = f" (at {Path(filename).name}:{line})"
            break
    first = (exc.message or "").splitlines()[0] if exc.message else ""
    kind = exc.exc_type if str(exc.exc_type).isidentifier() else "RankFailure"
    return type(kind, (Exception,), {})(f"rank {exc.rank}: {first}{where}")


def _build(spec: dict, state: dict):
    import torch.nn as nn
    from scaletrain.models import Block, GPTConfig

    if spec["kind"] == "block":
        module = Block(GPTConfig(**spec["config"]))
    else:
        a, b = spec["widths"]
        module = nn.Sequential(nn.Linear(a, b), nn.LayerNorm(b), nn.GELU())
    module.load_state_dict(state)
    return module


def _tracer():
    """The wrapper class (built on first use: the pure probes above never import torch)."""
    import weakref

    import torch
    import torch.nn as nn

    class Tap(torch.autograd.Function):
        """Identity on a stage's output; its backward says that the gradient reached it."""

        @staticmethod
        def forward(ctx, y, trace, stage, index):
            ctx.trace, ctx.stage, ctx.index = trace, stage, index
            return y.clone()

        @staticmethod
        def backward(ctx, grad):
            ctx.trace.events.append(("G", ctx.stage, ctx.index))
            return grad, None, None, None

    class Trace:
        def __init__(self):
            self.events: list = []
            self.outputs: list = []   # weak references to every stage output of the step

        def alive(self) -> int:
            return sum(ref() is not None for ref in self.outputs)

    class Traced(nn.Module):
        def __init__(self, inner: nn.Module, stage: int, trace: Trace):
            super().__init__()
            self.inner, self.stage, self.trace = inner, stage, trace
            for q in inner.parameters():
                q.register_post_accumulate_grad_hook(lambda _q: trace.events.append(("A", stage)))

        def forward(self, x):
            y = self.inner(x)
            if not torch.is_grad_enabled():  # the executor's shape exchange: no activations kept
                return y
            index = len(self.trace.events)
            z = Tap.apply(y, self.trace, self.stage, index)
            self.trace.outputs.append(weakref.ref(z))
            self.trace.events.append(("F", self.stage, x.detach().clone(), self.trace.alive()))
            return z

    return Trace, Traced


def _executor_rank(rank: int, world_size: int, stem: str, cases: list) -> list:
    import gc

    import torch
    import torch.nn.functional as Fn

    cases = wire.decode(cases)
    mod = student_module(stem)
    # the trusted side generated (and validated) every schedule: the executor must not depend on
    # the student's own dry run (task 4.3), which its module imports under the library's name
    mod.validate = lambda *args, **kwargs: None
    Trace, Traced = _tracer()
    results = []
    for case in cases:
        trace = Trace()
        specs, states = case["specs"], case["states"]
        mine = {s: Traced(_build(specs[s], states[s]), s, trace) for s in range(len(specs)) if s % world_size == rank}
        schedule = {r: [mod.Action(s, k, i) for s, k, i in actions] for r, actions in case["schedule"]}
        ex = mod.PipelineExecutor(mine, schedule=schedule, loss_fn=Fn.mse_loss)
        last = len(specs) - 1
        losses = ex.step(case["x"] if 0 in mine else None, case["y"] if last in mine else None)
        held = getattr(ex, "in_flight", None)
        gc.collect()
        results.append({
            "grads": {str(s): [(name, None if q.grad is None else q.grad.detach().clone())
                               for name, q in module.inner.named_parameters()] for s, module in mine.items()},
            "losses": _losses(losses),
            "in_flight_after": len(held) if isinstance(held, list) else _field(held),
            "alive_after": trace.alive(),
            "events": trace.events,
        })
    return wire.encode(results)


def _losses(losses):
    if losses is None:
        return None
    if isinstance(losses, (list, tuple)):
        return [float(v) if type(v) in (int, float) else v.detach().clone() if _is_tensor(v) else _field(v)
                for v in losses]
    return _field(losses)


def _is_tensor(value) -> bool:
    import torch
    return isinstance(value, torch.Tensor)

