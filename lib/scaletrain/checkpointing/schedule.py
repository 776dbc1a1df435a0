"""Checkpointing plans as data: what to store and what to recompute, in the seed's F/B notation.

A plan for stages s..t of a chain is a tree of two kinds of node (Rotor's two choices, Beaumont
et al. 2019, §4; the sequence in "Training speed-up" lecture, "Methods to Reduce Activations
Memory: Rotor"):

  Store(s, rest)          F_s^e  [rest]  B_s
      run F_s recording its tape, go on with `rest` (stages s+1..t, or nothing when s = t), then
      backpropagate through F_s.
  Split(s, k, first, rest)  F_s^c F_{s+1}^n … F_{k-1}^n  [rest]  [first]
      run F_s..F_{k-1} without recording (keeping only x_{s-1}, the checkpoint), go on with
      `rest` (stages k..t), then redo stages s..k-1 following `first`, which starts from the
      checkpoint.

F^e records everything ("e"), F^c keeps its input ("c"), F^n keeps nothing ("n"). The seed's
example F_1^c F_2^n F_3^n F_4^e F_5^e F_6^e Loss B_Loss B_6 B_5 B_4 F_1^c F_2^n F_3^e B_3 F_1^e F_2^e
B_2 B_1 is Split(1, 4, Split(1, 3, Store(1, Store(2)), Store(3)), Store(4, Store(5, Store(6, Store(Loss))))).

`simulate` gives a plan's peak memory and time from a `Chain` (the recurrences the planner
minimises); `timeline` the same op by op, for drawing. Indices are 0-based in code, 1-based in
the notation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from scaletrain.checkpointing.chain import Chain

__all__ = ["Store", "Split", "Plan", "Op", "span", "validate", "ops", "notation", "Simulation", "simulate",
           "timeline", "store_all", "segments_plan", "to_data", "from_data"]


@dataclass(frozen=True)
class Store:
    stage: int
    rest: "Plan | None" = None


@dataclass(frozen=True)
class Split:
    stage: int
    split: int
    first: "Plan"
    rest: "Plan"


Plan = Union[Store, Split]


@dataclass(frozen=True)
class Op:
    kind: str      # "F" or "B"
    stage: int
    mode: str = ""  # F only: "e" record, "c" keep the input, "n" keep nothing


def span(node: Plan) -> tuple[int, int]:
    """(s, t): the stages the (valid) plan covers, inclusive: the rest-chain ends at t."""
    s = node.stage
    while not (isinstance(node, Store) and node.rest is None):
        node = node.rest
    return s, node.stage


def validate(node: Plan, n: int | None = None) -> tuple[int, int]:
    """Check the tree covers consecutive stages (0..n-1 when `n` is given); return its span."""
    if isinstance(node, Store):
        if isinstance(node.stage, bool) or not isinstance(node.stage, int) or node.stage < 0:
            raise ValueError(f"plan: Store.stage must be an int >= 0, got {node.stage!r}")
        if node.rest is None:
            s, t = node.stage, node.stage
        else:
            rs, t = validate(node.rest)
            if rs != node.stage + 1:
                raise ValueError(f"plan: Store({node.stage + 1})'s rest starts at stage {rs + 1}, expected {node.stage + 2}")
            s = node.stage
    elif isinstance(node, Split):
        fs, ft = validate(node.first)
        rs, t = validate(node.rest)
        if not (fs == node.stage and ft == node.split - 1 and rs == node.split):
            raise ValueError(f"plan: Split({node.stage + 1}, {node.split + 1}) must recompute stages "
                             f"{node.stage + 1}..{node.split} and continue at {node.split + 1}; its parts cover "
                             f"{fs + 1}..{ft + 1} and {rs + 1}..{t + 1}")
        s = node.stage
    else:
        raise ValueError(f"plan: expected Store or Split, got {type(node).__name__}")
    if n is not None and (s, t) != (0, n - 1):
        raise ValueError(f"plan: covers stages {s + 1}..{t + 1}, the chain has stages 1..{n}")
    return s, t


def ops(node: Plan) -> list[Op]:
    """The plan as the seed's sequence of operations."""
    if isinstance(node, Store):
        return [Op("F", node.stage, "e"), *(ops(node.rest) if node.rest else []), Op("B", node.stage)]
    first = [Op("F", node.stage, "c"), *(Op("F", i, "n") for i in range(node.stage + 1, node.split))]
    return first + ops(node.rest) + ops(node.first)


def notation(node: Plan, *, loss_last: bool = True) -> str:
    """'F_1^c F_2^n … Loss B_Loss B_6 …' (the last stage shown as Loss when `loss_last`)."""
    last = span(node)[1]
    words = []
    for op in ops(node):
        if loss_last and op.stage == last:
            words.append("Loss" if op.kind == "F" else "B_Loss")
        else:
            words.append(f"F_{op.stage + 1}^{op.mode}" if op.kind == "F" else f"B_{op.stage + 1}")
    return " ".join(words)


@dataclass(frozen=True)
class Simulation:
    peak_bytes: int      # max of saved bytes over the run (tapes + checkpoints)
    time_s: float        # forward + backward + recomputation
    recompute_s: float   # the extra forward time: time_s − Σ(u_f + u_b)


def _sim(node: Plan, chain: Chain, held: bool) -> tuple[int, float]:
    """(peak bytes above the caller's, time) of a sub-plan whose input is held by the caller or not.

    Store:  peak = tape(s, held) + peak(rest, held=False); time = u_f(s) + time(rest) + u_b(s)
    Split:  keep = 0 if held else a_s (the checkpoint of x_{s-1});
            peak = keep + max(peak(rest, False), peak(first, True));
            time = Σ_{i=s}^{k-1} u_f(i) + time(rest) + time(first)
    """
    if isinstance(node, Store):
        peak, cost = _sim(node.rest, chain, False) if node.rest is not None else (0, 0.0)
        return chain.tape(node.stage, held) + peak, chain.forward_s[node.stage] + cost + chain.backward_s[node.stage]
    keep = 0 if held else chain.input_bytes[node.stage]
    p_rest, c_rest = _sim(node.rest, chain, False)
    p_first, c_first = _sim(node.first, chain, True)
    return keep + max(p_rest, p_first), sum(chain.forward_s[node.stage:node.split]) + c_rest + c_first


def simulate(node: Plan, chain: Chain, *, input_held: bool = False) -> Simulation:
    """Peak saved bytes and time of `node` on `chain` (`input_held`: x_0 is saved elsewhere)."""
    validate(node, chain.n)
    peak, cost = _sim(node, chain, input_held)
    return Simulation(peak, cost, cost - sum(chain.forward_s) - sum(chain.backward_s))


def timeline(node: Plan, chain: Chain, *, input_held: bool = False) -> list[tuple[Op, float, float, int]]:
    """(op, start s, duration s, saved bytes after the op) for every op, in order; the maximum of
    the last column is `simulate(...).peak_bytes`."""
    validate(node, chain.n)
    rows: list[tuple[Op, float, float, int]] = []
    clock = [0.0]

    def emit(op: Op, duration: float, live: int) -> None:
        rows.append((op, clock[0], duration, live))
        clock[0] += duration

    def walk(n: Plan, held: bool, base: int) -> None:
        if isinstance(n, Store):
            tape = chain.tape(n.stage, held)
            emit(Op("F", n.stage, "e"), chain.forward_s[n.stage], base + tape)
            if n.rest is not None:
                walk(n.rest, False, base + tape)
            emit(Op("B", n.stage), chain.backward_s[n.stage], base)
            return
        keep = 0 if held else chain.input_bytes[n.stage]
        emit(Op("F", n.stage, "c"), chain.forward_s[n.stage], base + keep)
        for i in range(n.stage + 1, n.split):
            emit(Op("F", i, "n"), chain.forward_s[i], base + keep)
        walk(n.rest, False, base + keep)
        walk(n.first, True, base + keep)
        op, start, duration, _ = rows[-1]   # the checkpoint goes with the last backward that needs it
        rows[-1] = (op, start, duration, base)

    walk(node, input_held, 0)
    return rows


def store_all(n: int, start: int = 0) -> Plan:
    """Plain backpropagation: every stage recorded, nothing recomputed."""
    node: Plan = Store(n - 1)
    for i in range(n - 2, start - 1, -1):
        node = Store(i, node)
    return node


def segments_plan(n: int, segments: int) -> Plan:
    """What `checkpoint_sequential(stages[:-1], segments, x)` followed by the loss stage does: the
    first n−1 stages in `segments` segments of (n−1) // segments, each but the last checkpointed and
    recomputed with its tape recorded; the last segment and the loss recorded directly."""
    body = n - 1
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= max(body, 1):
        raise ValueError(f"segments_plan: segments must be an int in [1, {max(body, 1)}], got {segments!r}")
    size = body // segments if body else 1
    starts = list(range(0, size * (segments - 1), size)) if body else []
    node = store_all(n, starts[-1] + size if starts else 0)
    for s in reversed(starts):
        node = Split(s, s + size, store_all(s + size, s), node)
    return node


def to_data(node: Plan):
    """Nested tuples, for JSON and the grader's wire: ("store", s, rest) / ("split", s, k, first, rest)."""
    if isinstance(node, Store):
        return ("store", node.stage, None if node.rest is None else to_data(node.rest))
    if isinstance(node, Split):
        return ("split", node.stage, node.split, to_data(node.first), to_data(node.rest))
    raise ValueError(f"to_data: expected Store or Split, got {type(node).__name__}")


def from_data(data) -> Plan:
    """The inverse of `to_data`; anything malformed raises ValueError."""
    if not isinstance(data, (tuple, list)) or not data:
        raise ValueError(f"from_data: expected a ('store', ...) or ('split', ...) tuple, got {data!r:.80}")
    if data[0] == "store" and len(data) == 3:
        return Store(data[1], None if data[2] is None else from_data(data[2]))
    if data[0] == "split" and len(data) == 5:
        return Split(data[1], data[2], from_data(data[3]), from_data(data[4]))
    raise ValueError(f"from_data: malformed node {data!r:.80}")
