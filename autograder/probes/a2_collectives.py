"""a2's probes: the student's ring collectives run in gloo (or NCCL) ranks that the worker starts.

Everything here runs in the untrusted worker and its ranks. It computes no expected value and
decides nothing: the ranks run the calls they are given on the inputs they are given and hand back
what they saw, and `autograder/suites/a2_collectives/` (the trusted side) judges it.

A *pool* is a set of rank processes started once and kept between calls, each with a command
queue of its own, so that

- each rank receives only its own inputs (no rank of the student's holds another rank's data, so
  a result cannot be computed without moving it);
- the trusted side can time a batch of calls from outside, around one worker call, while the
  ranks are already up: `speed_*` below.

Two kinds of pool: "student" ranks import the submission's `ring.py`; "gloo" ranks never do (the
baseline: gloo's own collectives, which no student code can wrap or slow down).

In a student rank, before the submission is imported and for the rank's whole life:

- every collective is a trap that raises `Flagged` and notes its name (in `torch.distributed`,
  `distributed_c10d`, `_functional_collectives`, `torch.ops.c10d` / `_c10d_functional`, and the
  collective methods of `ProcessGroup` / `Backend`), so a collective saved at import, reached
  through `getattr` or called as a process-group method is the trap too, and a trap whose
  exception the student's code swallowed is still reported;
- `isend` / `irecv` / `send` / `recv` are wrapped to note each message's peer (global rank) and
  byte count, next to what the student's `record_send` counted.
Best effort, in the student's own process: the trusted side checks the results and the volume of
the traffic besides.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
import sys
import re
import shutil
import signal
import tempfile
import time
import traceback
import warnings
from pathlib import Path

STEM = "ring"
GROUP_TIMEOUT_S = 5     # a p2p wait longer than this in a correctness call is a deadlock
WORLD_TIMEOUT_S = 30    # the world group (speed runs on it)
ANSWER_S = 60.0         # how long a pool command may take once the ranks are up
STARTUP_S = 180.0       # importing torch in p processes on a loaded 2-core machine can take a minute
TRACEBACK_CHARS = 20_000
MAX_ANSWER = 256 << 20  # bytes of one rank's answer

_COLLECTIVE = re.compile(r"all_?reduce|all_?gather|reduce_scatter|reducescatter|all_?to_?all|broadcast|^_?reduce"
                         r"|scatter|^_?gather|batch_isend")
PG_METHODS = ("allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_coalesced",
              "allgather_into_tensor_coalesced", "all_gather_single", "all_gather_single_coalesced",
              "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single", "reduce_scatter_single_coalesced",
              "reduce_scatter_tensor_coalesced", "reduce", "broadcast", "alltoall", "alltoall_base",
              "all_to_all_single", "scatter", "gather")
OPS = {"c10d": ("allreduce_", "allreduce_coalesced_", "allgather_", "_allgather_base_", "allgather_coalesced_",
                "allgather_into_tensor_coalesced_", "reduce_scatter_", "_reduce_scatter_base_",
                "reduce_scatter_tensor_coalesced_", "reduce_", "broadcast_", "alltoall_", "alltoall_base_",
                "gather_", "scatter_"),
       "_c10d_functional": ("all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_",
                            "all_gather_into_tensor", "all_gather_into_tensor_out",
                            "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
                            "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast", "broadcast_")}
P2P = ("isend", "irecv", "send", "recv")


# ---------------------------------------------------------------- inside a student rank

class _Watch:
    """The traps and the message log of one student rank."""

    def __init__(self):
        self.trapped: list[str] = []     # names of forbidden collectives reached, in order
        self.log: list | None = None     # [kind, peer, nbytes] per message while a call runs

    def install(self) -> None:
        import torch
        import torch.distributed as dist
        import torch.distributed._functional_collectives as functional
        import torch.distributed.distributed_c10d as c10d
        from torch._C import _distributed_c10d as cpp

        for module in (dist, c10d, functional):
            for name in dir(module):
                with warnings.catch_warnings():  # `reduce_op` is deprecated: touching it warns
                    warnings.simplefilter("ignore")
                    function = inspect.isfunction(getattr(module, name, None))
                public = module is not functional or not name.startswith("_")
                if public and _COLLECTIVE.search(name) and function:
                    setattr(module, name, self._trap(f"{module.__name__}.{name}"))
        for cls in vars(cpp).values():
            if isinstance(cls, type) and issubclass(cls, (cpp.ProcessGroup, cpp.Backend)):
                for name in PG_METHODS:
                    if name in cls.__dict__:
                        setattr(cls, name, self._trap(f"{cls.__name__}.{name}"))
        for space, names in OPS.items():
            namespace = getattr(torch.ops, space)
            for name in names:
                try:
                    getattr(namespace, name)
                except (AttributeError, RuntimeError):
                    continue
                setattr(namespace, name, self._trap(f"torch.ops.{space}.{name}"))
        for name in P2P:
            original = getattr(c10d, name)
            wrapped = self._counting(name, original)
            setattr(dist, name, wrapped)
            setattr(c10d, name, wrapped)

    def _trap(self, name: str):
        from autograder.checks import Flagged

        def trap(*args, **kwargs):
            self.trapped.append(name)
            raise Flagged(f"called forbidden `{name}`")
        return trap

    def _counting(self, kind: str, original):
        signature = inspect.signature(original)
        peer_key, group_key = ("dst", "group_dst") if kind in ("isend", "send") else ("src", "group_src")

        def call(*args, **kwargs):
            if self.log is not None:
                try:
                    bound = signature.bind(*args, **kwargs).arguments
                    tensor, peer = bound["tensor"], bound.get(peer_key)
                    if peer is None and bound.get(group_key) is not None:
                        import torch.distributed as dist
                        peer = dist.get_global_rank(bound.get("group") or dist.group.WORLD, bound[group_key])
                    self.log.append([kind, peer if isinstance(peer, int) else -1,
                                     int(tensor.numel() * tensor.element_size())])
                except Exception:  # noqa: BLE001 - a malformed call: the original says why
                    self.log.append([kind, -1, -1])
            return original(*args, **kwargs)
        call.__name__ = kind
        return call


def _where(exc: BaseException) -> str:
    """' (at ring.py:42)' for the deepest frame in the submission folder, else ''."""
    folder = Path(os.environ.get("AUTOGRADER_SUBMISSION", "/nonexistent")).resolve()
    hits = re.findall(r'File "([^"]+)", line (\d+)', "".join(traceback.format_exception(exc)))
    for filename, line in reversed(hits):
        if Path(filename).resolve().parent == folder:
            return f" (at {Path(filename).name}:{line})"
    return ""


class _StudentRank:
    """Runs the calls it is given on the student's module and reports, per call, what came out."""

    def __init__(self, rank: int, world_size: int, groups: list[list[int]]):
        import torch.distributed as dist

        from autograder.checks import student_module

        self.rank = rank
        self.groups = [dist.new_group(ranks=ranks, timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
                       for ranks in groups]  # every rank creates every group, before the traps
        self.barrier = dist.barrier
        self.watch = _Watch()
        self.watch.install()
        self.ring = student_module(STEM)
        self.bufs: list = []

    # ---- correctness: a plan of blocks, each a list of calls

    def plan(self, blocks: list) -> dict:
        """blocks: [[label, group index or None, [call, ...]], ...]. A call: {"fn": "rs" | "ag" | "ar",
        "x": tensor, "n": int (ag), "op": str (ar), "view": None | "strided" | "transposed"}.
        A NotImplementedError, AssertionError or Flagged ends the block (the next one still runs);
        anything else ends the rank."""
        from autograder.checks import Flagged

        out = {}
        for label, group_index, calls in blocks:
            group = None if group_index is None else self.groups[group_index]
            records = []
            for call in calls:
                record = self._call(call, group)
                records.append(record)
                if isinstance(record.get("error"), BaseException):
                    exc = record.pop("error")
                    if not isinstance(exc, (NotImplementedError, AssertionError, Flagged)):
                        raise exc
                    record["raised"] = [type(exc).__name__, str(exc).split("\n")[0][:2000], _where(exc)]
                    break
            out[label] = records
        return out

    def _call(self, call: dict, group) -> dict:
        from scaletrain.comm.counter import comm_counter

        fn, x = call["fn"], call["x"]
        arg = x[::2] if call.get("view") == "strided" else x.t() if call.get("view") == "transposed" else x
        trapped_before, self.watch.log = len(self.watch.trapped), []
        record: dict = {"raised": None, "out": None, "same": False}
        try:
            with comm_counter() as stats:
                if fn == "rs":
                    got = self.ring.ring_reduce_scatter(arg, op=call.get("op", "sum"), group=group)
                elif fn == "ag":
                    got = self.ring.ring_all_gather(arg, call["n"], group=group)
                else:
                    got = self.ring.ring_allreduce(arg, op=call.get("op", "sum"), group=group)
            record["same"] = got is arg
            record["out"] = got if _is_tensor(got) else None
            record["out_type"] = type(got).__name__
        except BaseException as exc:  # noqa: BLE001 - sorted by plan()
            record["error"] = exc
            stats = None
        record["after"] = x
        record["messages"] = self.watch.log
        record["recorded"] = [stats.bytes_sent, stats.messages] if stats is not None else None
        record["trapped"] = self.watch.trapped[trapped_before:]
        self.watch.log = None
        return record

    # ---- speed

    def speed_check(self, seed: int, n: int, device: str, samples: dict) -> dict:
        """The timing input (this rank's own data, from its own seed): reduce-scatter, then allreduce;
        their results at the positions `samples` ({"rs": [...], "ar": [...]}) and their shapes."""
        import torch

        self.src = _speed_input(seed, n).to(device)
        x = self.src.clone()
        self.watch.log, trapped_before = [], len(self.watch.trapped)
        result: dict = {"rs_raised": None, "ar_raised": None, "ar_same": False}
        for key, fn in (("rs", lambda: self.ring.ring_reduce_scatter(x)), ("ar", lambda: self.ring.ring_allreduce(x))):
            try:
                got = fn()
                result[f"{key}_same"] = got is x
                if key == "ar":
                    got = x  # in place: what the caller's tensor holds
                result[f"{key}_shape"] = list(got.shape) if _is_tensor(got) else None
                result[key] = _sample(got, samples[key])
            except (NotImplementedError, AssertionError) as exc:
                result[f"{key}_raised"] = [type(exc).__name__, str(exc).split("\n")[0][:2000], _where(exc)]
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        result["trapped"] = self.watch.trapped[trapped_before:]
        self.watch.log = None
        return result

    def speed_run(self, op: str, scales: list[list[int]], sample: list[int]) -> dict:
        return _timed_batch(self, op, scales, sample, student=True)


class _GlooRank:
    """A baseline rank: gloo's (or NCCL's) own collectives; no student code is ever imported here."""

    def __init__(self, rank: int, world_size: int, groups: list[list[int]]):
        import torch.distributed as dist

        self.rank, self.world_size = rank, world_size
        self.barrier = dist.barrier
        self.bufs: list = []

    def speed_check(self, seed: int, n: int, device: str, samples: dict) -> dict:
        import sys

        self.src = _speed_input(seed, n).to(device)
        student = [name for name in (STEM, "scaletrain.comm.ring") if name in sys.modules]
        if student:  # a bug of this module's, never the student's: the baseline must stay clean
            raise RuntimeError(f"the baseline's rank imported {student}")
        return {}

    def speed_run(self, op: str, scales: list[list[int]], sample: list[int]) -> dict:
        return _timed_batch(self, op, scales, sample, student=False)


def _timed_batch(rank_obj, op: str, scales: list[list[int]], sample: list[int], *, student: bool) -> dict:
    """What the trusted side times from outside: a fresh input per call, a·x + b from this rank's
    timing input x and each call's (a, b) in `scales` (new data every call: no result can be
    remembered), a barrier, the calls of the op (none for op "none": the overhead of this machinery
    alone), and the values at `sample` of each result."""
    import torch
    import torch.distributed as dist

    from scaletrain.comm.tensor_collectives import reduce_scatter_single

    src, reps = rank_obj.src, len(scales)
    if len(rank_obj.bufs) < reps:
        rank_obj.bufs = [torch.empty_like(src) for _ in range(reps)]
    inputs = rank_obj.bufs[:reps]
    for buf, (a, b) in zip(inputs, scales):
        torch.mul(src, a, out=buf).add_(b)
    m = -(-src.numel() // dist.get_world_size())
    shard = torch.empty(m, dtype=src.dtype, device=src.device)
    index = torch.tensor(sample, dtype=torch.long, device=src.device)
    rank_obj.barrier()
    picked = []
    for x in inputs:
        if op == "ar":
            got = rank_obj.ring.ring_allreduce(x) if student else (dist.all_reduce(x), x)[1]
        elif op == "rs":
            got = rank_obj.ring.ring_reduce_scatter(x) if student else (reduce_scatter_single(shard, x), shard)[1]
        else:
            got = x
        ok = _is_tensor(got) and got.dim() == 1 and got.device == src.device and got.numel() > max(sample, default=-1)
        picked.append(got[index] if ok else None)  # on the device: no synchronization per call
    if src.is_cuda:
        torch.cuda.synchronize()
    return {"samples": [None if values is None else values.to("cpu") for values in picked]}


def _sample(got, positions: list[int]):
    """The values of a 1-D result at `positions` (None when it is not such a tensor)."""
    import torch
    if not (_is_tensor(got) and got.dim() == 1 and got.numel() > max(positions, default=-1)):
        return None
    return got[torch.tensor(positions, dtype=torch.long, device=got.device)].to("cpu")


def _speed_input(seed: int, n: int):
    """The timing input of one rank, from that rank's own seed (the trusted side regenerates it)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 9, (n,), generator=g).to(torch.float32)


def _pack(value) -> bytes:
    """What crosses between the worker and its ranks: wire data (JSON, tensors as bytes), never a
    pickle (unpickling what a student's rank sent would run its code in the worker) nor torch's
    shared-memory handles (a file descriptor per tensor, and a plan holds hundreds)."""
    import json

    from autograder import wire
    return json.dumps(wire.encode(value)).encode()


def _unpack(data: bytes):
    import json

    from autograder import wire
    return wire.decode(json.loads(data))


def _not_dumpable() -> None:
    """No ptrace, /proc/<pid>/mem or fd of this process for the student's ranks (same account,
    no capabilities): the worker, and the forkserver that forks the baseline's ranks."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass


def _in_worker_or_forkserver() -> bool:
    import multiprocessing
    return bool(os.environ.get("AUTOGRADER_SUBMISSION")) and sys.flags.no_site and multiprocessing.parent_process() is None


if _in_worker_or_forkserver():  # imported there: by the worker's first probe call, by the forkserver's preload
    _not_dumpable()


def _is_tensor(value) -> bool:
    import torch
    return isinstance(value, torch.Tensor)


def _rank_main(rank, world_size, kind, device, groups, environ, store_dir, orders, answers) -> None:
    """One rank: join the group, build the rank's runner, then answer the worker's orders one by one.
    Both pipes carry bytes only (`_pack`): the worker never unpickles what a rank sends."""
    import torch
    import torch.distributed as dist

    from scaletrain import launch

    os.environ.update(environ)  # a forkserver child has the server's environment, not the worker's
    torch.set_num_threads(1)
    try:
        store = launch._file_store(f"{store_dir}/store", rank, world_size)
        backend = "nccl" if device.startswith("cuda") else "gloo"
        launch._init_group(rank, world_size, backend, store, WORLD_TIMEOUT_S)
        runner = (_StudentRank if kind == "student" else _GlooRank)(rank, world_size, groups)
        answers.send_bytes(_pack(["ok", None]))
        while True:
            command, args = _unpack(orders.recv_bytes())
            if command == "stop":
                break
            answers.send_bytes(_pack(["ok", getattr(runner, command)(*args)]))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the worker
        tb = traceback.format_exc()
        try:
            answers.send_bytes(_pack(["err", [type(exc).__name__, str(exc)[:TRACEBACK_CHARS], tb[-TRACEBACK_CHARS:]]]))
        except Exception:  # noqa: BLE001 - the worker is gone
            pass
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        answers.close()


# ---------------------------------------------------------------- in the worker

class PoolFailure(Exception):
    """A rank raised, died or stalled: `failure` says which, as data for the trusted side."""

    def __init__(self, failure: list):
        super().__init__(str(failure))
        self.failure = failure


class _Pool:
    """`world_size` ranks of one kind, each with a pipe for orders and one for answers."""

    def __init__(self, kind: str, world_size: int, device: str, groups: list[list[int]]):
        from scaletrain import launch

        _not_dumpable()
        ctx = launch._context()
        if not device.startswith("cuda"):  # NCCL's peers may need to reach each other's descriptors
            ctx.set_forkserver_preload([*launch._PRELOAD, __name__])  # the forkserver, not dumpable either
        self.store_dir = tempfile.mkdtemp(prefix=f"a2-{kind}-")
        self.orders, self.answers, ends = [], [], []
        for _ in range(world_size):
            order_r, order_w = ctx.Pipe(duplex=False)
            answer_r, answer_w = ctx.Pipe(duplex=False)
            self.orders.append(order_w)
            self.answers.append(answer_r)
            ends.append((order_r, answer_w))
        self.procs = [ctx.Process(target=_rank_main, daemon=True,
                                  args=(rank, world_size, kind, device, groups, dict(os.environ), self.store_dir,
                                        *ends[rank]))
                      for rank in range(world_size)]
        self.stopped = False
        try:
            with _reachable_cwd():
                for p in self.procs:
                    p.start()
            for order_r, answer_w in ends:  # the ranks' ends: a rank that dies closes its answers
                order_r.close()
                answer_w.close()
            self._gather(STARTUP_S)
        except BaseException:
            self.close()
            raise

    def ask(self, command: str, per_rank_args: list[tuple], timeout_s: float = ANSWER_S) -> list:
        for conn, args in zip(self.orders, per_rank_args):
            conn.send_bytes(_pack([command, list(args)]))
        return self._gather(timeout_s)

    def _read(self, rank: int):
        """(kind, payload) of rank's next answer; a malformed one is that rank's failure."""
        try:
            kind, payload = _unpack(self.answers[rank].recv_bytes(MAX_ANSWER))
        except (EOFError, OSError):
            self.procs[rank].join(timeout=1)
            raise PoolFailure(["rank", rank, "ProcessExit",
                               f"process exited with code {self.procs[rank].exitcode} before answering", ""]) from None
        except Exception as exc:  # noqa: BLE001 - not a message of _pack's
            raise PoolFailure(["rank", rank, "BadAnswer", f"rank {rank} sent a malformed answer ({exc})", ""]) from None
        if kind == "err" and not (isinstance(payload, list) and len(payload) == 3):
            raise PoolFailure(["rank", rank, "BadAnswer", f"rank {rank} sent a malformed error", ""])
        return kind, payload

    def _gather(self, timeout_s: float) -> list:
        from multiprocessing.connection import wait

        deadline = time.monotonic() + timeout_s
        outputs: dict[int, object] = {}
        while len(outputs) < len(self.procs):
            pending = {self.answers[r]: r for r in range(len(self.procs)) if r not in outputs}
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolFailure(["timeout", f"ranks {sorted(pending.values())} did not answer within "
                                              f"{timeout_s:.0f} s (a deadlock: a send or receive without its partner?)"])
            for conn in wait(list(pending), timeout=min(left, 1.0)):
                rank = pending[conn]
                kind, payload = self._read(rank)
                if kind == "err":
                    raise PoolFailure(self._primary({rank: payload}))
                outputs[rank] = payload
        return [outputs[r] for r in range(len(self.procs))]

    def _primary(self, errors: dict) -> list:
        """The failure to report: a process-group timeout on any rank (its peers only saw a broken
        ring), else the lowest rank's own error (not a transport error caused by a dead peer)."""
        from multiprocessing.connection import wait

        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pending = {self.answers[r]: r for r in range(len(self.procs)) if r not in errors}
            for conn in wait(list(pending), timeout=max(0.0, end - time.monotonic())):
                try:
                    kind, payload = self._read(pending[conn])
                except PoolFailure:
                    errors[pending[conn]] = ("ProcessExit", "gloo/transport: the rank is gone", "")
                    continue
                if kind == "err":
                    errors[pending[conn]] = payload
        for rank, (exc_type, msg, tb) in sorted(errors.items()):
            if any(key in msg for key in ("Timed out", "timed out", "Wait timeout")):
                return ["timeout", f"rank {rank} waited past the process-group timeout (a deadlock: a send or "
                                   f"receive without its partner?): {msg.splitlines()[0] if msg else ''}"]
        caused = {r: e for r, e in errors.items() if "gloo/transport" not in e[1]} or errors
        rank = min(caused)
        return ["rank", rank, *(str(x) for x in caused[rank])]

    def pids(self) -> list[int]:
        """The ranks and every process below them (best effort: a process that left the tree is not seen)."""
        roots = {p.pid for p in self.procs if p.pid is not None and p.exitcode is None}
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
        found, todo = set(), list(roots)
        while todo:
            pid = todo.pop()
            if pid not in found:
                found.add(pid)
                todo += children.get(pid, [])
        return sorted(found)

    def close(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.signal(signal.SIGCONT)
            for conn in self.orders:
                try:
                    conn.send_bytes(_pack(["stop", []]))
                except (OSError, ValueError):
                    pass
            end = time.monotonic() + 5
            for p in self.procs:
                if p.pid is not None:
                    p.join(timeout=max(0.0, end - time.monotonic()))
        for p in self.procs:
            if p.pid is not None and p.is_alive():
                p.kill()
        for p in self.procs:
            if p.pid is not None:
                p.join(timeout=5)
        for conn in self.orders + self.answers:
            conn.close()
        shutil.rmtree(self.store_dir, ignore_errors=True)

    def signal(self, sig: int) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


@contextlib.contextmanager
def _reachable_cwd():
    """multiprocessing starts a child in the parent's cwd *by path*, and the worker's work folder
    lies in a folder it may not traverse (the group's folder is vaulted, autograder/runner.py): the
    ranks start in "/" instead; the worker goes back to its own folder through a descriptor."""
    here = os.open(".", os.O_RDONLY)
    try:
        os.chdir("/")
        yield
    finally:
        os.fchdir(here)
        os.close(here)


_POOLS: dict[str, _Pool] = {}


def _failure_of(fn, *args):
    """{"ok": fn(*args)} or {"failure": [...]} when a rank raised, died or stalled."""
    try:
        return {"ok": fn(*args)}
    except PoolFailure as exc:
        return {"failure": exc.failure}


# ---------------------------------------------------------------- the probes

def run_plan(world_size: int, groups: list[list[int]], per_rank_blocks: list[list]) -> dict:
    """Start `world_size` student ranks with the process groups `groups` (each of GROUP_TIMEOUT_S),
    hand rank r its own blocks of calls, and return {"ok": [per-rank {label: [record, ...]}]} or
    {"failure": ...}. A record: the returned tensor (`out`), the input after the call (`after`),
    whether the returned object is the tensor passed (`same`), the messages this rank handed to
    isend/irecv/send/recv ([kind, peer, bytes]), what record_send counted ([bytes, messages]),
    forbidden collectives reached (`trapped`), and what the call raised (`raised`)."""
    def go():
        pool = _Pool("student", world_size, "cpu", groups)
        try:
            return pool.ask("plan", [(blocks,) for blocks in per_rank_blocks])
        finally:
            pool.close()
    return _failure_of(go)


def speed_start(kind: str, world_size: int, device: str, seeds: list[int], n: int, samples: list[dict]) -> dict:
    """Start a pool of `kind` ("student" or "gloo") and give rank r its timing input of `n` float32
    elements from seeds[r]. Student ranks run their reduce-scatter and allreduce on it once and
    return both results at the positions samples[r] ({"rs": [...], "ar": [...]})."""
    speed_stop(kind)

    def go():
        _POOLS[kind] = _Pool(kind, world_size, device, [])
        return _POOLS[kind].ask("speed_check", [(seed, n, device, sample) for seed, sample in zip(seeds, samples)])
    return _failure_of(go)


def speed_run(kind: str, op: str, scales: list[list[list[int]]], samples: list[list[int]]) -> dict:
    """One timed batch on pool `kind` (the trusted side holds the clock): rank r calls `op` ("ar",
    "rs", or "none") once per (a, b) in scales[r], on a·x + b of its timing input x; returns the
    values of each result at the positions samples[r]."""
    pool = _POOLS[kind]
    return _failure_of(pool.ask, "speed_run", [(op, scale, sample) for scale, sample in zip(scales, samples)])


def speed_pause(kind: str, paused: bool) -> int:
    """Stop (SIGSTOP) or continue the processes of pool `kind`, so that nothing of the student's
    runs while the baseline is timed. Returns how many processes were signalled."""
    pool = _POOLS.get(kind)
    if pool is None:
        return 0
    pids = pool.pids()
    pool.signal(signal.SIGSTOP if paused else signal.SIGCONT)
    return len(pids)


def speed_stop(kind: str) -> None:
    pool = _POOLS.pop(kind, None)
    if pool is not None:
        pool.close()


def shutdown() -> None:
    """Stop every pool and remove multiprocessing's temporary folder (the forkserver's socket): the
    worker is killed at the end of the group, so its exit handlers never run."""
    import multiprocessing.util

    for kind in list(_POOLS):
        speed_stop(kind)
    multiprocessing.util._run_finalizers()
