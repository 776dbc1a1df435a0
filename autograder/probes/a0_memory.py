"""a0's one probe beyond plain calls: the student's zero_memory_per_rank with given per-parameter
bytes (the ZeRO paper's 2 + 2 + 12 B, public), so its table grades task 0.4 alone."""

from __future__ import annotations

from autograder.checks import student_module
from autograder.probes.common import as_data


def zero_memory_with_bytes_per_param(stem: str, function: str, *args, bytes_per_param, **kwargs):
    module = student_module(stem)
    own = module.bytes_per_param
    module.bytes_per_param = lambda **_: tuple(bytes_per_param)
    try:
        return as_data(getattr(module, function)(*args, **kwargs))
    finally:
        module.bytes_per_param = own
