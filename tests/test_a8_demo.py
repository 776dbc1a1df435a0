"""Notebook 08's α–β pricing (`scaletrain.compression.demo`): each method's messages and bytes per step
equal the closed forms of the module docs, and the time is messages·α + bytes·β. No spawn."""

from __future__ import annotations

import math

import pytest

from scaletrain.comm.cost_model import AlphaBeta
from scaletrain.compression.demo import step_messages, transfer_seconds

# two buckets: a matrix that compresses at r = 4 beside a vector; a matrix too small to compress
BUCKETS = [[(960, 400), (400,)], [(10, 3)]]
N0 = 960 * 400 + 400
P = 8


def _ring(n: int) -> tuple[int, int]:
    return 2 * (P - 1), 2 * (P - 1) * math.ceil(n / P) * 4


def test_step_messages_match_the_formulas():
    assert step_messages("adam (DP)", BUCKETS, P) == [_ring(N0), _ring(30)]
    # PowerSGD: [uncompressed, P's, Q's] per bucket; 10×3 at rank 3 would not shrink, so it goes whole
    assert step_messages("powersgd r=4", BUCKETS, P) == [_ring(400), _ring(960 * 4), _ring(400 * 4), _ring(30)]
    assert step_messages("1-bit EF", BUCKETS, P) == [(P - 1, (P - 1) * 4 * (math.ceil(N0 / 32) + 1)),
                                                     (P - 1, (P - 1) * 4 * (1 + 1))]
    words = math.ceil(N0 / 32) + math.ceil(N0 / 64)
    assert step_messages("1-bit EF, 64/scale", BUCKETS, P)[0] == (P - 1, (P - 1) * 4 * words)
    chunk = math.ceil((N0 + 30) / P)
    assert step_messages("1-bit Adam", BUCKETS, P) == [(2 * (P - 1), 2 * (P - 1) * 4 * (math.ceil(chunk / 32) + 1))]
    with pytest.raises(ValueError, match="unknown method"):
        step_messages("topk", BUCKETS, P)


def test_transfer_seconds_is_alpha_beta():
    model = AlphaBeta(alpha_s=1e-5, beta_s_per_byte=1e-9)
    for method in ("adam (DP)", "powersgd r=1", "1-bit EF"):
        msgs = step_messages(method, BUCKETS, P)
        want = sum(m for m, _ in msgs) * 1e-5 + sum(b for _, b in msgs) * 1e-9
        assert transfer_seconds(method, BUCKETS, P, model) == pytest.approx(want, rel=1e-12)
    # compression pays on a slow link only: PowerSGD sends less but more messages
    slow, fast = AlphaBeta(alpha_s=1e-5, beta_s_per_byte=1e-8), AlphaBeta(alpha_s=1e-3, beta_s_per_byte=1e-12)
    assert transfer_seconds("powersgd r=4", BUCKETS, P, slow) < transfer_seconds("adam (DP)", BUCKETS, P, slow)
    assert transfer_seconds("powersgd r=4", BUCKETS, P, fast) > transfer_seconds("adam (DP)", BUCKETS, P, fast)
