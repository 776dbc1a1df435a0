"""a9 tasks 9.4 and 9.5's verdicts: the candidate set by property (degrees, options, stage maps,
scale), the search by the two properties every correct search has (it returns only layouts that
fit; its ranking is the exhaustive one), and where context parallelism pays. The search and 9.5
rank predictions the grader computed (`predict_fn` from a table), so a wrong 9.1-9.3 costs nothing
here, and 9.5 runs on the table's own search, so a wrong 9.4 costs nothing there."""

from __future__ import annotations

import dataclasses
import random
import time

from autograder import checks

from .inputs import cp_case, public_search_case, random_cluster, search_case
from .judge_common import as_dict
from .names import (C_CAND_DEGREES, C_CAND_OPTIONS, C_CAND_SCALE, C_CAND_STAGES, C_CP_NEVER, C_CP_PAYS,
                    C_SEARCH_FITS, C_SEARCH_OPT, PROBE)

SCALE_SECONDS = 20.0  # the reference takes about a second for both; a product over all t, p, d, b never ends
PREDICTED = ("iteration_s", "tflops_per_gpu", "mfu", "tokens_per_s", "memory_per_gpu_bytes", "fits")


def key(fields: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in fields.items()))


def _candidate_cases(check: str) -> list:
    from scaletrain.plan import GPT3_175B
    seeds = checks.trial_seeds(8, salt=7)
    if check == C_CAND_DEGREES:
        impossible = (GPT3_175B, random_cluster(random.Random(0)), 7, 1536, {})  # 7 GPUs: no split
        cases = [search_case(s, allow_empty=True) for s in seeds]
        cases = [(m, c, g, b, {"cps": (1, 2, 4)} if i % 2 else {}) for i, (m, c, g, b, _) in enumerate(cases)]
        return [*cases, impossible, public_search_case()]
    if check == C_CAND_OPTIONS:
        return [search_case(s, allow_empty=True) for s in seeds]
    return [search_case(s, new_axes=True) for s in seeds]


def _compare_candidates(cand, model, cluster, gpus, batch, space) -> None:
    from scaletrain.plan.layouts import candidate_layouts

    call = f"candidate_layouts(model(l={model.layers}, a={model.heads}), gpus={gpus}, global_batch={batch}, {space})"
    try:
        want = {key(as_dict(lay)) for lay in candidate_layouts(model, cluster, gpus, batch, **space)}
    except ValueError:
        want = None  # no layout can run it: the student's must refuse with a ValueError too
    got = cand.candidate_layouts(model=as_dict(model), cluster=as_dict(cluster), gpus=gpus, global_batch=batch,
                                 space=space)
    if want is None:
        assert "raised" in got, f"{call}: no layout can run this; expected a ValueError, got {got!r:.200}"
        return
    assert "layouts" in got, f"{call} raised {got.get('raised')}, but {len(want)} layouts can run it"
    got_keys = [key(f) for f in got["layouts"]]
    assert len(got_keys) == len(set(got_keys)), f"{call} lists a layout twice"
    missing, extra = want - set(got_keys), set(got_keys) - want
    assert not missing and not extra, (f"{call}: {len(missing)} valid layouts missing (e.g. "
                                       f"{dict(next(iter(missing))) if missing else None}), {len(extra)} that "
                                       f"can't run (e.g. {dict(next(iter(extra))) if extra else None})")


def _scale(cand) -> None:
    from scaletrain.plan import CLUSTERS, GPT3_175B
    from scaletrain.plan.published_runs import LLAMA3_405B

    for model, gpus, space in ((GPT3_175B, 6144, {}), (LLAMA3_405B, 12288, {"uneven_stages": True})):
        start = time.perf_counter()
        _compare_candidates(cand, model, CLUSTERS["h100"], gpus, 6144, space)
        seconds = time.perf_counter() - start
        assert seconds < SCALE_SECONDS, (f"candidate_layouts({model.name}, {gpus} GPUs) took {seconds:.0f} s; "
                                         f"enumerate only what can be valid (under {SCALE_SECONDS:.0f} s)")


def group_search(ctx):
    cand = ctx.remote("plan_search", probe=PROBE + "candidates")
    ranked = ctx.remote("plan_search", probe=PROBE + "search_with_table")
    for check in (C_CAND_DEGREES, C_CAND_OPTIONS, C_CAND_STAGES):
        with ctx.check(check):
            for case in _candidate_cases(check):
                _compare_candidates(cand, *case)
    with ctx.check(C_CAND_SCALE):
        _scale(cand)
    cases = [(search_case(seed, new_axes=i % 3 == 2), None if i % 2 else 1 + i)
             for i, seed in enumerate(checks.trial_seeds(10, salt=8))] + [(public_search_case(), 5)]
    for check in (C_SEARCH_FITS, C_SEARCH_OPT):
        with ctx.check(check):
            for (model, cluster, gpus, batch, space), top in cases:
                _judge_search(ranked, check, model, cluster, gpus, batch, space, top)


def _judge_search(ranked, check, model, cluster, gpus, batch, space, top) -> None:
    from scaletrain.plan.layouts import candidate_layouts, search
    from scaletrain.plan.prediction import predict

    preds = {key(as_dict(lay)): predict(model, cluster, lay) for lay in candidate_layouts(model, cluster, gpus, batch,
                                                                                           **space)}
    table = [{"layout": as_dict(p.layout), "prediction": {f: getattr(p, f) for f in PREDICTED}} for p in preds.values()]
    out = ranked.search(model=as_dict(model), cluster=as_dict(cluster), gpus=gpus, global_batch=batch, table=table,
                        space=dict(space, top=top))
    call = f"search(gpus={gpus}, global_batch={batch}, top={top}, {space})"
    assert isinstance(out, dict) and not out["unknown"], (
        f"{call} asked for predictions of layouts that are not candidates: {out.get('unknown')}")
    got = [preds.get(key(f)) for f in out["ranked"]]
    assert None not in got, f"{call} returned a layout that is not a candidate"
    if check == C_SEARCH_FITS:
        too_big = [p.layout.describe() for p in got if not p.fits]
        assert not too_big, f"{call} returned {len(too_big)} layouts that do not fit in memory, e.g. {too_big[0]}"
        return
    want = search(model, cluster, gpus, batch, predict_fn=lambda _m, _c, lay: preds[key(as_dict(lay))], top=top,
                  **space)
    order = [(p.iteration_s, p.memory_per_gpu_bytes) for p in got]
    assert order == [(p.iteration_s, p.memory_per_gpu_bytes) for p in want], (
        f"{call}: got {len(got)} layouts starting {[p.layout.describe() for p in got[:3]]}, expected {len(want)} "
        f"starting {[p.layout.describe() for p in want[:3]]} (fastest first, then less memory)")


def _cp_table(model, cluster, gpus, tokens, seqs, cps, space, *, tie: bool) -> list:
    """Every candidate's prediction at every length; with `tie`, no layout with c > 1 beats the
    best without it (its time raised to that), so context parallelism never strictly pays."""
    from scaletrain.plan.layouts import candidate_layouts
    from scaletrain.plan.prediction import predict

    table = []
    for s in seqs:
        shaped = dataclasses.replace(model, seq=s)
        try:
            layouts = candidate_layouts(shaped, cluster, gpus, tokens // s, cps=(1, *cps), **space)
        except ValueError:
            continue
        preds = [predict(shaped, cluster, lay) for lay in layouts]
        flat = min((p.iteration_s for p in preds if p.fits and p.layout.cp == 1), default=None)
        for p in preds:
            row = {f: getattr(p, f) for f in PREDICTED}
            if tie and flat is not None and p.layout.cp > 1:
                row["iteration_s"] = max(row["iteration_s"], flat)
            table.append({"seq": s, "layout": as_dict(p.layout), "prediction": row})
    return table


def group_context(ctx):
    from scaletrain.plan.layouts import context_parallel_break_even

    probe = ctx.remote("plan_search", probe=PROBE + "cp_with_table")
    cases = [(cp_case(s), i % 3 == 2) for i, s in enumerate(checks.trial_seeds(9, salt=9))]
    judged = {C_CP_PAYS: [], C_CP_NEVER: []}
    for (model, cluster, gpus, tokens, seqs, cps, space), tie in cases:
        table = _cp_table(model, cluster, gpus, tokens, seqs, cps, space, tie=tie)
        lookup = {(e["seq"], key(e["layout"])): e for e in table}

        def predict_fn(m, _c, lay, lookup=lookup):
            from scaletrain.plan.prediction import Prediction
            return Prediction(layout=lay, memory=None, time=None, **lookup[(m.seq, key(as_dict(lay)))]["prediction"])

        want = context_parallel_break_even(model, cluster, gpus, tokens, seqs, cps=cps, predict_fn=predict_fn, **space)
        judged[C_CP_NEVER if want is None or tie else C_CP_PAYS].append((model, cluster, gpus, tokens, seqs, cps,
                                                                         space, table, want))
    for check, items in judged.items():
        with ctx.check(check):
            assert items, f"{check}: no hidden case of this kind was drawn (a grader bug: report it)"
            for model, cluster, gpus, tokens, seqs, cps, space, table, want in items:
                out = probe.context_parallel_break_even(model=as_dict(model), cluster=as_dict(cluster), gpus=gpus,
                                                        tokens=tokens, seqs=seqs, cps=cps, space=space, table=table)
                call = (f"context_parallel_break_even(model(l={model.layers}, h={model.hidden}, a={model.heads}), "
                        f"gpus={gpus}, tokens={tokens}, seqs={seqs}, cps={cps}, {space})")
                assert isinstance(out, dict) and not out["unknown"], (
                    f"{call} asked for predictions of layouts that are not candidates: {out.get('unknown')}")
                assert out["answer"] == want, (f"{call} = {out['answer']!r}; context parallelism first pays at "
                                               f"{want!r} on the grader's predictions"
                                               + (" (every c > 1 layout at best ties: a tie is no gain)"
                                                  if check == C_CP_NEVER else ""))
