"""a3's probes: the student's `assign_buckets` on parameter shapes it is given, and the student's
`DataParallel` on P ranks, one scenario after another, with everything it did recorded.

What comes back is raw (autograder/worker.py): index lists; per rank and per scenario the final
`.grad`s, every allreduce launched through the `allreduce=` callable the probe hands to
DataParallel (the time, and a copy of the tensor at launch), the times at which the probe's own
gradient hooks ran (registered before the student's), the collectives run *outside* that callable
and any use of the c10d store, the DataParallel's own `Trace`, or the exception a scenario raised.
The grader (autograder/suites/a3_data_parallel/) computes the single-process reference itself
and decides from these outputs whether the gradients travelled through the launched allreduces,
whether the buckets went out during backward, and whether the numbers are right.

Guards, best effort in the student's own process: torch's DistributedDataParallel raises
`Flagged`; so does the c10d store (every `Store` method and `_get_default_store`) inside the
student's calls, and each use is also counted, so catching the exception does not hide it.
Collectives of `ProcessGroup` / `Backend` that do not come from the given allreduce are counted.
The bucket assignment is the grader's (the reference's answer, sent as data), so tasks 3.2 and 3.3
are graded whatever the state of task 3.1.
"""

from __future__ import annotations

import contextlib
import operator
import re
import tempfile
import threading
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from autograder import wire
from autograder.checks import Flagged, forbid_calls, student_module, submission_dir

_C = torch._C._distributed_c10d
# the library's functions and methods as they are before any student code is imported here
_ALL_REDUCE = dist.all_reduce
_STORE_METHODS = tuple(n for n in ("set", "get", "add", "compare_set", "wait", "check", "delete_key", "num_keys",
                                   "append", "multi_get", "multi_set", "queue_push", "queue_pop", "queue_len",
                                   "list_keys", "barrier", "clone") if n in _C.Store.__dict__)
_COLLECTIVES = ("broadcast", "allreduce", "allreduce_coalesced", "reduce", "allgather", "all_gather_single",
                "_allgather_base", "allgather_coalesced", "allgather_into_tensor_coalesced", "gather", "scatter",
                "reduce_scatter", "reduce_scatter_single", "_reduce_scatter_base",
                "reduce_scatter_tensor_coalesced", "all_to_all_single", "alltoall_base", "alltoall", "send",
                "recv", "recv_anysource", "barrier", "monitored_barrier")
_ORIGINAL = {(cls, name): cls.__dict__[name]
             for cls in (_C.Store, _C.ProcessGroup, _C.Backend)
             for name in (_STORE_METHODS if cls is _C.Store else _COLLECTIVES) if name in cls.__dict__}
_DEFAULT_STORE = c10d._get_default_store
_local = threading.local()   # .inside: the probe's own allreduce is running on this thread


# ---------------------------------------------------------------- task 3.1

def _plain(value):
    """Lists stay lists and integers integers; anything else becomes its repr (so the grader
    says what came back instead of failing on the wire)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value] if isinstance(value, list) else repr(value)[:80]
    if not isinstance(value, bool) and hasattr(value, "__index__"):
        return operator.index(value)
    return repr(value)[:80]


def with_params(stem: str, function: str, specs, cap_bytes: int):
    """`function(params, cap_bytes)` of the student's module, params = zero tensors of the given
    (shape, dtype) specs."""
    params = [torch.zeros(tuple(shape), dtype=dtype) for shape, dtype in specs]
    return _plain(getattr(student_module(stem), function)(params, cap_bytes))


# ---------------------------------------------------------------- tasks 3.2 and 3.3

def branchy_model():
    """Frozen, used-on-one-rank and never-used parameters in one small model (also the grader's
    reference model: it imports this function)."""
    import torch.nn as nn

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            gen = torch.Generator().manual_seed(3)
            self.frozen, self.trunk = nn.Linear(5, 7), nn.Linear(7, 7)
            self.head_a, self.head_b, self.never = nn.Linear(7, 3), nn.Linear(7, 3), nn.Linear(3, 3)
            with torch.no_grad():
                for p in self.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen))
            self.frozen.requires_grad_(False)

        def forward(self, x, use_b):
            h = torch.tanh(self.trunk(self.frozen(x)))
            return (self.head_a(h) + (self.head_b(h) if use_b else 0.0)).pow(2).mean()
    return Branchy()


class _Handle:
    """What the probe's allreduce returns: gloo's Work, with the time `wait()` returned."""

    def __init__(self, work, entry: dict):
        self._work, self._entry = work, entry

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        self._entry["waited"] = time.perf_counter()
        return result

    def get_future(self):
        return self._work.get_future()

    def is_completed(self):
        return self._work.is_completed()


class _Recorder:
    """The `allreduce=` callable given to DataParallel: gloo's async allreduce (sum), recording the
    time of each launch and a copy of what it carried; plus the probe's own gradient hooks."""

    def __init__(self):
        self.launches: list[dict] = []
        self.grads: list[float] = []

    def __call__(self, tensor):
        entry = {"t": time.perf_counter(), "data": tensor.detach().as_subclass(torch.Tensor).clone(),
                 "waited": None}
        self.launches.append(entry)
        _local.inside = True
        try:
            work = _ALL_REDUCE(tensor, async_op=True)
        finally:
            _local.inside = False
        return _Handle(work, entry)

    def watch(self, module):
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda _: self.grads.append(time.perf_counter()))
        return module


class _Guard:
    """The c10d store trapped, and collectives outside the probe's allreduce counted, while the
    student's code runs."""

    def __init__(self):
        self.store: list[str] = []
        self.outside: dict[str, int] = {}

    def _store_trap(self, name):
        def trap(*args, **kwargs):
            self.store.append(name)
            raise Flagged(f"used the c10d store (`{name}`) inside DataParallel: the gradients must travel "
                          "through the allreduce DataParallel is given")
        return trap

    def _counter(self, name, original):
        def count(pg, *args, **kwargs):
            if not getattr(_local, "inside", False):
                self.outside[name] = self.outside.get(name, 0) + 1
            return original(pg, *args, **kwargs)
        return count

    @contextlib.contextmanager
    def watching(self, *, collectives: bool):
        patched = []
        try:
            for (cls, name), original in _ORIGINAL.items():
                if cls is _C.Store:
                    patched.append((cls, name, original))
                    setattr(cls, name, self._store_trap(name))
                elif collectives:
                    patched.append((cls, name, original))
                    setattr(cls, name, self._counter(name, original))
            c10d._get_default_store = self._store_trap("_get_default_store")
            yield
        finally:
            c10d._get_default_store = _DEFAULT_STORE
            for cls, name, original in patched:
                setattr(cls, name, original)


def _given(buckets):
    """The grader's bucket assignment (the reference's, sent as data) in place of `assign_buckets`."""
    def assign_buckets(params, cap_bytes):
        return [list(b) for b in buckets]
    return assign_buckets


def _tensor(t):
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        return repr(t)[:80]
    return t.detach().as_subclass(torch.Tensor).to("cpu").clone()


def _key(k):
    return k if k is None or (isinstance(k, int) and not isinstance(k, bool)) else repr(k)[:40]


def _model(sc: dict, rank: int):
    if sc["model"] == "gpt":
        from scaletrain.models import GPT, GPTConfig
        return GPT(GPTConfig(**sc["cfg"]), seed=sc["init_seed"] + rank)
    return branchy_model()


def _scenario(dpm, rank: int, sc: dict, wait_s: float) -> dict:
    """One step of the student's DataParallel on this rank's micro-batches, everything recorded."""
    from scaletrain.dp.trace import Trace

    model, rec, guard = _model(sc, rank), _Recorder(), _Guard()
    if sc.get("watch"):
        rec.watch(model)
    trace = Trace() if sc.get("trace") else None
    dpm.assign_buckets = _given(sc["buckets"])
    kw = dict(bucket_cap_mb=sc["cap_mb"], allreduce=rec, overlap=sc["overlap"], timeout_s=wait_s)
    if trace is not None:
        kw["trace"] = trace
    with guard.watching(collectives=False):
        dp = dpm.DataParallel(model, **kw)
    micro = sc["batches"][rank]
    launched, outside, backward_end = [], [], None
    with guard.watching(collectives=True):
        for j, batch in enumerate(micro):
            with dp.no_sync() if j < len(micro) - 1 else contextlib.nullcontext():
                out = dp(*batch["args"], **batch["kwargs"])
                loss = out[1] if sc["model"] == "gpt" else out
                (loss / len(micro)).backward()
            launched.append(len(rec.launches))
            outside.append(sum(guard.outside.values()))
        backward_end = time.perf_counter()
        dp.finish_gradient_synchronization()
    launched.append(len(rec.launches))
    outside.append(sum(guard.outside.values()))
    return {
        "grads": [_tensor(p.grad) for p in model.parameters()],
        "n_buckets": len(dp.buckets),
        "launches": [{"t": e["t"], "data": e["data"], "waited": e["waited"]} for e in rec.launches],
        "launched_after": launched, "outside_after": outside, "outside": dict(guard.outside),
        "store": list(guard.store), "grad_times": list(rec.grads), "backward_end": backward_end,
        "trace": [(str(e.kind), _key(e.key), float(e.t)) for e in trace.events] if trace is not None else [],
    }


def _where_text(tb_text: str) -> str:
    """' (at dp_data_parallel.py:42)' for the deepest frame in the submission folder, else ''."""
    folder = submission_dir()
    for filename, line in reversed(re.findall(r'File "([^"]+)", line (\d+)', tb_text)):
        if Path(filename).resolve().parent == folder:
            return f" (at {Path(filename).name}:{line})"
    return ""


def _rank(rank: int, world_size: int, stem: str, plan) -> dict:
    """Every check's scenarios on this rank, in order: {check: [{"ok": outputs} | {"raised": ...}]}
    (plan and outputs wire-encoded). A check's first exception ends that check (its later
    scenarios are not run)."""
    plan = wire.decode(plan)
    dpm = student_module(stem)
    results = {}
    for name, scenarios in plan["checks"]:
        done = []
        for sc in scenarios:
            try:
                with forbid_calls("torch.nn.parallel.DistributedDataParallel", modules=(dpm,)):
                    done.append({"ok": _scenario(dpm, rank, sc, plan["wait_s"])})
            except Exception as exc:  # noqa: BLE001 - the grader decides what it means
                first = str(exc).splitlines()[0] if str(exc) else ""
                done.append({"raised": (type(exc).__name__, first[:1000],
                                        _where_text("".join(traceback.format_exception(exc))))})
                break
        results[name] = done
    # as plain data: a pickled tensor would cross to the parent through a shared-memory file
    # descriptor each, hundreds of them
    return wire.encode(results)


def _preflight(dpm, pre: dict, wait_s: float) -> None:
    """One step with overlap=False on a 1-rank group in the worker: an untouched task 3.2 (which
    every distributed check needs) raises NotImplementedError at once, without starting ranks."""
    with tempfile.TemporaryDirectory(prefix="a3-preflight-") as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            dpm.assign_buckets = _given(pre["buckets"])
            model = dpm.DataParallel(_model(pre, 0), allreduce=_Recorder(), overlap=False, timeout_s=wait_s)
            model(*pre["batch"])[1].backward()
            model.finish_gradient_synchronization()
        except NotImplementedError:
            raise
        except Exception:  # noqa: BLE001 - anything else is reported by the real checks, with ranks
            pass
        finally:
            dist.destroy_process_group()


def data_parallel(stem: str, plan: dict) -> list[dict]:
    """The preflight, then `_rank` on plan["world_size"] ranks: one dict per rank."""
    from scaletrain.launch import RankError, spawn

    dpm = student_module(stem)
    _preflight(dpm, plan["preflight"], plan["wait_s"])
    try:
        return [wire.decode(r) for r in spawn(_rank, plan["world_size"], stem, wire.encode(plan),
                                              timeout_s=plan["spawn_timeout_s"])]
    except RankError as exc:  # a rank died outside the scenarios: keep what kind of failure it was
        kind = {"NotImplementedError": NotImplementedError, "AssertionError": AssertionError,
                "Flagged": Flagged}.get(exc.exc_type)
        first = exc.message.splitlines()[0] if exc.message else ""
        if kind is None:
            raise
        raise kind(f"rank {exc.rank}: {first}{_where_text(exc.remote_traceback)}") from None
