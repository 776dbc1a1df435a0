"""Pipeline parallelism: schedules as data, a validator, a simulator, Gantt plots and an executor.

    from scaletrain.pipeline import one_f_one_b, validate, simulate, plot_schedule
    schedule = one_f_one_b(p=4, m=8)
    validate(schedule, p=4, m=8)
    simulate(schedule).bubble_fraction      # (p - 1) / (m + p - 1) = 3/11

The pure parts (schedules, validate, simulate) import neither torch nor matplotlib;
`PipelineExecutor` (torch) and `plot_schedule` (matplotlib) load on first use.
"""

from scaletrain.pipeline.schedules import (B, F, I, KINDS, SCHEDULES, W, Action, Schedule, gpipe,
                                           interleaved_1f1b, one_f_one_b, stage_rank, stages_of_rank, zb_h1)
from scaletrain.pipeline.fit import costs_from_timeline, message_delays, sampled_bubble
from scaletrain.pipeline.messages import Message, receives, sends
from scaletrain.pipeline.simulate import SimResult, Span, bubble_of, closed_form_bubble, peak_in_flight, simulate
from scaletrain.pipeline.validate import ScheduleError, schedule_sizes, validate

_LAZY = {"PipelineExecutor": "scaletrain.pipeline.executor", "plot_schedule": "scaletrain.pipeline.plot"}

__all__ = ["Action", "Schedule", "F", "B", "I", "W", "KINDS", "SCHEDULES", "stage_rank", "stages_of_rank",
           "gpipe", "one_f_one_b", "interleaved_1f1b", "zb_h1", "validate", "ScheduleError", "Message",
           "receives", "sends", "schedule_sizes", "simulate", "SimResult", "Span", "bubble_of",
           "closed_form_bubble", "costs_from_timeline", "message_delays", "sampled_bubble", "peak_in_flight", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'scaletrain.pipeline' has no attribute {name!r}")
