"""The names ops/conformance.py compares with; the comparison itself is `scaletrain.testing`'s."""

from __future__ import annotations

from scaletrain.testing import TOLERANCE, assert_close

__all__ = ["TOLERANCE", "assert_rel_close"]


def assert_rel_close(actual, expected, *, tol: float | None = None, what: str = "output",
                     floor: float = 1e-12) -> None:
    """`scaletrain.testing.assert_close` with rtol=tol: rel_error(actual, expected) <= tol."""
    assert_close(actual, expected, rtol=tol, floor=floor, what=what)
