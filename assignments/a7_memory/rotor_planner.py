# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/checkpointing/planner.py by `python -m autograder release`; edit the source.
"""What to store and what to recompute under a memory budget: √n segments and Rotor's DP.

Chen et al. (2016), "Training Deep Nets with Sublinear Memory Cost", §4 (and the course seed
"Techniques for large-scale training", Gradient Checkpointing): cut n layers into d segments and
keep only the segment inputs; memory O(n/d) + O(d), smallest at d = √n, for one extra forward.
It ignores how big and how slow each stage is.

Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova (2019), "Optimal checkpointing for heterogeneous
chains: how to train deep neural networks with limited memory" (Rotor; "Training speed-up"
lecture, "Methods to Reduce Activations Memory: Rotor"): a dynamic program over sub-chains that
finds the fastest schedule within a budget (their §4, Theorem 1). A plan is a tree of the two
ways to run a sub-chain's first stage, `Store` (with its tape) or `Split` at some k (a checkpoint
of its input, the rest first, then its first part redone), and `schedule.simulate` gives any
plan's peak and time; the reference searches those trees with exact bytes (no discretisation,
unlike Rotor's memory slots), so it equals a brute force over all plans (the repository's tests
check it). `plan_rotor` is task 7.3 of assignment a7: how to search is the student's design.
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

    Contract: returns a `Plan` (`Store` / `Split` trees, schedule.py) of all `chain.n` stages with
    `schedule.simulate(plan, chain).peak_bytes <= budget` and a time no plan within the budget
    beats; raises ValueError when no plan fits (`min_peak(chain)` is the smallest budget that
    does). How to search is yours: read Beaumont et al. 2019, §4 (the sub-problems of a sub-chain
    and what each option leaves to them), and derive each option's time and memory from
    `simulate`'s rules. Exact bytes, no discretisation. Pitfalls: a sub-chain whose input a
    checkpoint already holds (`chain.tape(s, held)`); a Split's checkpoint is alive while its
    first part is redone; the search must be polynomial (memoize), chains have up to ~12 stages.
    Graded on hidden chains and budgets: the plan fits, its time equals the optimum, and an
    impossible budget raises ValueError (three checks).
    """
    budget = _check_budget("plan_rotor", budget)
    raise NotImplementedError('a7 task 7.3: implement `plan_rotor` (see assignments/a7_memory/README.md)')


def plan_sqrt(n: int) -> Plan:
    """Chen et al.'s rule: the n − 1 stages before the loss in round(√(n − 1)) segments."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"plan_sqrt: n must be an int >= 1 (stages, loss included), got {n!r}")
    return segments_plan(n, max(1, round(math.sqrt(n - 1)))) if n > 1 else store_all(1)
