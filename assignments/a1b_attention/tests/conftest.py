"""The Triton interpreter on CPU for a1b's public tests.

Triton decides between its compiler and its interpreter when `triton` is first imported, so
TRITON_INTERPRET=1 is set here, before any test module imports the kernels, when there is no GPU.
(Task markers such as `-m task1_3` come from the repository's root conftest.py.)
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    from scaletrain.ops.toolchain.interpreter_compat import patch_scalar_index
    patch_scalar_index()  # an older Triton's interpreter beside NumPy >= 2.4 (see that module)
