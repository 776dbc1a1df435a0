"""a2 graded from the trusted side (issue 13): the suite never imports the submission, and what it
judges from the ranks' raw outputs catches what the old in-rank checks trusted. Fast: no ranks are
started here (the selftest, tests/test_assignments.py, runs the planted attacks end to end)."""

import ast
import inspect
from pathlib import Path

import pytest
import torch

from autograder import checks
from autograder.context import classify
from autograder.manifest import get_manifest
from autograder.suites import a2_collectives as suite
from autograder.suites.a2_collectives import inputs, judge, judge_speed, names


def _call(fn="allreduce", m=4, itemsize=4, exact=False):
    return inputs.Call({}, lambda record: None, fn=fn, m=m, itemsize=itemsize, n=3 * m, dtype=torch.float32,
                       exact_bytes=exact)


def test_every_group_is_trusted_and_the_suite_never_imports_student_code():
    m = get_manifest("a2")
    assert all(g.trusted for g in m.groups)
    for module in (suite, inputs, judge, judge_speed, names):
        tree = ast.parse(Path(inspect.getsourcefile(module)).read_text())
        calls = {node.func.attr for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
        assert "student" not in calls and "student_module" not in calls, module.__name__


def test_traffic_must_follow_the_ring():
    members = [0, 1, 2]  # an allreduce of m = 4 float32 per chunk on p = 3 moves 2(p-1)·m·4 = 64 bytes
    with pytest.raises(AssertionError, match="did not travel the ring"):  # the sum came some other way
        judge.traffic({"messages": [], "recorded": [64, 4]}, _call(), 0, members)
    with pytest.raises(AssertionError, match="32 bytes handed to dist.isend"):
        judge.traffic({"messages": [["isend", 1, 16], ["isend", 1, 16]]}, _call(), 0, members)
    with pytest.raises(AssertionError, match="sends only to rank 1"):
        judge.traffic({"messages": [["isend", 2, 64]]}, _call(), 0, members)
    with pytest.raises(AssertionError, match="receives only from rank 2"):
        judge.traffic({"messages": [["irecv", 1, 64], ["isend", 1, 64]]}, _call(), 0, members)
    enough = {"messages": [["isend", 1, 32], ["isend", 1, 32], ["irecv", 2, 32], ["irecv", 2, 32]],
              "recorded": [64, 4]}
    judge.traffic(enough, _call(), 0, members)
    judge.traffic(enough, _call(exact=True), 0, members)
    with pytest.raises(AssertionError, match="record_send saw 64 bytes in 1 messages"):
        judge.traffic({**enough, "recorded": [64, 1]}, _call(exact=True), 0, members)
    with pytest.raises(AssertionError, match="isend carried 96 bytes"):
        judge.traffic({**enough, "messages": enough["messages"] + [["isend", 1, 32]]}, _call(exact=True), 0, members)
    subgroup = {"messages": [["isend", 2, 16], ["irecv", 2, 16], ["isend", 2, 16], ["irecv", 2, 16]]}
    judge.traffic(subgroup, _call(m=2), 0, [0, 2])  # p = 2: both neighbours are global rank 2


def test_a_trap_the_student_caught_is_still_flagged():
    block = inputs.Block("p=3:ar", names.C_AR, [0, 1, 2], 0)
    for rank in block.members:
        block.calls[rank] = [_call()]
    fine = [{"p=3:ar": [{"raised": None, "same": True, "messages": [["isend", (r + 1) % 3, 64]], "trapped": []}]}
            for r in range(3)]
    judge.judge_block(block, fine)
    caught = {**fine[2]["p=3:ar"][0], "trapped": ["torch.distributed.all_reduce"]}  # no exception: caught
    with pytest.raises(checks.Flagged, match="rank 2: called forbidden `torch.distributed.all_reduce`"):
        judge.judge_block(block, [{"p=3:ar": []}, fine[1], {"p=3:ar": [caught]}])  # before rank 0's failure


def test_what_ended_the_ranks_keeps_its_outcome(tmp_path):
    (tmp_path / "ring.py").write_text("")
    tb = f'Traceback (most recent call last):\n  File "{tmp_path}/ring.py", line 7, in f\nRuntimeError: lost\n'
    outcome, reason = classify(judge.failure(["rank", 1, "RuntimeError", "lost", tb]), tmp_path)
    assert outcome == "error" and reason.startswith("rank 1: RuntimeError: lost") and "ring.py:7" in reason
    assert classify(judge.failure(["timeout", "ranks [0] did not answer"]), tmp_path)[0] == "timeout"
    assert classify(judge.failure(["rank", 0, "Flagged", "called forbidden `x`", ""]), tmp_path)[0] == "flagged"
    with pytest.raises(RuntimeError):
        judge.answer({"neither": 1})


def test_hidden_inputs_come_from_the_seed_not_the_worker():
    a = inputs.input_of(1, "p=3", 0, 11, torch.float32)
    assert torch.equal(a, inputs.input_of(1, "p=3", 0, 11, torch.float32))
    assert not torch.equal(a, inputs.input_of(2, "p=3", 0, 11, torch.float32))
    assert not torch.equal(a, inputs.input_of(1, "p=3", 1, 11, torch.float32))


def test_ranks_answer_the_worker_in_data_never_in_pickles():
    import pickle

    from autograder.probes import a2_collectives as probe

    x = torch.arange(6, dtype=torch.bfloat16).view(2, 3)
    kind, payload = probe._unpack(probe._pack(["ok", {"out": x, "messages": [["isend", 1, 12]]}]))
    assert kind == "ok" and torch.equal(payload["out"], x) and payload["messages"] == [["isend", 1, 12]]
    with pytest.raises(Exception):  # a rank that sends a pickle: a malformed answer, never unpickled
        probe._unpack(pickle.dumps(["ok", None]))


def test_an_inconclusive_speed_round_is_measured_again_and_a_slow_ring_fails_at_once(monkeypatch):
    limit = names.AR_SPEED_MAX
    for script, want_ratio, want_rounds in (
        ([(0.9, 0.8, 1.0)], 0.9, 1),                                    # fast: one round
        ([(4.0, 3.5, 4.4)], 4.0, 1),                                    # slow, p20 over the limit too: one round
        ([(1.69, 1.24, 1.92), (1.1, 1.0, 1.2)], 1.1, 2),                # the CI flake, then a quiet round
        ([(1.7, 1.3, 1.9), (1.8, 1.4, 2.0), (1.6, 1.2, 1.9)], 1.6, 3),  # never below: the best of 3 fails
    ):
        rounds = iter(script)
        monkeypatch.setattr(judge_speed, "_measure", lambda timer, op: next(rounds))
        ratios, n = judge_speed._measure_rounds(None, "ar", limit)
        assert (ratios[0], n) == (want_ratio, want_rounds)
        assert next(rounds, None) is None  # no round was measured past the verdict


def test_the_chunking_is_the_students_uneven_chunks_pass_the_byte_check():
    """p = 3, n = 10: padded chunks of 4 send 2·2·4 = 16 items; uneven chunks (4, 3, 3) send between
    2·2·3 = 12 and 16 items, whichever chunk a rank keeps. Both are rings; more is not."""
    call = inputs.Call({}, lambda record: None, fn="allreduce", m=4, itemsize=4, n=10, dtype=torch.float32,
                       exact_bytes=True)
    for items in (16, 14, 12):
        sent = [["isend", 1, items * 2], ["isend", 1, items * 2], ["irecv", 2, 8]]
        judge.traffic({"messages": sent, "recorded": [items * 4, 4]}, call, 0, [0, 1, 2])
    with pytest.raises(AssertionError, match="between"):
        judge.traffic({"messages": [["isend", 1, 72]], "recorded": [72, 4]}, call, 0, [0, 1, 2])
    with pytest.raises(AssertionError, match="expected the 64 bytes sent"):
        judge.traffic({"messages": [["isend", 1, 64]], "recorded": [48, 4]}, call, 0, [0, 1, 2])
