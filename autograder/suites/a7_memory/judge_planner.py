"""a7 task 7.3's verdicts: the student's plans simulated with the reference schedule, by property
(fits its budget, as fast as the optimum, ValueError when nothing fits)."""

from __future__ import annotations

from autograder.suites import paired

from .inputs import _fields, _planner_cases
from .judge_scaler import start_worker
from .names import C_DP_FIT, C_DP_NONE, C_DP_OPT, PROBE


def _simulated(got):
    """The simulated plan, or the reason there is none, raised in the check that reads it."""
    if isinstance(got, Exception):
        raise got
    return got


def _answer(answer, chain, budget: int, label: str):
    from scaletrain.checkpointing.schedule import from_data, simulate

    if "value_error" in answer:
        raise AssertionError(f"{label}: raised ValueError ({answer['value_error']}) though a plan fits")
    if "malformed" in answer:
        raise AssertionError(f"{label}: returned something that is not a Store/Split plan: {answer['malformed']}")
    try:
        return simulate(from_data(answer["plan"]), chain)
    except (ValueError, TypeError, IndexError) as exc:
        raise AssertionError(f"{label}: the plan is not a valid plan of the chain's stages: {exc}") from None


def group_planner(ctx):
    from scaletrain.checkpointing.planner import min_peak, plan_rotor
    from scaletrain.checkpointing.schedule import simulate

    start_worker(ctx)

    def ask(cases):
        """[(answer, (chain, budget))]: one answer per case, or the check fails (issue 28)."""
        answers = ctx.untrusted().call(PROBE + "plans", "rotor_planner", [(_fields(c), b) for c, b in cases])
        return paired(answers, cases, "plan_rotor: the plans, one per (chain, budget)")

    roomy, tight = _planner_cases(salt=6, tight=False), _planner_cases(salt=7, tight=True)
    got = {}  # (chain, budget) -> the simulated plan, or the exception that says why there is none
    try:
        answers = ask(roomy + tight)
    except Exception as exc:  # noqa: BLE001 - not implemented, a crash, a timeout: every check's outcome
        answers = [(exc, case) for case in roomy + tight]
    for answer, (chain, budget) in answers:
        try:
            if isinstance(answer, Exception):
                raise answer
            got[chain, budget] = _answer(answer, chain, budget, f"plan_rotor({chain}, budget={budget})")
        except Exception as exc:  # noqa: BLE001 - raised in the checks that read this case
            got[chain, budget] = exc
    with ctx.check(C_DP_FIT):  # every plan, roomy and tight budgets: the property every design keeps
        for chain, budget in roomy + tight:
            sim = _simulated(got[chain, budget])
            assert sim.peak_bytes <= budget, (f"plan_rotor({chain}, budget={budget}): the plan's peak is "
                                              f"{sim.peak_bytes} B, over the budget")
    with ctx.check(C_DP_OPT):
        for chain, budget in roomy:
            label = f"plan_rotor({chain}, budget={budget})"
            sim, best = _simulated(got[chain, budget]), simulate(plan_rotor(chain, budget), chain)
            assert sim.peak_bytes <= budget, f"{label}: the plan's peak is {sim.peak_bytes} B, over the budget"
            assert abs(sim.time_s - best.time_s) <= 1e-9 * best.time_s, (
                f"{label}: the plan takes {sim.time_s:.6g} s, the fastest plan within the budget {best.time_s:.6g} s")
    with ctx.check(C_DP_NONE):
        chains = list(dict.fromkeys(chain for chain, _ in tight))  # each once, the public test's included
        impossible = [(chain, min_peak(chain) - 1) for chain in chains if min_peak(chain) > 0]
        for answer, (chain, budget) in ask(impossible):
            assert "value_error" in answer, (f"plan_rotor({chain}, budget={budget}): no plan fits (the lowest peak is "
                                             f"{budget + 1} B), expected a ValueError, got {answer}")
