"""Closing the loop here: a ClusterSpec measured on this machine (matmul rate, gloo α–β, one
calibration of the tiny GPT's compute alone) predicts the step time of the course's own
data-parallel (module 3) and 1F1B pipeline (module 4) runs at p = 2 within ±25 %.

The calibration sees no communication, bubble or pipeline message; those are the planner's.
Measured on a shared 2-core machine, with the three runs timed in turn, rep by rep.
"""

import pytest

from scaletrain.plan.local import close_the_loop


@pytest.mark.slow
def test_planner_predicts_this_machines_dp_and_pp_steps_within_25_percent():
    cluster, rows = close_the_loop(2)
    assert cluster.intra.alpha_s > 0 and cluster.intra.beta_s_per_byte > 0
    report = "\n".join(f"{r.run:8s} {r.layout:32s} measured {r.measured_s * 1e3:7.1f} ms  "
                       f"predicted {r.predicted_s * 1e3:7.1f} ms  ({r.error:+.0%})" for r in rows)
    print(report)
    assert [r.run for r in rows] == ["DP", "PP 1F1B"]
    for r in rows:
        assert abs(r.error) <= 0.25, report
