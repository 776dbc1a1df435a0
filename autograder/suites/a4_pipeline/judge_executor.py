"""a4 task 4.4's verdicts: the executor (the student's, in the sandboxed worker, on 3 ranks and
then the public test's 2) against one process computing the whole model. Per case and rank: the
gradients and the order of the actions run count for the schedule's check; the losses (forward
only) for their own; the stage outputs alive during and after the step for the memory check."""

from __future__ import annotations

from autograder import checks

from .inputs_executor import _Case, _executor_cases, _public_executor_cases
from .judge_trace import _order_problem
from .names import (C4_LOSSES, C4_MEMORY, EXECUTOR_CHECKS, EXECUTOR_GROUP_S, LOAD_LIMIT_S, PREPARE_LIMIT_S,
                    PROBE, SPAWN_LIMIT_S)


def _grad_problems(case: _Case, rank: int, out: dict) -> list[str]:
    """Stage by stage on this rank: every parameter's .grad against the single process's."""
    problems = []
    for s in [s for s in range(len(case.specs)) if s % len(case.schedule) == rank]:
        got = out["grads"].get(str(s))
        if not isinstance(got, list) or [n for n, _ in got] != [n for n, _ in case.grads[s]]:
            problems.append(f"{case.label}, rank {rank}: stage {s}'s parameters came back as "
                            f"{[n for n, _ in got] if isinstance(got, list) else got!r:.200}")
            continue
        for (name, grad), (_, ref) in zip(got, case.grads[s], strict=True):
            if grad is None:
                problems.append(f"{case.label}, rank {rank}, stage {s}: {name}.grad is None after step()")
                continue
            try:
                checks.assert_close(grad, ref, rtol=1e-5, atol=4e-5, what=f"stage {s} {name}.grad")
            except AssertionError as exc:
                problems.append(f"{case.label}, rank {rank}: {exc}")
    return problems


def _loss_problems(case: _Case, rank: int, out: dict) -> list[str]:
    """On the last stage's rank: the m microbatch losses step() returned (forward only)."""
    if (len(case.specs) - 1) % len(case.schedule) != rank:
        return []
    losses, m = out["losses"], len(case.losses)
    values = [float(v) if hasattr(v, "item") or type(v) in (int, float) else None
              for v in losses] if isinstance(losses, list) else None
    if values is None or len(values) != m or any(a is None or not abs(a - b) <= 1e-5 * max(1.0, abs(b))
                                                 for a, b in zip(values, case.losses, strict=True)):
        return [f"{case.label}, rank {rank}: step() returned {losses!r:.200}, expected the {m} "
                f"microbatch losses {[round(v, 6) for v in case.losses]} (the unscaled loss of each microbatch)"]
    return []


def _memory_problems(case: _Case, rank: int, out: dict) -> list[str]:
    """Stage outputs alive at once within the schedule's peak; nothing held after the step."""
    from scaletrain.pipeline import peak_in_flight
    problems = []
    alive, allowed = [e[3] for e in out["events"] if e[0] == "F"], peak_in_flight(case.schedule[rank])
    if alive and max(alive) > allowed:
        problems.append(f"{case.label}, rank {rank}: {max(alive)} stage outputs (activations) were alive at once; "
                        f"its schedule holds at most {allowed}: free a stage's stash at its last backward")
    if out["in_flight_after"] != 0:
        problems.append(f"{case.label}, rank {rank}: {out['in_flight_after']} (stage, microbatch) pairs still "
                        "held (stashed activations or pending W) after the step")
    if out["alive_after"] != 0:
        problems.append(f"{case.label}, rank {rank}: {out['alive_after']} stage outputs (activations) still "
                        "alive after step() returned")
    return problems


def _judge(case: _Case, rank: int, out: dict) -> dict[str, list[str]]:
    """Problems on one rank, by check: the case's own (gradients, order), the losses, memory."""
    order = _order_problem(case, rank, out["events"])
    return {case.check: _grad_problems(case, rank, out) + ([order] if order else []),
            C4_LOSSES: _loss_problems(case, rank, out), C4_MEMORY: _memory_problems(case, rank, out)}


def _judged(case: _Case, rank: int, out) -> dict[str, list[str]]:
    try:
        return _judge(case, rank, out)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:  # not what the probe sends
        problem = f"{case.label}, rank {rank}: the executor's outputs are malformed ({type(exc).__name__}: {exc})"
        return {case.check: [problem], C4_LOSSES: [problem], C4_MEMORY: [problem]}


def _failure_of(call, *args, **kwargs) -> Exception | None:
    try:
        call(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the caller decides what the failure costs
        return exc
    return None


def _run_batches(worker, batches: list[list[_Case]], start: float) -> tuple[list, Exception | None]:
    """Each batch (cases of one world size) in one spawn of its ranks: ([(cases, per_rank)], the
    failure that stopped them or None)."""
    import time

    done = []
    for cases in batches:
        limit = max(30.0, EXECUTOR_GROUP_S - (time.monotonic() - start) - 10.0)
        try:
            done.append((cases, worker.call(PROBE + "run_executor", "pp_executor", [c.wire() for c in cases],
                                            SPAWN_LIMIT_S, timeout_s=limit)))
        except Exception as exc:  # noqa: BLE001 - reported inside every check
            return done, exc
    return done, None


def _problems(done: list) -> dict[str, list[str]]:
    problems: dict[str, list[str]] = {name: [] for name in EXECUTOR_CHECKS}
    for cases, per_rank in done:
        for k, case in enumerate(cases):
            for rank in range(len(case.schedule)):
                try:
                    out = per_rank[rank][k]
                except (TypeError, IndexError, KeyError):
                    out = None
                for name, found in _judged(case, rank, out).items():
                    problems[name] += found
    return problems


def group_executor(ctx):
    import threading
    import time

    start = time.monotonic()
    worker = ctx.untrusted()
    # the worker is started from this thread (forking while another thread imports is unsafe), then
    # loads torch and the student's executor and starts its fork server while the reference is
    # computed here
    failure = _failure_of(worker.call, PROBE + "load", timeout_s=LOAD_LIMIT_S)
    prepared: list = []
    thread = threading.Thread(daemon=True, target=lambda: prepared.append(_failure_of(
        worker.call, PROBE + "prepare_executor", "pp_executor", timeout_s=PREPARE_LIMIT_S)))
    if failure is None:
        thread.start()
    seed = checks.trial_seeds(1, salt=44)[0]
    batches = [_executor_cases(seed), _public_executor_cases(seed)]  # 3 ranks, then the public test's 2
    if failure is None:
        thread.join()
        failure = prepared[0]
    done = []
    if not isinstance(failure, TimeoutError):  # any other failure, the run meets again and reports
        done, failure = _run_batches(worker, batches, start)
    problems = _problems(done) if failure is None else {}
    for name in EXECUTOR_CHECKS:
        with ctx.check(name):
            if failure is not None:
                raise failure
            found = problems[name]
            more = f" (+{len(found) - 3} more)" if len(found) > 3 else ""
            assert not found, "; ".join(found[:3]) + more
