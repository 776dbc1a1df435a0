"""a5's trusted split: the probe's measurements (storages counted once, bytes handed to isend) and
the trusted side's verdicts on them. The whole group (sandboxed worker, 2 ranks, planted cheats)
runs in the selftest (tests/test_assignments.py); this covers the pieces fast, and the probe with
the trusted verdicts end to end on one rank."""

from __future__ import annotations

import pytest
import torch

from autograder import checks
from autograder.manifest import REPO
from autograder.probes import a5_zero as probe
from autograder.suites import a5_zero as suite
from autograder.suites.a5_zero import inputs, judge_stages, reference


def test_every_group_is_trusted():
    assert all(group.trusted for group in suite.MANIFEST.groups)


def test_storages_count_a_buffer_once_however_many_views():
    full = torch.zeros(12)
    walk = probe._Storages()
    for t in (full, full[:6], full[6:].view(2, 3), torch.empty(0)):
        walk.tensor(t, "params")
    walk.walk({"again": [full[3:9]], "state": torch.zeros(5)}, "engine")
    assert walk.summary() == {"total": 12 * 4 + 5 * 4, "params": 48, "engine": 20}


def test_freed_storage_holds_nothing_and_snapshots_as_none():
    t = torch.ones(8)
    t.untyped_storage().resize_(0)
    walk = probe._Storages()
    walk.tensor(t, "params")
    assert walk.summary()["total"] == 0 and probe._snapshot(t) is None


def test_send_counter_counts_the_tensors_handed_to_isend(monkeypatch):
    """The counter a5's and a6's ranks install below the student's code (probes/common.py)."""
    import torch.distributed as dist

    from autograder.probes.common import install_send_counter

    handed = []
    monkeypatch.setattr(dist, "isend", lambda tensor, *a, **k: handed.append(tensor.numel()))
    monkeypatch.setattr(dist, "send", lambda tensor, *a, **k: handed.append(tensor.numel()))
    sent = install_send_counter()
    with sent.phase() as box:
        dist.isend(torch.zeros(10, dtype=torch.float64), dst=1)
        dist.send(torch.zeros(3), 1)
    assert box.bytes == 10 * 8 + 3 * 4 and handed == [10, 3]


def _early_samples(job, late: bool):
    """A stage-2 backward of the layout's buckets, in reverse order, sampled as the probe does:
    on time (each bucket sent and dropped when complete) or late (everything at the last one)."""
    layout = reference._layout(job)
    units, item = layout["units"], layout["itemsize"]
    numel = {n: reference._numel(s) for u in units for n, s in zip(u["names"], u["shapes"])}
    base = sum(u["padded"] for u in units) * item + layout["frozen"]
    samples, sent, shards, held = [], 0, 0, 0
    order = [(u, n) for u in reversed(units) for n in reversed(u["names"])]
    for i, (unit, name) in enumerate(order):
        held += numel[name] * item
        complete = name == unit["names"][0]
        if complete and (not late or i == len(order) - 1):
            done = units if late else [unit]
            for u in done:
                sent += u["m"] * item
                shards += u["m"] * item
            held = 0
        samples.append({"phase": "backward", "at": name, "gathered": 0, "grads": held,
                        "total": base + shards + held, "sent": sent})
    samples.append({"phase": "end", "at": "after backward", "gathered": 0, "grads": 0, "total": base + shards,
                    "sent": sent})
    return samples


@pytest.mark.parametrize("late", [False, True])
def test_stage2_backward_must_reduce_scatter_each_bucket_when_complete(late):
    job = inputs._job("h_gpt", "sgd_momentum", 2, 2, seed=3)
    out = {"steps": [{"samples": _early_samples(job, late)}]}
    if late:
        with pytest.raises(AssertionError, match="reduce-scatter each bucket"):
            judge_stages._verify_early(job, [out], reference._Reference())
    else:
        judge_stages._verify_early(job, [out], reference._Reference())


def test_probe_and_verdicts_end_to_end_on_one_rank(monkeypatch):
    """The reference engine through the probe on N = 1 (stages 1-3, traced), judged here."""
    monkeypatch.setenv("AUTOGRADER_SUBMISSION", str(REPO / "solutions" / "a5_zero"))
    jobs = [dict(inputs._job(model, optimizer, stage, 1, seed=5), trace=True)
            for stage, model, optimizer in ((1, "h_groups", "sgd_momentum"), (2, "h_gpt", "adamw"),
                                            (3, "h_gpt", "adamw"), (3, "h_groups", "sgd_momentum"))]
    per_rank = probe.run_ranks("zero_engine", jobs, 1, 10.0, 120)
    assert checks.rank_failure(jobs, per_rank) is None
    ref = reference._Reference()
    for job in jobs:
        outs = reference._outputs(job, per_rank)
        judge_stages._verify_equal(job, outs, ref)
        judge_stages._verify_held(job, outs, ref)
        judge_stages._verify_sent(job, outs, ref)  # N = 1: nothing goes over the wire
        if job["stage"] == 3 and job["key"] == "h_gpt":
            judge_stages._verify_stage3(job, outs, ref)
