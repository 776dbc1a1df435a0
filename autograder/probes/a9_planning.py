"""a9's probes: the student's planner functions on the configurations the trusted side sends.

Specs cross as dicts (their dataclass fields; a cluster's links and efficiency as nested dicts)
and are rebuilt here with the library's given classes (`scaletrain.plan.specs`), which the
student's files import too. Outputs go back as data. Nothing here knows an expected value:

Each is reached as `ctx.remote(stem, probe=...).<function>(...)`, so it receives the stem and the
function's name first:

- `call`: one function of a student file on (model, cluster, layout) and keyword arguments;
- `time_with_stage_times`: `time_breakdown` with the module's `stage_times` replaced by the
  numbers sent (so task 9.3 is graded on the grader's stage times, not the student's 9.2);
- `candidates`: `candidate_layouts`, each layout as its fields;
- `search_with_table`: `search` whose predictions come from a table the trusted side computed;
  returns the layouts it ranked, in order, and any layout it asked about that the table lacks;
- `cp_with_table`: `context_parallel_break_even` on such a table, with the reference's search.
"""

from __future__ import annotations

import dataclasses

from autograder.checks import student_module
from autograder.probes.common import as_data


def _model(d):
    from scaletrain.plan.specs import ModelSpec
    return ModelSpec(**d)


def _cluster(d):
    from scaletrain.comm.cost_model import AlphaBeta
    from scaletrain.plan.efficiency import GemmEfficiency
    from scaletrain.plan.specs import ClusterSpec
    return ClusterSpec(**{**d, "intra": AlphaBeta(**d["intra"]), "inter": AlphaBeta(**d["inter"]),
                          "efficiency": GemmEfficiency(**d["efficiency"])})


def _layout(d):
    from scaletrain.plan.specs import Layout
    return Layout(**d)


def _fields(layout) -> dict:
    return {f.name: getattr(layout, f.name) for f in dataclasses.fields(layout)}


def call(stem: str, function: str, *, model=None, cluster=None, layout=None, **kwargs):
    args = [build(d) for build, d in ((_model, model), (_cluster, cluster), (_layout, layout)) if d is not None]
    return as_data(getattr(student_module(stem), function)(*args, **kwargs))


def time_with_stage_times(stem: str, function: str, *, model, cluster, layout, stage_times: dict):
    from scaletrain.plan.time_model import StageTimes

    module = student_module(stem)
    own = module.stage_times
    module.stage_times = lambda *_args, **_kw: StageTimes(**stage_times)
    try:
        return as_data(getattr(module, function)(_model(model), _cluster(cluster), _layout(layout)))
    finally:
        module.stage_times = own


def candidates(stem: str, function: str, *, model, cluster, gpus, global_batch, space: dict):
    """{"layouts": [fields, ...]}, or {"raised": "ValueError: ..."} when the function raised one
    (a request no layout can serve must be refused with a ValueError; the trusted side judges)."""
    try:
        found = getattr(student_module(stem), function)(_model(model), _cluster(cluster), gpus, global_batch, **space)
    except ValueError as exc:
        return {"raised": f"ValueError: {exc}"[:300]}
    return {"layouts": [_fields(layout) for layout in found]}


def search_with_table(stem: str, function: str, *, model, cluster, gpus, global_batch, table: list, space: dict):
    from scaletrain.plan.prediction import Prediction

    known = {tuple(sorted(entry["layout"].items())): entry for entry in table}
    unknown = []

    def lookup(_model_spec, _cluster_spec, layout):
        entry = known.get(tuple(sorted(_fields(layout).items())))
        if entry is None:
            unknown.append(_fields(layout))
            return Prediction(layout=layout, iteration_s=float("inf"), tflops_per_gpu=0.0, mfu=0.0, tokens_per_s=0.0,
                              memory_per_gpu_bytes=0, fits=False, memory=None, time=None)
        return Prediction(layout=layout, memory=None, time=None, **entry["prediction"])

    ranked = getattr(student_module(stem), function)(_model(model), _cluster(cluster), gpus, global_batch,
                                                     predict_fn=lookup, **space)
    return {"ranked": [_fields(p.layout) for p in ranked], "unknown": unknown[:5]}


def cp_with_table(stem: str, function: str, *, model, cluster, gpus, tokens, seqs, cps, space: dict, table: list):
    """`context_parallel_break_even` on a table of predictions the trusted side computed for every
    candidate (keyed by sequence length and layout), with the module's `candidate_layouts` and
    `search` replaced by the table's (its candidates; those that fit, fastest first, then less
    memory), so task 9.5 is graded on its own, whatever the student's 9.4 does. Returns the answer
    and any layout it asked about that the table lacks."""
    from scaletrain.plan.prediction import Prediction
    from scaletrain.plan.specs import Layout

    known = {(entry["seq"], tuple(sorted(entry["layout"].items()))): entry for entry in table}
    unknown = []

    def lookup(model_spec, _cluster_spec, layout):
        entry = known.get((model_spec.seq, tuple(sorted(_fields(layout).items()))))
        if entry is None:
            unknown.append(_fields(layout))
            return Prediction(layout=layout, iteration_s=float("inf"), tflops_per_gpu=0.0, mfu=0.0, tokens_per_s=0.0,
                              memory_per_gpu_bytes=0, fits=False, memory=None, time=None)
        return Prediction(layout=layout, memory=None, time=None, **entry["prediction"])

    def candidates(model_spec, _cluster_spec, _gpus, _batch, *, cps=(1,), **_space):
        found = [Layout(**e["layout"]) for e in table if e["seq"] == model_spec.seq and e["layout"]["cp"] in cps]
        if not found:
            raise ValueError(f"no layout at seq={model_spec.seq} with cp in {tuple(cps)}")
        return found

    def search(model_spec, cluster_spec, gpus_, batch, *, predict_fn=lookup, top=None, **space_):
        preds = [predict_fn(model_spec, cluster_spec, lay) for lay in candidates(model_spec, cluster_spec, gpus_,
                                                                                 batch, **space_)]
        ranked = sorted((p for p in preds if p.fits), key=lambda p: (p.iteration_s, p.memory_per_gpu_bytes))
        return ranked if top is None else ranked[:top]

    module = student_module(stem)
    own = module.search, module.candidate_layouts
    module.search, module.candidate_layouts = search, candidates
    try:
        answer = getattr(module, function)(_model(model), _cluster(cluster), gpus, tokens, seqs, cps=tuple(cps),
                                           predict_fn=lookup, **space)
    finally:
        module.search, module.candidate_layouts = own
    return {"answer": answer, "unknown": unknown[:5]}
