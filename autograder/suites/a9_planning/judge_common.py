"""a9's shared verdict helpers: specs sent as data, a configuration shown in a message, and a
student's dataclass compared field by field with the reference's."""

from __future__ import annotations

import dataclasses

from scaletrain.testing import assert_close

RTOL = 1e-6  # the answers are arithmetic; floats differ by the order of operations only


def as_dict(spec) -> dict:
    return dataclasses.asdict(spec)


def args(model, cluster, layout) -> dict:
    return dict(model=as_dict(model), cluster=as_dict(cluster), layout=as_dict(layout))


def shown(model, layout) -> str:
    family = "" if model.kv == model.heads and not model.gated_ffn else f", kv={model.kv}, f={model.ffn}"
    return (f"model(l={model.layers}, h={model.hidden}, a={model.heads}, s={model.seq}, V={model.vocab}{family}), "
            f"layout({layout.describe()}, B={layout.global_batch}, overlap_dp={layout.overlap_dp}"
            f"{f', stages={layout.stages}' if layout.stages else ''})")


def fields_of(got, want_type: str, call: str) -> dict:
    if not (isinstance(got, dict) and got.get("__dataclass__") == want_type):
        raise AssertionError(f"{call} must return a {want_type}, got {got!r:.100}")
    return got["fields"]


def same_fields(got, want, call: str, names: tuple[str, ...] | None = None, rtol: float = RTOL) -> None:
    """The student's dataclass (sent as its fields) against the reference's, on `names` (all by
    default): a check graded on some fields is not failed by another's."""
    fields = fields_of(got, type(want).__name__, call)
    for name in names or tuple(f.name for f in dataclasses.fields(want)):
        if name not in fields:
            raise AssertionError(f"{call}: the {type(want).__name__} has no field {name!r}")
        assert_close(fields[name], getattr(want, name), rtol=rtol, what=f"{call}.{name}")
