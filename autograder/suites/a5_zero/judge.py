"""a5's group: which checks need which task functions, the stub detection (read as text: this
process never imports the submission), and `group_ranks`, which runs every job in one spawn and
judges each check."""

from __future__ import annotations

import ast
from pathlib import Path

from autograder import checks
from autograder.pyparse import parse_python
from autograder.suites import sized

from .inputs import GATHERS, _shard_cases
from .judge_stages import (_verify_early, _verify_equal, _verify_held, _verify_sent, _verify_stage3, _verify_unshard)
from .names import (C_S1_EQ, C_S1_HELD, C_S1_SENT, C_S2_EARLY, C_S2_EQ, C_S2_HELD, C_S2_SENT, C_S3_COMM, C_S3_EQ,
                    C_S3_GATHER, C_S3_HELD, C_SHARD, C_UNSHARD, P, PG_TIMEOUT_S, PROBE, SPAWN_TIMEOUT_S, STEM, ZF, ZF3)
from .reference import _Reference, _outputs


VERIFY = {C_UNSHARD: (_verify_unshard,), C_S1_EQ: (_verify_equal,), C_S2_EQ: (_verify_equal,),
          C_S3_EQ: (_verify_equal,), C_S1_HELD: (_verify_held,), C_S1_SENT: (_verify_sent,),
          C_S2_HELD: (_verify_held,), C_S2_SENT: (_verify_sent,), C_S2_EARLY: (_verify_early,),
          C_S3_HELD: (_verify_held,), C_S3_GATHER: (_verify_stage3,), C_S3_COMM: (_verify_sent,)}
CHECKS = (C_SHARD, C_UNSHARD, C_S1_EQ, C_S1_HELD, C_S1_SENT, C_S2_EQ, C_S2_HELD, C_S2_SENT, C_S2_EARLY, C_S3_EQ,
          C_S3_HELD, C_S3_GATHER, C_S3_COMM)
# what each task's checks call: every stage gathers with 5.1's functions, stage 3 reduces with 5.3's
S1, S2, S3 = ("_step_stage1",), ("_grad_ready", "_reduce_scatter_unit"), ("gather", "free", "_post_forward",
                                                                             "_pre_backward")
NEEDS = {C_SHARD: ("shard_of",), C_UNSHARD: ("unshard",)}
NEEDS.update({name: ("shard_of", "unshard") + extra for names, extra in (
    ((C_S1_EQ, C_S1_HELD, C_S1_SENT), S1), ((C_S2_EQ, C_S2_HELD, C_S2_SENT, C_S2_EARLY), S2 + ("_step_stage2",)),
    ((C_S3_EQ, C_S3_HELD, C_S3_GATHER, C_S3_COMM), S2 + S3)) for name in names})


def unimplemented(path: Path) -> set[str]:
    """The task functions of the file whose body still raises NotImplementedError (the stub's)."""
    tree = parse_python(path.read_text(errors="replace"), str(path))
    wanted = {f for functions in NEEDS.values() for f in functions}
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name in wanted
            and any(isinstance(st, ast.Raise) and "NotImplementedError" in ast.unparse(st) for st in node.body)}


def _verify_shards(cases, got) -> None:
    if not isinstance(got, list) or len(got) != len(cases):
        raise AssertionError("shard_of: the probe returned no answer per case")
    for (full, rank, size), g in zip(cases, got, strict=True):
        m, call = full.numel() // size, f"shard_of(N={size}, r={rank})"
        if g.get("value") is None:
            raise AssertionError(f"{call} returned {g.get('type')}, expected a tensor")
        value = g["value"]
        if tuple(value.shape) != (m,):
            raise AssertionError(f"{call} has shape {tuple(value.shape)}, expected ({m},)")
        checks.assert_equal(value, full[rank * m:(rank + 1) * m], what=call)
        if not g["same_storage"] or g["offset"] != rank * m:
            raise AssertionError(f"{call} must return a view of the buffer starting at element {rank * m} (the "
                                 "optimizer updates the parameters through it)")


def group_ranks(ctx):
    todo = unimplemented(ctx.submission / ZF) | unimplemented(ctx.submission / ZF3)  # read as text, never imported
    skip = {name: ", ".join(f"`{f}`" for f in NEEDS[name] if f in todo) + " still raise NotImplementedError"
            for name in CHECKS if todo & set(NEEDS[name])}
    seed = checks.trial_seeds(1, salt=55)[0]
    wanted = {n for n in CHECKS if n not in skip}
    worker, failure, per_rank = ctx.untrusted(), None, []
    if not worker.started:
        worker.start()  # forked (with a preexec_fn) before this process has a second thread
    ref = _Reference()
    ref.start(wanted, seed)  # the jobs and their expected values, here, while the worker boots
    try:  # a broken import fails every check, with its line
        worker.call(PROBE + "load", STEM, ranks=bool(wanted - {C_SHARD}), timeout_s=60)
    except Exception as exc:  # noqa: BLE001 - reported inside every check below
        failure = exc
    jobs, need = ref.jobs(), ref.need
    if C_SHARD not in skip and failure is None:
        cases = _shard_cases(seed)
        with ctx.check(C_SHARD):
            _verify_shards(cases, worker.call(PROBE + "shard_views", STEM, cases, timeout_s=60))
    if jobs and failure is None:
        try:
            per_rank = sized(worker.call(PROBE + "run_ranks", STEM, jobs, P, PG_TIMEOUT_S, SPAWN_TIMEOUT_S,
                                         timeout_s=SPAWN_TIMEOUT_S + 30), P, "the ranks' answers")
        except Exception as exc:  # noqa: BLE001 - reported inside every check below
            failure = exc
    ref.wait()
    for name in CHECKS:
        if ctx.recorded(name):
            continue
        with ctx.check(name):
            if failure is not None:
                raise failure
            if name in skip:
                raise NotImplementedError(skip[name])
            mine = need[name]
            problem = checks.rank_failure(mine, per_rank)
            if problem is not None:
                raise problem
            for job in mine:
                outs = _outputs(job, per_rank)
                for verify in VERIFY[name]:
                    if verify is _verify_stage3 and job["key"] not in GATHERS:
                        continue
                    verify(job, outs, ref)
