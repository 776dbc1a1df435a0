"""Run N training steps under `torch.profiler` and turn its events into one record per operation.

training-speedup-lecture.md, "Model Profiling": the goal is "the most costly operations in terms
of time and memory", with the PyTorch profiler (Kineto) among the tools.  A step is marked in
three phases with `record_function` (forward, backward, optimizer: zero_grad and step), and every
profiler event is placed in the phase whose interval holds its start (intervals, not parents, so
the autograd engine's own thread on a GPU lands in the backward too).

Two views of the same events:
  * `ops`: the outermost operations (an aten op, an autograd node or a labelled call of
    scaletrain.ops, `scaletrain::attention`, with no operation above it),
    each with its inclusive time, categorised (categories.py).  They tile the step without double
    counting: an outer op's time already holds its inner ops'.  On a GPU an op's time is the device
    time of the kernels it launched; on a CPU, its wall time on the calling thread.
  * `kernels`: the ops cost.py can price (matmuls, attention, LayerNorm, softmax, elementwise), the
    outermost priced op of each branch, with FLOPs and bytes from the recorded shapes: the roofline's
    points.  A linear's backward shows as its two `aten::mm`, the dX and dW products.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from scaletrain.ops.labels import PREFIX as LABEL_PREFIX
from scaletrain.profile.categories import categorise
from scaletrain.profile.cost import Cost, op_cost

__all__ = ["PHASES", "OpRecord", "StepProfile", "profile_steps", "training_step"]

PHASES = ("forward", "backward", "optimizer")
_MARK = "phase:"


@dataclass(frozen=True)
class OpRecord:
    name: str
    phase: str
    category: str
    seconds: float            # summed over the profiled steps
    cost: Cost | None = None  # kernels only
    shapes: tuple = ()
    step: int = 0             # which profiled step (0-based) it ran in


@dataclass
class StepProfile:
    """What `profile_steps` saw over `steps` steps (times are totals: divide by steps for one step)."""
    ops: list[OpRecord]
    kernels: list[OpRecord]
    phase_seconds: dict[str, float]   # wall time inside each phase marker
    steps: int
    device: str
    trace_path: Path | None = None
    peak_memory: int | None = None    # bytes, the allocator's peak over the profiled steps (GPU)
    by_step: list[dict[str, float]] = field(default_factory=list)  # phase wall times, step by step

    def median_step(self) -> "StepProfile":
        """The profile of the one step whose wall time is the median (the lower one for an even count):
        on a shared machine a preempted op inflates its step, and the median step leaves it out while
        its rows still add up to one real step."""
        totals = [sum(d.values()) for d in self.by_step]
        k = sorted(range(len(totals)), key=totals.__getitem__)[(len(totals) - 1) // 2]
        return StepProfile([o for o in self.ops if o.step == k], [o for o in self.kernels if o.step == k],
                           dict(self.by_step[k]), 1, self.device, self.trace_path, self.peak_memory, [self.by_step[k]])


def training_step(model: torch.nn.Module, batch: tuple, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """One step of `model(*batch) -> (logits, loss)` with its three phases marked for the profiler.

    On a GPU each phase ends by waiting for its kernels: the host only queues them, so without the
    wait a marker's interval is the time to *launch* a phase (the first H200 run, 2026-11-27, read
    a 52 ms step of 81 ms of kernels, and an MFU of 115 %).  Three waits a step cost microseconds."""
    def step():
        with record_function(_MARK + "forward"):
            loss = model(*batch)[1]
            _finish(loss)
        with record_function(_MARK + "backward"):
            loss.backward()
            _finish(loss)
        with record_function(_MARK + "optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            _finish(loss)
    return step


def _finish(t: torch.Tensor) -> None:
    """Wait for the kernels queued on t's GPU (nothing to wait for on a CPU)."""
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


def _is_op(event) -> bool:
    """An operation: an aten op, an autograd node, a collective, or a call of scaletrain.ops (its
    labelled range: a Triton or CUDA kernel launched from Python has no aten op above it)."""
    return event.name.startswith(("aten::", LABEL_PREFIX, "nccl:", "gloo:")) or "evaluate_function:" in event.name \
        or "c10d::" in event.name


def _phase_of(event, intervals) -> tuple[str, int] | None:
    start = event.time_range.start
    return next(((phase, step) for phase, step, lo, hi in intervals if lo <= start <= hi), None)


def _has_op_above(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if _is_op(parent):
            return True
        parent = parent.cpu_parent
    return False


def _cost(event, memo: dict) -> Cost | None:
    """op_cost of the event, remembered in `memo` (one profile's): every ancestor walk asks again."""
    if id(event) not in memo:
        memo[id(event)] = op_cost(event.name, event.input_shapes or (), _dtypes(event),
                                  event.concrete_inputs or ()) if event.name.startswith("aten::") else None
    return memo[id(event)]


def _dtypes(event) -> tuple:
    """The op's input dtypes as the profiler recorded them; torch 2.11 (the lent GPU machines') records
    none (no `input_dtypes`), and cost.py then prices by the shapes' element count in fp32."""
    return tuple(getattr(event, "input_dtypes", None) or ())


def _priced_above(event, memo: dict) -> bool:
    """An op above `event` is priced already (addmm's internal copy is part of addmm, not a point)."""
    parent = event.cpu_parent
    while parent is not None:
        if _cost(parent, memo) is not None:
            return True
        parent = parent.cpu_parent
    return False


def _on_host(event) -> bool:
    """A CPU-side event: on a GPU each `record_function` range and op has a device-side twin of the
    same name (a "gpu_user_annotation"), on the GPU's own clock; the phases are the host's ranges."""
    return event.device_type == DeviceType.CPU


def _records(events, cuda: bool):
    events = [e for e in events if _on_host(e)]
    marks = sorted((e for e in events if e.name.startswith(_MARK)), key=lambda e: e.time_range.start)
    # three markers per step, in order: the i-th marker belongs to step i // 3
    intervals = [(e.name[len(_MARK):], i // len(PHASES), e.time_range.start, e.time_range.end)
                 for i, e in enumerate(marks)]
    by_step = [{p: 0.0 for p in PHASES} for _ in range(len(marks) // len(PHASES))]
    for phase, step, lo, hi in intervals:
        by_step[step][phase] += (hi - lo) / 1e6
    ops, kernels, memo = [], [], {}
    for e in events:
        if not _is_op(e) or (where := _phase_of(e, intervals)) is None:
            continue
        phase, step = where
        if not _has_op_above(e):
            category = "optimizer" if phase == "optimizer" and categorise(e.name) != "communication" \
                else categorise(e.name)
            us = e.device_time_total if cuda else e.cpu_time_total
            ops.append(OpRecord(e.name, phase, category, us / 1e6, shapes=tuple(map(tuple, e.input_shapes or ())),
                                step=step))
        if (cost := _cost(e, memo)) is not None and not _priced_above(e, memo):
            us = e.device_time_total if cuda else e.cpu_time_total
            kernels.append(OpRecord(e.name, phase, categorise(e.name), us / 1e6, cost,
                                    tuple(map(tuple, e.input_shapes or ())), step))
    return ops, kernels, by_step


def profile_steps(step: Callable[[], None], *, steps: int = 3, warmup: int = 1, device: str = "cpu",
                  trace_path: str | Path | None = None) -> StepProfile:
    """Profile `steps` calls of `step` (after `warmup` unprofiled ones, the profiler's own start-up
    included), recording shapes and memory; CUDA activity too when `device` is a GPU.  The Chrome
    trace (chrome://tracing, ui.perfetto.dev) is written to `trace_path` when given."""
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    with profile(activities=activities, record_shapes=True, profile_memory=True,
                 schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1), acc_events=True) as prof:
        for _ in range(warmup + steps):
            step()
            if cuda:
                torch.cuda.synchronize(device)
            prof.step()
    ops, kernels, by_step = _records(prof.events(), cuda)
    phases = {p: sum(d[p] for d in by_step) for p in PHASES}
    path = None
    if trace_path is not None:
        path = Path(trace_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    return StepProfile(ops, kernels, phases, steps, device, path, peak, by_step)
