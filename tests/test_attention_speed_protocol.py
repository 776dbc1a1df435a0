"""a1b's speed checks and `bench attention` time one thing one way (issue 29), held together on CPU.

On an H200 the forward check raised "No available kernel" (SDPA's flash path handed 3-D
tensors) and the forward + backward check measured 0.97x the math path where `bench attention`
measured 8.7x: the check sent 32 MB tensors over the worker's JSON wire in every timed call.  Now
both call attention_benchmark.graded_speed on speed_inputs (4-D, made from a seed on each side),
and the worker keeps its inputs.  Here, on CPU, where timings are not graded: the same function,
shapes and dtypes on both paths, SDPA's refusals as notes, the worker's timed outputs checked.
"""

import importlib
import types

import pytest
import torch

from autograder import wire
from scaletrain.ops import attention_benchmark as ab
from scaletrain.ops import attention_naive

SMALL = {"batch": 1, "heads": 2, "n": 64, "dtype": "fp32"}


@pytest.fixture
def small(monkeypatch):
    """GRADED shrunk in place (every reader sees it) and every graded_speed / speed_inputs call recorded."""
    for key, value in SMALL.items():
        monkeypatch.setitem(ab.GRADED, key, value)
    calls = {"graded_speed": [], "speed_inputs": []}
    for name in calls:
        real = getattr(ab, name)
        monkeypatch.setattr(ab, name, _spy(real, calls[name]))
    return calls


def _spy(fn, log):
    def call(*args, **kwargs):
        log.append((args, kwargs))
        return fn(*args, **kwargs)
    return call


class _Worker:
    """The suite's worker, in this process: the real probe, its arguments and answers through the wire."""

    def start(self):
        pass

    def call(self, target, *args, **kwargs):
        module, name = target.split(":")
        out = getattr(importlib.import_module(module), name)(*wire.decode(wire.encode(args)),
                                                             **wire.decode(wire.encode(kwargs)))
        return wire.decode(wire.encode(out))


class _Ctx:
    device = "cpu"

    def untrusted(self):
        return _Worker()


def test_graded_inputs_are_4d_and_sdpa_flash_refuses_3d_with_the_reason():
    """The H200's "No available kernel" on CPU: 3-D inputs; the graded ones are 4-D and both paths run them."""
    q, k, v, do = ab.speed_inputs(SMALL, device="cpu", seed=3)
    assert q.shape == (1, 2, 64, ab.HEAD_DIM) and q.is_contiguous() and q.dtype == torch.float32
    assert torch.equal(q, ab.speed_inputs(SMALL, device="cpu", seed=3)[0])  # grader and worker make the same
    paths = ab.sdpa_paths(q, k, v, causal=False, backward=True)
    assert all(fn is not None and note == "" for fn, note in paths.values())
    flat = [t.flatten(0, 1) for t in (q, k, v)]
    fn, note = ab.sdpa_paths(*flat, causal=False)["flash"]
    assert fn is None and "4 dimensional" in note


def test_the_check_and_the_bench_call_one_protocol_on_the_same_inputs(small, monkeypatch):
    """The suite's speed checks (worker: the real probe, torch's composed attention standing in for
    the student's kernels) and bench attention's graded rows: graded_speed with the same spec, the
    worker's inputs equal to the grader's (its timed outputs pass the sample check)."""
    from autograder.probes import a1b_attention as probe
    from autograder.suites.a1b_attention import judge_speed as suite

    naive = types.SimpleNamespace(attention_fwd=attention_naive.attention_fwd, attention_bwd=attention_naive.attention_bwd)
    monkeypatch.setattr(probe, "graft", lambda *a, **k: naive)
    monkeypatch.setattr(suite, "SPEED_PAIRS", 2)
    monkeypatch.setattr(suite, "SPEED_REPS", 2)
    checked = [suite._speed(_Ctx(), direction)[0] for direction in ("fwd", "fwd+bwd")]
    graded = ab.graded_rows(backend="torch", device="cpu", pairs=2, reps=2)
    suite_calls, bench_calls = small["graded_speed"][:2], small["graded_speed"][2:]
    assert [c[0][1] for c in suite_calls] == [c[0][1] for c in bench_calls] == ["fwd", "fwd+bwd"]
    specs = {repr({**ab.GRADED, **(kw.get("spec") or {})}) for _, kw in small["graded_speed"]}
    assert specs == {repr(ab.GRADED)}
    made = {repr(args[0]) for args, _ in small["speed_inputs"]}
    assert made == {repr(ab.GRADED)}, "the worker, the grader and the bench make their inputs from one spec"
    for row in checked + graded:
        assert row["x math"] > 0 and row["x flash"] > 0


def test_a_path_that_cannot_run_is_a_note_not_an_error(small, monkeypatch):
    """No flash-like path at all (forced): graded_speed reports x flash None and says why."""
    from torch.nn.attention import SDPBackend

    def refused(*args):
        raise RuntimeError("No available kernel. Aborting execution.")
    real = ab._sdpa
    monkeypatch.setattr(ab, "_sdpa", lambda backend, causal: real(backend, causal) if backend == SDPBackend.MATH
                        else refused)
    row = ab.graded_speed(ab.local_student("fwd", seed=0, backend="torch", device="cpu"), "fwd", seed=0,
                          pairs=1, reps=1, device="cpu")
    assert row["x flash"] is None and row["x math"] > 0
    assert row["notes"] == ["no flash path for these inputs (FLASH_ATTENTION: No available kernel. Aborting "
                            "execution.; EFFICIENT_ATTENTION: No available kernel. Aborting execution.; "
                            "CUDNN_ATTENTION: No available kernel. Aborting execution.)"]
