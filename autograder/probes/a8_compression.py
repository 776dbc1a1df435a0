"""a8's probes: the student's PowerSGD and 1-bit compressors on p gloo ranks, and the student's LAMB,
on inputs the trusted side sends; outputs come back as data.

- `compressor_run`: one spawn of p ranks; on each, for every case, the student's hook
  (`PowerSGD` with the initial Q's given, or `OneBitEF`) reduces the given per-rank gradients step
  after step. Per step: the output, the error memory `errors[index]` afterwards, the sizes of the
  messages handed to `self.allreduce` (PowerSGD: the probe's own summing ring), the bytes this rank
  sent through `torch.distributed.isend`/`send` (counted below the student's code), and whether
  the input was modified. A case's first exception ends that case only.
- `onebit_codec`: `OneBitEF(chunk_numel=c).compress(x)` and `decompress` of its result, in the worker.
- `lamb_run`: the student's `LAMB` for a few steps on given parameters and gradients: the
  parameters and the recorded trust ratios after every step.

Nothing here knows an expected value: the references (a single-process simulation of all ranks,
closed-form byte counts, Algorithm 2 of LAMB written out) are computed on the trusted side
(autograder/suites/a8_compression/). torch's DDP communication hooks and torch's collectives
(`checks.forbid_collectives`, as in a6: they move data the counter at `isend` does not see) are traps
while the student's code runs.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

from autograder import wire
from autograder.checks import Flagged, forbid_calls, forbid_collectives, student_module, submission_dir
from autograder.probes.common import install_send_counter

TORCH_HOOKS = ("torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook",
               "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.batched_powerSGD_hook")


def _where(exc: BaseException) -> str:
    """' (at powersgd.py:42)' for the deepest frame in the submission folder, else ''."""
    folder = submission_dir()
    tb_text = "".join(traceback.format_exception(exc))
    for filename, line in reversed(re.findall(r'File "([^"]+)", line (\d+)', tb_text)):
        if Path(filename).resolve().parent == folder:
            return f" (at {Path(filename).name}:{line})"
    return ""


def _raised(exc: BaseException) -> dict:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return {"raised": [type(exc).__name__, first[:1000] + _where(exc)]}


# ---------------------------------------------------------------- tasks 8.1 and 8.2 on p ranks

def _hook(module, case: dict, recorded: list):
    if case["kind"] == "powersgd":
        from scaletrain.comm import ring_allreduce

        def allreduce(t):  # the probe's own sum: what went through it is recorded
            recorded.append(t.numel())
            ring_allreduce(t, op="sum")

        hook = module.PowerSGD(rank=case["rank"], error_feedback=case["error_feedback"], allreduce=allreduce)
        for index, qs in case["q0"].items():
            hook.q_memory[int(index)] = [q.clone() for q in qs]
        return hook
    return module.OneBitEF(chunk_numel=case["chunk_numel"], error_feedback=case["error_feedback"])


def _run_case(module, case: dict, rank: int, sent) -> dict:
    import torch

    recorded: list[int] = []
    hook = _hook(module, case, recorded)
    steps = []
    for step in case["steps"]:
        index, shapes = step["index"], [torch.Size(s) for s in step["shapes"]]
        flat = step["grads"][rank].clone()
        before = flat.clone()
        recorded.clear()
        with sent.phase() as box:
            out = hook.reduce(index, flat, shapes)
        error = hook.errors.get(index)
        steps.append({"out": out.detach().clone() if isinstance(out, torch.Tensor) else repr(out)[:80],
                      "error": error.detach().clone() if isinstance(error, torch.Tensor) else None,
                      "messages": list(recorded), "bytes": box.bytes, "modified": not torch.equal(flat, before)})
    return {"steps": steps}


def _rank(rank: int, world_size: int, stem: str, plan):
    sent = install_send_counter()  # before the student's file binds any name of torch.distributed
    module = student_module(stem)
    results = []
    for case in wire.decode(plan)["cases"]:
        try:
            with forbid_calls(*TORCH_HOOKS, modules=(module,)), forbid_collectives(module):
                results.append({"ok": _run_case(module, case, rank, sent)})
        except Exception as exc:  # noqa: BLE001 - the grader decides what it means
            results.append(_raised(exc))
    # as plain data: a pickled tensor would cross to the parent through a shared-memory descriptor
    return wire.encode(results)


def compressor_run(stem: str, plan: dict) -> list:
    """Per rank, per case: {"ok": {"steps": [...]}} or {"raised": [type, message]}."""
    from scaletrain.launch import RankError, spawn

    student_module(stem)  # import errors surface here, before ranks start
    try:
        return [wire.decode(r) for r in spawn(_rank, plan["world_size"], stem, wire.encode(plan),
                                              timeout_s=plan["timeout_s"])]
    except RankError as exc:  # a rank died outside the cases (the student's import, os._exit)
        kind = {"NotImplementedError": NotImplementedError, "AssertionError": AssertionError,
                "Flagged": Flagged}.get(exc.exc_type, RuntimeError)
        first = exc.message.splitlines()[0] if exc.message else ""
        raise kind(f"rank {exc.rank}: {exc.exc_type}: {first}") from None


# ---------------------------------------------------------------- task 8.2 in one process

def onebit_codec(stem: str, cases: list) -> list:
    """Per (x, chunk_numel): {"words", "scales", "decoded"} or {"raised": ...}."""
    module = student_module(stem)
    out = []
    for x, chunk in cases:
        try:
            codec = module.OneBitEF(chunk_numel=chunk)
            words, scales = codec.compress(x.clone())
            out.append({"words": words, "scales": scales, "decoded": codec.decompress(words, scales, x.numel())})
        except Exception as exc:  # noqa: BLE001
            out.append(_raised(exc))
    return out


# ---------------------------------------------------------------- task 8.3

def lamb_run(stem: str, params: list, grads: list, settings: dict) -> dict:
    """LAMB(settings) on the given parameters; grads[t][i] is parameter i's gradient at step t."""
    module = student_module(stem)
    import torch

    xs = [torch.nn.Parameter(p.clone()) for p in params]
    opt = module.LAMB(xs, **settings)
    trajectory, trust = [], []
    for step_grads in grads:
        for x, g in zip(xs, step_grads):
            x.grad = g.clone()
        opt.step()
        trajectory.append([x.detach().clone() for x in xs])
        trust.append([opt.state[x].get("trust_ratio") if x in opt.state else None for x in xs])
    return {"params": trajectory, "trust": trust}
