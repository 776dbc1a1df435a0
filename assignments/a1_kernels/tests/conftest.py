"""Task markers (`pytest assignments/a1_kernels -m task1_3`) and the Triton interpreter on CPU.

Triton decides between its compiler and its interpreter when `triton` is first imported, so
TRITON_INTERPRET=1 is set here, before any test module imports the kernels, when there is no GPU.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

TASKS = ("1_1", "1_2", "1_3", "1_4", "1_5", "1_6", "1_7", "1_8", "1_9")


def pytest_configure(config):
    for task in TASKS:
        config.addinivalue_line("markers", f"task{task}: a1 task {task.replace('_', '.')}")
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped with a reason on CPU")
