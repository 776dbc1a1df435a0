"""The step-by-step ring picture (diagram.py) against what the ring must achieve, for p = 1..8."""

import pytest

from scaletrain.comm.diagram import ring_steps, ring_table


@pytest.mark.parametrize("p", range(1, 9))
def test_reduce_scatter_leaves_chunk_r_complete_on_rank_r_and_all_gather_spreads_it(p):
    transfers = ring_steps(p)
    assert len(transfers) == 2 * (p - 1) * p  # every rank receives once per step
    for t in transfers:
        if t.phase == "reduce-scatter":
            # at step s the received partial sum covers s+2 consecutive ranks ending at t.rank
            assert t.holds == frozenset((t.rank - k) % p for k in range(t.step + 2)), t
            assert t.chunk == (t.rank - t.step - 2) % p
        else:
            assert len(t.holds) == p and t.chunk == (t.rank - t.step - 1) % p
    finals = {t.rank: t.chunk for t in transfers if t.phase == "reduce-scatter" and t.step == p - 2}
    assert finals == ({r: r for r in range(p)} if p > 1 else {})
    received = {(t.rank, t.chunk) for t in transfers if t.phase == "all-gather"}
    assert received == {(r, c) for r in range(p) for c in range(p) if c != r}


def test_table_has_a_row_per_step_and_names_the_chunks():
    lines = ring_table(3).splitlines()
    assert len(lines) == 1 + 2 * 2
    assert lines[1].split()[3:] == ["c1", "<-", "{0,2}", "c2", "<-", "{0,1}", "c0", "<-", "{1,2}"]
    with pytest.raises(ValueError, match="world_size"):
        ring_steps(0)
