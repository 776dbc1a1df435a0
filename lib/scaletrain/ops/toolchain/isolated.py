"""`IsolatedWorker`: test cases in a subprocess whose TRITON_INTERPRET is fixed before triton is imported.

The Triton interpreter's tests (TRITON_INTERPRET=1) and the sm_80 compilation (TRITON_INTERPRET=0)
each need a process that imported triton in their mode, whatever the calling process did.
"""

from __future__ import annotations

import builtins
import os
import traceback

__all__ = ["IsolatedWorker"]


class IsolatedWorker:
    """One Python subprocess whose environment is set BEFORE it imports anything else.

    Triton reads TRITON_INTERPRET when `triton` is first imported (its own tl.max, tl.sum are
    decorated then), so a process that has imported triton cannot switch the interpreter on or
    off.  The tests and the grader run the interpreter's cases in a worker started with
    TRITON_INTERPRET=1, and the sm_80 compilation in one with TRITON_INTERPRET=0, whatever the
    main process did.  `run(fn, *args)` calls a module-level function there and returns its
    result; an exception in the worker is re-raised here as the same type when it is a builtin
    (AssertionError, NotImplementedError, ...) else RuntimeError, with the remote traceback.
    """

    def __init__(self, env: dict[str, str], timeout_s: float = 300.0):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        self.timeout_s = timeout_s
        self._pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"),
                                         initializer=_set_env, initargs=(env,))

    def run(self, fn, *args, **kwargs):
        outcome, value = self._pool.submit(_call_reporting, fn, args, kwargs).result(timeout=self.timeout_s)
        if outcome == "ok":
            return value
        exc_type, text = value
        cls = getattr(builtins, exc_type, None)
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            cls = RuntimeError
        raise cls(f"{text}\n(raised as {exc_type} in the isolated worker)")

    def close(self) -> None:
        for process in list(getattr(self._pool, "_processes", {}).values()):
            process.kill()  # a hung case must not keep the test session waiting
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _set_env(env: dict[str, str]) -> None:
    os.environ.update(env)


def _call_reporting(fn, args, kwargs):
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:  # report by name: the exception object may not unpickle here
        return "error", (type(exc).__name__, "".join(traceback.format_exception(exc)))
