"""Triton's interpreter on older Triton with NumPy >= 2.4: a scalar used as a loop bound.

The interpreter holds a kernel's scalar arguments and `tl.program_id` as 1-element NumPy
arrays. `range(0, cols, BLOCK_N)` then asks the tensor for `__index__`, which Triton up to 3.6
answers with `int(array)`; NumPy 2.4 turned that deprecated conversion of an array with ndim > 0
into a TypeError ("only 0-dimensional arrays can be converted to Python scalars"). Triton 3.9
converts the array's single element instead. A GPU machine as it comes pairs its own Triton
with its own NumPy (the lent H100/H200 image of 2026-11: Triton 3.6.0, NumPy 2.5.2), and
`make gpu-check` grades the class's CPU half there through the interpreter, so the course
carries the same conversion for any Triton whose interpreter lacks it. Compiled kernels never
take this path.
"""

from __future__ import annotations

__all__ = ["patch_scalar_index"]


def patch_scalar_index() -> None:
    """Make the interpreter's tensors convert to an index through their single element, as
    Triton 3.9's do (harmless there). Idempotent; a Triton without this hook is left alone."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "scaletrain_index", False):
        return

    def patched(tensor, scope):
        patch(tensor, scope)
        # a later set_attr of the same name is undone first by scope.restore(): Triton's own comes back
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.scaletrain_index = True
    interpreter._patch_lang_tensor = patched
