"""a10's verdicts on gloo ranks: the student's all-to-all (equal and variable, p = 2, 3, 4) and the
course's expert-parallel layer running on it, against the transposes and the one-process layer
computed here; bytes against the closed forms (scaletrain.moe.all_to_all's, restated below).

One spawn of 4 ranks in the worker (autograder/probes/a10_moe.py:run_ranks); a job of size p runs
on the first p ranks. A deadlock ends after PG_TIMEOUT_S as `timeout`; the jobs after it are not run.
"""

from __future__ import annotations

from autograder import checks
from autograder.suites import sized

from . import inputs, reference
from .judge import close
from .names import C_A2A, C_A2A_BYTES, C_A2AV, C_EP, CHECKS_RANKS, PROBE

PG_TIMEOUT_S = 10.0   # a message that waits longer is a deadlock
SPAWN_TIMEOUT_S = 120
SPLIT_BYTES = 8       # one int64 split size per peer


def _transpose(job: dict) -> dict:
    """What each rank must receive, and the gradient of its input, for the all-to-all of `job`."""
    import torch
    p, xs, ws = job["p"], job["x"], job["w"]
    splits = job["splits"] or [[xs[0].shape[0] // p] * p for _ in range(p)]
    cut = [list(x.split(row)) for x, row in zip(xs, splits)]                    # cut[i][j]: i -> j
    cut_w = [list(w.split([splits[i][r] for i in range(p)])) for r, w in enumerate(ws)]  # cut_w[r][i]: from i
    return {"splits": splits,
            "y": [torch.cat([cut[i][r] for i in range(p)]) for r in range(p)],
            "x_grad": [torch.cat([cut_w[j][r] for j in range(p)]) for r in range(p)]}


def _expert_parallel(job: dict) -> dict:
    """Per rank, the whole layer on its own tokens in one process (reference.layer)."""
    return {"ranks": [reference.layer(job, x, w) for x, w in zip(job["x"], job["w"])]}


def _bytes(job: dict, ref: dict, r: int) -> tuple[int, int]:
    """(forward, backward) bytes rank r hands to isend: its rows for the other ranks (and, when the
    receive sizes were not given, one int64 to each peer first); backward sends what it received."""
    p, splits = job["p"], ref["splits"]
    row = job["x"][r].shape[1] * job["x"][r].element_size()
    exchanged = job["splits"] is not None and not job["recv_given"]
    forward = sum(splits[r][j] for j in range(p) if j != r) * row + (SPLIT_BYTES * (p - 1) if exchanged else 0)
    return forward, sum(splits[i][r] for i in range(p) if i != r) * row


def _judge_a2a(job, got, ref, r, check) -> None:
    where = f"{job['name']}, rank {r}"
    if check == C_A2A_BYTES:
        fwd, bwd = _bytes(job, ref, r)
        for phase, want in (("forward", fwd), ("backward", bwd)):
            for how in ("sent", "counted"):
                if got[f"{how}_{phase}"] != want:
                    by = "handed to isend" if how == "sent" else "recorded by record_send (comm_counter)"
                    raise AssertionError(f"{where}, {phase}: {got[f'{how}_{phase}']} B {by}, expected {want} B "
                                         "(rows for the other ranks only, nothing to itself or for an empty chunk"
                                         f"{', plus 8 B of split size per peer' if phase == 'forward' else ''})")
        return
    close(got["y"], ref["y"][r], f"{where}: rows received (rank i's chunk for this rank, in rank order)")
    if job["splits"] is not None and got["recv_splits"] != [row[r] for row in ref["splits"]]:
        raise AssertionError(f"{where}: recv_splits {got['recv_splits']}, expected {[row[r] for row in ref['splits']]}")
    if got.get("skipped"):
        raise AssertionError(f"{where}: {got['skipped']}")
    close(got["x_grad"], ref["x_grad"][r], f"{where}: input gradient (the backward's all-to-all)")


def _judge_ep(job, got, ref, r, check) -> None:
    where, mine = f"{job['name']}, rank {r}", ref["ranks"][r]
    close(got["out"], mine["out"], f"{where}: output on this rank's tokens")
    close(got["aux"], mine["aux"].reshape(1), f"{where}: aux_loss")
    if got.get("skipped"):
        raise AssertionError(f"{where}: {got['skipped']}")
    close(got["grads"]["x"], mine["grads"]["x"], f"{where}: input gradient")
    close(got["grads"]["router"], mine["grads"]["router"], f"{where}: router gradient")
    per_rank = job["cfg"]["num_experts"] // job["p"]
    first = r * per_rank
    for name in ("w1", "b1", "w2", "b2"):
        want = sum(ref["ranks"][i]["grads"][name] for i in range(job["p"]))[first:first + per_rank]
        close(got["grads"][name], want, f"{where}: gradient of the local experts' {name} (summed over every "
                                        "rank's tokens they served)")


def group_ranks(ctx):
    import torch
    torch.set_num_threads(1)  # the ranks have the cores
    jobs = inputs.rank_jobs(checks.trial_seeds(1, salt=1011)[0])
    refs = {j["name"]: (_transpose(j) if j["kind"] == "a2a" else _expert_parallel(j)) for j in jobs}
    need = {C_A2A: [j for j in jobs if j["kind"] == "a2a" and j["splits"] is None],
            C_A2AV: [j for j in jobs if j["kind"] == "a2a" and j["splits"] is not None],
            C_A2A_BYTES: [j for j in jobs if j["kind"] == "a2a"], C_EP: [j for j in jobs if j["kind"] == "ep"]}
    worker, failure, per_rank = ctx.untrusted(), None, []
    try:
        worker.call(PROBE + "load", True, timeout_s=90)
        per_rank = sized(worker.call(PROBE + "run_ranks", jobs, inputs.RANK_WORLD, PG_TIMEOUT_S,
                                     SPAWN_TIMEOUT_S, timeout_s=SPAWN_TIMEOUT_S + 30), inputs.RANK_WORLD, "ranks")
        if not all(isinstance(o, dict) for o in per_rank):
            raise AssertionError(f"the ranks' outputs are malformed: {str(per_rank)[:80]}")
    except Exception as exc:  # noqa: BLE001 - reported inside every check below
        failure = exc
    for name in CHECKS_RANKS:
        with ctx.check(name):
            if failure is not None:
                raise failure
            for job in need[name]:
                problem = checks.rank_failure([job], per_rank, size_key="p")
                if problem is not None:
                    raise problem
                for r in range(job["p"]):
                    entry = per_rank[r].get(job["name"], {})
                    if "ok" not in entry:
                        raise AssertionError(f"{job['name']}: rank {r} sent no outputs")
                    try:
                        judge = _judge_a2a if job["kind"] == "a2a" else _judge_ep
                        judge(job, entry["ok"], refs[job["name"]], r, name)
                    except (KeyError, TypeError, IndexError, AttributeError) as exc:
                        raise AssertionError(f"{job['name']}, rank {r}: the outputs that came back are malformed "
                                             f"({type(exc).__name__}: {exc})") from None
