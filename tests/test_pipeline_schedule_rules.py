"""scaletrain.pipeline.schedule_rules, the properties tasks 4.1 and 4.2 are graded by: they accept
the library's schedules and another valid order, and each rejects the mistake it names (a4's
plants do the same through the grader: autograder/suites/a4_pipeline/planted.py)."""

import pytest

from scaletrain.pipeline import Action, interleaved_1f1b, one_f_one_b, simulate
from scaletrain.pipeline import schedule_rules as rules


def _one_f_one_b_rules(schedule, p, m):
    rules.check_valid(schedule, p, m, what="s")
    rules.check_bubble(schedule, (p - 1) / (m + p - 1), what="s")
    rules.check_peak(schedule, rules.one_f_one_b_bound(p, m), what="s")
    rules.check_warmup(schedule, p, m, what="s")
    rules.check_steady(schedule, what="s")
    rules.check_cooldown(schedule, what="s")


@pytest.mark.parametrize("p,m", [(1, 1), (2, 2), (3, 4), (4, 9), (5, 5)])
def test_1f1b_and_its_microbatches_reversed_have_every_property(p, m):
    _one_f_one_b_rules(one_f_one_b(p, m), p, m)
    reversed_order = {r: [Action(a.stage, a.kind, m - 1 - a.microbatch) for a in acts]
                      for r, acts in one_f_one_b(p, m).items()}
    _one_f_one_b_rules(reversed_order, p, m)


def _rows(rows):
    return {r: [Action(r, t[0], int(t[1:])) for t in text.split()] for r, text in rows.items()}


@pytest.mark.parametrize("rows,check,message", [
    ({0: "F0 F1 F2 B0 B1 F3 B2 B3", 1: "F0 F1 B0 F2 B1 F3 B2 B3", 2: "F0 B0 F1 B1 F2 B2 F3 B3"},
     lambda s: rules.check_steady(s, what="s"), "two Bs in a row"),
    ({0: "F0 F1 B0 F2 B1 F3 B2 B3", 1: "F0 F1 B0 F2 B1 F3 B2 B3", 2: "F0 B0 F1 B1 F2 B2 F3 B3"},
     lambda s: rules.check_warmup(s, 3, 4, what="s"), "rank 0: 2 forwards before its first backward"),
    ({0: "F0 F1 F2 F3 B0 B1 B2 B3", 1: "F0 F1 B0 F2 B1 F3 B2 B3", 2: "F0 B0 F1 B1 F2 B2 F3 B3"},
     lambda s: rules.check_peak(s, rules.one_f_one_b_bound(3, 4), what="s"), "rank 0: 4 microbatches in flight"),
    ({0: "F0 F1 F2 B0 F3 B1 B2", 1: "F0 F1 B0 F2 B1 F3 B2 B3", 2: "F0 B0 F1 B1 F2 B2 F3 B3"},
     lambda s: rules.check_cooldown(s, what="s"), "rank 0: after its last forward it runs BB;"),
    ({0: "F0 F1 F2 B0 F3 B1 B2", 1: "F0 F1 B0 F2 B1 F3 B2 B3", 2: "F0 B0 F1 B1 F2 B2 F3 B3"},
     lambda s: rules.check_valid(s, 3, 4, what="s"), "not a valid schedule"),
    ({0: "F0 B0 F1 B1 F2 B2 F3 B3", 1: "F0 B0 F1 B1 F2 B2 F3 B3"},
     lambda s: rules.check_bubble(s, 1 / 5, what="s"), "simulated bubble fraction"),
])
def test_each_property_rejects_its_mistake(rows, check, message):
    with pytest.raises(AssertionError, match=message):
        check(_rows(rows))


@pytest.mark.parametrize("p,m,v", [(1, 2, 2), (2, 4, 2), (3, 6, 2), (3, 9, 4), (4, 8, 3)])
def test_the_interleaved_bound_is_megatrons_peak(p, m, v):
    schedule = interleaved_1f1b(p, m, v)
    assert list(simulate(schedule).peak_in_flight) == rules.interleaved_bound(p, m, v)
    rules.check_bubble(schedule, (p - 1) / (v * m + p - 1), what="s")
