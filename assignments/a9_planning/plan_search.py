# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/plan/layouts.py by `python -m autograder release`; edit the source.
"""`search`: every layout of n GPUs that fits in memory, ranked by predicted throughput (a9 task 9.4),
and where context parallelism starts to pay (a9 task 9.5).

The space is Narayanan et al. 2021's (§3, "Performance Analysis of Parallelization
Configurations"): t·p·d = n with t dividing the heads and p·v dividing the layers, a microbatch b
dividing the B/d sequences of a replica, v chunks per pipeline rank (m a multiple of p when
v > 1), plus the ZeRO stage, recomputation and sequence parallelism when asked. The paper's
takeaways (§3.3-3.5) are what the ranking should rediscover, not rules coded into it: tensor
parallelism up to the GPUs of a node, pipeline parallelism across nodes for models that do not
fit, data parallelism for the rest; the microbatch that balances GEMM efficiency against the
bubble; interleaving where the batch is small. Notebook 09, section 6, shows that it does.

Since 2023 the space has two more axes: context parallelism (c ranks share every sequence; Liu et
al. 2023, Megatron-Core) and uneven pipeline stages (`scaletrain.plan.stages`). Notebook 09,
section 7, shows where each changes the winner.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import product
from typing import Callable, Iterable

from scaletrain.plan.prediction import Prediction, predict
from scaletrain.plan.specs import ClusterSpec, Layout, ModelSpec, check_layout
from scaletrain.plan.stages import stage_options

__all__ = ["divisors", "candidate_layouts", "search", "context_parallel_break_even", "MICROBATCHES"]

MICROBATCHES = (1, 2, 4, 8, 16)  # the sizes the paper sweeps (§5.7, Figure 16)


def divisors(n: int) -> list[int]:
    """The positive divisors of n, ascending."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"divisors: n must be a positive int, got {n!r}")
    return [k for k in range(1, n + 1) if n % k == 0]


def candidate_layouts(model: ModelSpec, cluster: ClusterSpec, gpus: int, global_batch: int, *,
                      microbatches: Iterable[int] = MICROBATCHES, interleaves: Iterable[int] | None = None,
                      zero: Iterable[int] = (0,), recompute: Iterable[str] = ("full",),
                      sequence_parallel: Iterable[bool] = (False,), overlap_dp: bool = True,
                      cps: Iterable[int] = (1,), uneven_stages: bool = False, flash_attention: bool = False,
                      overlap_pp: bool = False) -> list[Layout]:
    """Every layout of `gpus` GPUs that can run `model` at `global_batch` (fitting or not): the
    space of the module docstring (Narayanan et al. 2021 §3), each layout once, in any order.

    The layouts are every combination of: degrees t·c·p·d = gpus with c in `cps`; a microbatch in
    `microbatches`; v in `interleaves` (default: any v the smallest stage's layers allow); each
    ZeRO stage, recomputation and sequence-parallel option given; the even stage map and, with
    `uneven_stages`, the maps `stages.stage_options(model, p)` offers; the switches overlap_dp,
    flash_attention, overlap_pp copied into each. A combination is a candidate exactly when
    `Layout` and `check_layout` (for this GPU count) accept it. ValueError if none is left.

    Graded as a set against the reference on hidden models, GPU counts and options (the degrees,
    the options and the stage maps are separate checks), and for scale: the candidates of
    12,288 GPUs must come within seconds. How you enumerate and what you never generate is your
    design; the grader only sees the set.
    """
    for name, value in (("gpus", gpus), ("global_batch", global_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"candidate_layouts: {name} must be a positive int, got {value!r}")
    microbatches, zero, recompute = tuple(microbatches), tuple(zero), tuple(recompute)
    sequence_parallel, cps = tuple(sequence_parallel), tuple(cps)
    interleaves = None if interleaves is None else tuple(interleaves)
    switches = dict(overlap_dp=overlap_dp, flash_attention=flash_attention, overlap_pp=overlap_pp)
    raise NotImplementedError('a9 task 9.4: implement `candidate_layouts` (see assignments/a9_planning/README.md)')
    if not found:
        raise ValueError(f"no layout of {gpus} GPUs can run {model.name or 'the model'} (heads={model.heads}, "
                         f"layers={model.layers}) at global_batch={global_batch} with microbatches "
                         f"{sorted(set(microbatches))}: check that the batch divides among the replicas")
    return found


def search(model: ModelSpec, cluster: ClusterSpec, gpus: int, global_batch: int, *,
           predict_fn: Callable[[ModelSpec, ClusterSpec, Layout], Prediction] = predict,
           top: int | None = None, **space) -> list[Prediction]:
    """The predictions of the candidate layouts (`candidate_layouts(..., **space)`) that fit in the
    cluster's memory, fastest first: ascending `iteration_s`, ties broken by less memory. `top`
    keeps the first `top`. An empty list means nothing fits. `predict_fn` is `predict` unless you
    compare models (the grader hands in its own).

    Graded by two properties every correct search has: it never returns a layout that does not
    fit, and its ranking is exactly the one an exhaustive search over every candidate finds (the
    same iteration times and memory, in the same order, the same length).
    """
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise ValueError(f"search: top must be a positive int or None, got {top!r}")
    layouts = candidate_layouts(model, cluster, gpus, global_batch, **space)
    raise NotImplementedError('a9 task 9.4: implement `search` (see assignments/a9_planning/README.md)')


def context_parallel_break_even(model: ModelSpec, cluster: ClusterSpec, gpus: int, tokens: int,
                                seqs: Iterable[int], *, cps: Iterable[int] = (2, 4, 8),
                                predict_fn: Callable[[ModelSpec, ClusterSpec, Layout], Prediction] = predict,
                                **space) -> int | None:
    """The shortest sequence length in `seqs` at which context parallelism pays (a9 task 9.5), or
    None if it pays at none.

    At sequence length s the run trains `model` (its `seq` replaced by s) on `gpus` GPUs with
    tokens // s sequences per step; `space` is the rest of the search space (`candidate_layouts`'
    options). Context parallelism pays at s when the fastest fitting layout with some c in `cps`
    is strictly faster than the fastest fitting layout without it (c = 1), or when only layouts
    with c > 1 fit. A tie does not pay: c ranks that only reshape the same work are not worth
    the ring. Graded against the exhaustive answer on hidden models, clusters and lengths, with
    the grader's `predict_fn`; where no length pays, None.
    Pitfall: a length whose batch does not split over the replicas has no candidates at some c.
    """
    seqs, cps = sorted(set(seqs)), tuple(c for c in cps if c > 1)
    raise NotImplementedError('a9 task 9.5: implement `context_parallel_break_even` (see assignments/a9_planning/README.md)')
