"""What to store and what to recompute under a memory budget: √n segments and Rotor's DP.

Chen et al. (2016), "Training Deep Nets with Sublinear Memory Cost", §4 (and the course seed
"Techniques for large-scale training", Gradient Checkpointing): cut n layers into d segments and
keep only the segment inputs; memory O(n/d) + O(d), smallest at d = √n, for one extra forward.
It ignores how big and how slow each stage is.

Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova (2019), "Optimal checkpointing for heterogeneous
chains: how to train deep neural networks with limited memory" (Rotor; "Training speed-up"
lecture, "Methods to Reduce Activations Memory: Rotor"): a dynamic program over sub-chains that
finds the fastest schedule within a budget. Let C(s, t, held, m) be the least time to
backpropagate stages s..t (their input x_{s-1} given, held by a checkpoint already or not; the
gradient of x_t arriving) while never keeping more than m bytes above what is kept outside.
Its options are the two ways to run stage s (`Store` with its tape, or `Split` at some k with a
checkpoint of x_{s-1}: the handout, task 7.3, and schedule.py), each costing its own level's
time plus its sub-problems' optimal times; ∞ when nothing fits. The memory follows
`schedule.simulate`'s rules: a Store holds its tape while the rest runs; a Split holds its
checkpoint while the rest runs *and* while its first part is redone. The answer is
C(0, n−1, False, budget) and the tree of choices that reaches it. Exact bytes (no discretisation, unlike Rotor's memory slots), so it equals a brute
force over all plans; `plan_rotor` is task 7.3 of assignment a7.
"""

from __future__ import annotations

import functools
import math

from scaletrain.checkpointing.chain import Chain
from scaletrain.checkpointing.schedule import Plan, Split, Store, segments_plan, store_all

__all__ = ["plan_rotor", "plan_sqrt", "min_peak", "store_all_peak"]


def _check_budget(fn: str, budget) -> int:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"{fn}: budget must be an int number of bytes >= 0, got {budget!r}")
    return budget


def store_all_peak(chain: Chain, s: int = 0, t: int | None = None, held: bool = False) -> int:
    """Peak of plain backpropagation of stages s..t: every tape alive at the end of the forward."""
    t = chain.n - 1 if t is None else t
    return chain.tape(s, held) + sum(chain.tape(i, False) for i in range(s + 1, t + 1))


def _lowest(chain: Chain):
    """lowest(s, t, held): the smallest peak any plan of stages s..t reaches (the recurrences of
    C with min over peaks instead of times)."""
    @functools.lru_cache(maxsize=None)
    def lowest(s: int, t: int, held: bool) -> int:
        best = chain.tape(s, held) + (lowest(s + 1, t, False) if s < t else 0)
        keep = 0 if held else chain.input_bytes[s]
        for k in range(s + 1, t + 1):
            best = min(best, keep + max(lowest(k, t, False), lowest(s, k - 1, True)))
        return best
    return lowest


def min_peak(chain: Chain) -> int:
    """The smallest budget for which any plan exists."""
    return _lowest(chain)(0, chain.n - 1, False)


def plan_rotor(chain: Chain, budget: int) -> Plan:
    """The fastest plan whose peak saved bytes stay within `budget` (task 7.3).

    Implement `best(s, t, held, m)` → (time, plan of stages s..t) or None when nothing fits in m
    bytes, following C(s, t, held, m) in the module docstring: try Store(s, ...) and every
    Split(s, k, ...), keep the fastest. Use `chain.tape(s, held)`, `chain.input_bytes[s]`,
    `chain.forward_s`, `chain.backward_s`, and `forward(s, k)` = Σ_{i=s}^{k-1} u_f(i).
    Two cases are answered before your code runs: m below the lowest possible peak (None), and m
    enough to store everything (plain backpropagation is then the fastest).
    Raises ValueError when no plan fits `budget`.
    """
    budget = _check_budget("plan_rotor", budget)
    lowest = _lowest(chain)
    prefix = [0.0]
    for u in chain.forward_s:
        prefix.append(prefix[-1] + u)

    def forward(s: int, k: int) -> float:
        return prefix[k] - prefix[s]

    @functools.lru_cache(maxsize=None)
    def best(s: int, t: int, held: bool, m: int) -> tuple[float, Plan] | None:
        if m < lowest(s, t, held):
            return None
        if m >= store_all_peak(chain, s, t, held):
            return forward(s, t + 1) + sum(chain.backward_s[s:t + 1]), store_all(t + 1, s)
        # BEGIN SOLUTION
        options: list[tuple[float, Plan]] = []
        tape = chain.tape(s, held)
        if tape <= m:
            rest = best(s + 1, t, False, m - tape) if s < t else (0.0, None)
            if rest is not None:
                options.append((chain.forward_s[s] + rest[0] + chain.backward_s[s], Store(s, rest[1])))
        keep = 0 if held else chain.input_bytes[s]
        if keep <= m:
            for k in range(s + 1, t + 1):
                rest, first = best(k, t, False, m - keep), best(s, k - 1, True, m - keep)
                if rest is not None and first is not None:
                    options.append((forward(s, k) + rest[0] + first[0], Split(s, k, first[1], rest[1])))
        return min(options, key=lambda o: o[0]) if options else None
        # END SOLUTION

    found = best(0, chain.n - 1, False, budget)
    if found is None:
        raise ValueError(f"plan_rotor: no plan keeps the saved bytes within {budget:,} B; the smallest "
                         f"possible peak on this chain is {lowest(0, chain.n - 1, False):,} B")
    return found[1]


def plan_sqrt(n: int) -> Plan:
    """Chen et al.'s rule: the n − 1 stages before the loss in round(√(n − 1)) segments."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"plan_sqrt: n must be an int >= 1 (stages, loss included), got {n!r}")
    return segments_plan(n, max(1, round(math.sqrt(n - 1)))) if n > 1 else store_all(1)
