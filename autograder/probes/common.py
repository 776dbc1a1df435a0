"""What several probes share: `call(stem, function, *args, **kwargs)` (the probe of every suite that
only calls functions), `as_data`, the byte counter of the ranks (`install_send_counter`), and jobs
run on spawned ranks (`run_jobs` inside each rank, `spawn_ranks` around the spawn), whose answers
`autograder.checks.rank_failure` reads on the trusted side."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import types
from pathlib import Path
from typing import Callable

from autograder.checks import Flagged, student_module, submission_dir
from autograder.wire import short


def as_data(value):
    """A dataclass becomes {"__dataclass__": name, "fields": {...}}: the trusted side rebuilds the
    *reference* class from the fields, so no student property ever runs there."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__dataclass__": type(value).__name__,
                "fields": {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}}
    return value


def call(stem: str, function: str, *args, **kwargs):
    return as_data(getattr(student_module(stem), function)(*args, **kwargs))


class SentBytes:
    """Bytes of the tensors this rank hands to torch.distributed.isend / send."""

    def __init__(self):
        self.total = 0

    def since(self, mark: int) -> int:
        return self.total - mark

    @contextlib.contextmanager
    def phase(self):
        """`with sent.phase() as box:` ... `box.bytes` is what the block sent."""
        box = types.SimpleNamespace(start=self.total, bytes=0)
        try:
            yield box
        finally:
            box.bytes = self.total - box.start


def install_send_counter() -> SentBytes:
    """Count below the student's code: install before the student's files bind any name of
    torch.distributed (a name bound earlier would skip the wrapper)."""
    import torch.distributed as dist

    sent = SentBytes()
    for name in ("isend", "send"):
        original = getattr(dist, name)

        def wrapper(tensor, *args, __original=original, **kwargs):
            sent.total += tensor.numel() * tensor.element_size()
            return __original(tensor, *args, **kwargs)

        wrapper.__name__ = wrapper.__qualname__ = name
        wrapper.__doc__ = original.__doc__
        setattr(dist, name, wrapper)
    return sent


# ---------------------------------------------------------------- jobs on ranks

def where(exc: BaseException) -> str:
    """" (at file.py:line)" of the deepest frame in the student's folder, or ""."""
    import traceback

    folder = submission_dir()
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve().parent == folder]
    return f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


def job_error(exc: BaseException, rank: int) -> dict:
    """{"error": [type name, message]} for a job that raised; a rank that waited past the process
    group's timeout reports "TimeoutError" (a deadlock), whatever torch called it."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    kind = "TimeoutError" if "timed out" in first.lower() or "timeout" in first.lower() else type(exc).__name__
    out = {"error": [kind if re.fullmatch(r"\w+", kind) else "Exception", f"rank {rank}: {short(first, 600)}{where(exc)}"]}
    if isinstance(getattr(exc, "partial", None), dict):  # what a job measured before it failed
        out["partial"] = exc.partial
    return out


def run_jobs(rank: int, jobs: list[dict], run: Callable[[dict], object], *, size_key: str) -> dict:
    """Every job on this rank, in order: {job name: {"ok": run(job)} | {"error": [type, message]} |
    {"idle": True}} (ranks >= job[size_key] idle). After a deadlock the later jobs are not run (the
    peers are gone); the ranks start each job together while they can."""
    import torch.distributed as dist

    out, hung, together = {}, None, True
    for job in jobs:
        name = job["name"]
        if hung:
            out[name] = {"error": ["TimeoutError", f"rank {rank}: not run, an earlier job deadlocked ({hung})"]}
        elif rank >= job[size_key]:
            out[name] = {"idle": True}
        else:
            try:
                out[name] = {"ok": run(job)}
            except Exception as exc:  # noqa: BLE001 - each job's failure is data for the trusted side
                out[name] = job_error(exc, rank)
                hung = name if out[name]["error"][0] == "TimeoutError" else None
        if together:
            try:
                dist.barrier()
            except Exception:  # noqa: BLE001 - a peer gone: each rank finishes on its own
                together = False
    return out


def spawn_ranks(fn, world_size: int, *args, timeout_s: float, stems: tuple[str, ...] = ()) -> list:
    """`scaletrain.launch.spawn(fn, world_size, *args)`: one answer per rank. A rank that died
    outside a job becomes an exception the harness classifies by its type name, with the line of
    the student's file (`stems`) it died at."""
    from scaletrain.launch import RankError, spawn

    try:
        return spawn(fn, world_size, *args, timeout_s=timeout_s)
    except RankError as exc:
        first = (exc.message or "").splitlines()[0] if exc.message else ""
        kind = exc.exc_type if re.fullmatch(r"\w+", str(exc.exc_type)) else "RankFailure"
        at = ""
        for filename, line in reversed(re.findall(r'File "([^"]+)", line (\d+)', exc.remote_traceback or "")):
            if any(filename.endswith(f"{stem}.py") for stem in stems):
                at = f" (at {Path(filename).name}:{line})"
                break
        known = {"NotImplementedError": NotImplementedError, "AssertionError": AssertionError, "Flagged": Flagged}
        raise known.get(kind, type(kind, (Exception,), {}))(f"rank {exc.rank}: {first}{at}") from None
