"""a3 under the trusted split: the probe's guards in the student's process, and the grader's
judgement of raw outputs (its selftest, with the planted cheats: tests/test_assignments.py).

The judges are fed outputs made here: an honest rank's (the references themselves), and the ones
issue 13's cheats produce (dummy allreduces, the store, launches after backward, a sum)."""

import torch
import torch.distributed as dist

from autograder.checks import Flagged
from autograder.manifest import get_manifest
from autograder.probes import a3_data_parallel as probe
from autograder.suites.a3_data_parallel import inputs, judge_ddp, names

A3 = get_manifest("a3")


def test_every_group_is_trusted():
    assert all(g.trusted for g in A3.groups)


def test_the_guard_traps_the_store_and_counts_collectives_outside_the_given_allreduce(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        guard, rec = probe._Guard(), probe._Recorder()
        store = dist.distributed_c10d._world.pg_map[dist.group.WORLD][1]
        with guard.watching(collectives=True):
            t = torch.ones(5)
            rec(t).wait()                 # the given allreduce: recorded, not counted
            dist.all_reduce(t)            # anything else: counted
            dist.distributed_c10d._get_default_group().broadcast([t]).wait()
            for reach in (dist.distributed_c10d._get_default_store, lambda: store.set("k", "v")):
                try:
                    reach()
                except Flagged:           # caught by the student: still counted
                    pass
        assert guard.outside == {"allreduce": 1, "broadcast": 1}
        assert guard.store == ["_get_default_store", "set"]
        assert len(rec.launches) == 1 and torch.equal(rec.launches[0]["data"], torch.ones(5))
        store.set("k", "v")               # the window is over: everything is back
        assert dist.distributed_c10d._get_default_store() is not None
    finally:
        dist.destroy_process_group()


def _honest(sc, rank):
    """The outputs of a correct DataParallel on `rank`: the references, each bucket launched with
    its local gradients during backward."""
    launches = [{"t": float(b), "data": torch.cat([sc.local[rank][i].reshape(-1) for i in members]), "waited": 9.0}
                for b, members in enumerate(sc.buckets)]
    n, micro = len(sc.buckets), len(sc.send["batches"][rank])
    return {"grads": [None if r is None else r.clone() for r in sc.ref], "n_buckets": n, "launches": launches,
            "launched_after": [0] * (micro - 1) + [n - 1, n], "outside_after": [0] * (micro + 1), "outside": {},
            "store": [], "grad_times": [0.5 + b for b in range(n)], "backward_end": n + 1.0, "trace": []}


def _verdicts(plan, rank, edit=lambda name, sc, out: None):
    verdicts = {}
    for name, scenarios in plan.items():
        results = []
        for sc in scenarios:
            out = _honest(sc, rank)
            edit(name, sc, out)
            results.append({"ok": out})
        verdicts[name] = judge_ddp._verdict(name, scenarios, results, rank)
    return verdicts


def test_judges_pass_honest_outputs_and_fail_each_cheat():
    plan = inputs._plan(20261122)
    for rank in range(names.P):
        assert set(_verdicts(plan, rank).values()) == {None}

    def dummies(name, sc, out):
        for launch in out["launches"]:
            launch["data"] = torch.zeros_like(launch["data"])
    v = _verdicts(plan, 0, dummies)
    assert all(kind == "AssertionError" and "never went out through the allreduce" in msg for kind, msg in v.values())

    def store(name, sc, out):
        out["store"] = ["set"]
    assert {kind for kind, _ in _verdicts(plan, 1, store).values()} == {"Flagged"}

    def after_backward(name, sc, out):
        for launch in out["launches"]:
            launch["t"] += 100.0
    v = _verdicts(plan, 0, after_backward)
    assert v[names.C_OVERLAP][0] == "AssertionError" and "0 of 3 buckets" in v[names.C_OVERLAP][1]
    assert v[names.C_HOOKED] is None and v[names.C_SYNC] is None

    def summed(name, sc, out):
        out["grads"] = [None if g is None else names.P * g for g in out["grads"]]
    v = _verdicts(plan, 0, summed)
    assert "2x the mean gradient" in v[names.C_SYNC][1] and v[names.C_OVERLAP] is None and v[names.C_ONCE] is None

    def extra(name, sc, out):
        out["outside"] = {"allreduce": 3}
    v = _verdicts(plan, 0, extra)
    assert "allreduce ×3" in v[names.C_ONCE][1] and v[names.C_SYNC] is None

    def garbage(name, sc, out):
        out["launches"] = "nothing"
    v = _verdicts(plan, 0, garbage)
    assert all(kind == "AssertionError" for kind, _ in v.values())
