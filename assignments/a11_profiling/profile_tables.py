# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/profile/tables.py by `python -m autograder release`; edit the source.
"""The tables of a profiled step: time by category and phase, each op on the roofline, the MFU.

  * by category (training-speedup-lecture.md, "GPT-2 Profiling: Time"): ms per step of matmul,
    attention, normalization, activation, elementwise, optimizer, communication and other, for the
    forward, the backward and the optimizer step, and the share of the step; a last row holds what
    no op accounts for (Python and dispatch between ops: large for a tiny model on a CPU, small for
    GPT-2 on a GPU, where the kernels are long).
  * by op: each priced op (cost.py) grouped by phase, name and shapes: its FLOPs, bytes,
    intensity, the FLOP/s it reached and the roofline's bound min(peak, I·bw) (roofline.py).
  * MFU (PaLM, appendix B; `scaletrain.memory.mfu`): 6·N·tokens per step over the step time and the
    measured peak; beside it the FLOPs the profile counted (attention's s² terms included).
"""

from __future__ import annotations

from collections import defaultdict

from scaletrain import memory
from scaletrain.profile.categories import CATEGORIES, categorise
from scaletrain.profile.roofline import Machine, attainable
from scaletrain.profile.trace import PHASES, StepProfile

__all__ = ["category_seconds", "category_table", "op_table", "step_mfu", "UNACCOUNTED"]

UNACCOUNTED = "between ops"


def category_seconds(prof: StepProfile) -> dict[tuple[str, str], float]:
    """(phase, category) -> seconds per step, the ops' inclusive times summed: `prof.ops` are the
    outermost ops of `prof.steps` profiled steps (trace.py), each with its phase, category and
    seconds (over all steps).  Pairs that no op has may be left out or be 0."""
    raise NotImplementedError('a11 task 11.3: implement `category_seconds` (see assignments/a11_profiling/README.md)')


def category_table(prof: StepProfile) -> list[dict]:
    """One row per category that took time, then the time between ops and the step's total."""
    secs = category_seconds(prof)
    phase_total = {p: prof.phase_seconds[p] / prof.steps for p in PHASES}
    step = sum(phase_total.values())
    rows = []
    for cat in CATEGORIES:
        per = {p: secs.get((p, cat), 0.0) for p in PHASES}
        if sum(per.values()) > 0:
            rows.append(_row(cat, per, step))
    gap = {p: phase_total[p] - sum(secs.get((p, c), 0.0) for c in CATEGORIES) for p in PHASES}
    rows.append(_row(UNACCOUNTED, gap, step))
    rows.append(_row("step (profiled)", phase_total, step))
    return rows


def _row(name: str, per_phase: dict[str, float], step: float) -> dict:
    total = sum(per_phase.values())
    return {"category": name, **{f"{p} ms": per_phase[p] * 1e3 for p in PHASES}, "step ms": total * 1e3,
            "% of step": 100 * total / step}


def op_table(prof: StepProfile, machine: Machine) -> list[dict]:
    """Priced ops grouped by (phase, name, shapes), the costliest first, each against the roofline."""
    groups: dict[tuple, list] = defaultdict(list)
    for k in prof.kernels:
        groups[(k.phase, k.name, k.shapes)].append(k)
    rows = []
    for (phase, name, shapes), ks in groups.items():
        secs = sum(k.seconds for k in ks) / prof.steps
        flops = sum(k.cost.flops for k in ks) / prof.steps
        nbytes = sum(k.cost.bytes for k in ks) / prof.steps
        intensity = flops / nbytes
        bound = attainable(machine, intensity)
        reached = flops / secs if secs > 0 else float("inf")
        rows.append({"phase": phase, "category": categorise(name),
                     "op": name.removeprefix("aten::").removeprefix("_scaled_dot_product_"), "shapes": _shapes(shapes),
                     "calls": len(ks) // prof.steps, "ms": secs * 1e3, "MFLOP": flops / 1e6, "MB": nbytes / 1e6,
                     "FLOP/B": intensity, "GFLOP/s": reached / 1e9, "bound GFLOP/s": bound / 1e9,
                     "% of bound": 100 * reached / bound,
                     "limit": "memory" if intensity < machine.ridge else "compute"})
    return sorted(rows, key=lambda r: -r["ms"])


def _shapes(shapes: tuple, width: int = 36) -> str:
    text = " ".join("x".join(map(str, s)) for s in shapes if s)
    return text if len(text) <= width else text[:width - 1] + "…"


def step_mfu(prof: StepProfile, machine: Machine, *, num_params: int, tokens: int) -> dict:
    """MFU of the profiled step against the measured peak, and the profile's own FLOP count.

    `num_params` parameters train on `tokens` tokens per step; `prof.phase_seconds` holds the wall
    time of each phase over all `prof.steps` steps; `prof.kernels` the priced ops, each with its
    `cost.flops` (over all steps).  The keys graded: "step ms" (one step's wall time), "model GFLOP
    (6NT)" (a training step's model FLOPs, Kaplan et al. 2020: forward and backward), "MFU %" (model
    FLOPs per second over the peak, PaLM appendix B), "counted GFLOP" (per step) and "counted / peak %"
    (the counted FLOPs per second over the peak); the others are shown beside them."""
    raise NotImplementedError('a11 task 11.3: implement `step_mfu` (see assignments/a11_profiling/README.md)')
