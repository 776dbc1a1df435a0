"""The untrusted side of a group: the only process that imports the student's code.

Started by `autograder.untrusted.Untrusted` with `python -S -m autograder.worker IN OUT`: no
site-packages .pth files, so no editable install of the reference; its `sys.path` holds the
grading build of the library (the graded regions run the submission, `scaletrain.student_code`)
and the third-party packages. It reads requests from fd IN and answers on fd OUT, one
`autograder.wire` message each:

    {"probe": "autograder.probes.a0_memory:call", "args": [...], "kwargs": {...}}
 -> {"ok": <outputs>}  or  {"raised": {"type": "TypeError", "message": "...", "where": " (at memory.py:12)"}}

A probe runs student code on the inputs it is given and returns outputs as data. It computes no
expected value and decides no outcome: everything it says can be forged, and the grader treats
it as the student's answer, nothing more.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import traceback
from pathlib import Path

from autograder import sandbox, wire

PROBES = "autograder.probes."


def _where(exc: BaseException, submission: Path) -> str:
    """' (at ring.py:42)' for the deepest frame in the submission folder, else ''."""
    hits = re.findall(r'File "([^"]+)", line (\d+)', "".join(traceback.format_exception(exc)))
    for filename, line in reversed(hits):
        if Path(filename).resolve().parent == submission:
            return f" (at {Path(filename).name}:{line})"
    return ""


def _probe(name: str):
    module, _, fn = name.partition(":")
    if not module.startswith(PROBES) or not fn:
        raise ValueError(f"not a probe: {name!r}")
    return getattr(importlib.import_module(module), fn)


def serve(fd_in: int, fd_out: int, submission: Path) -> None:
    while True:
        try:
            request = wire.recv(fd_in)
        except EOFError:
            return
        try:
            result = _probe(request["probe"])(*request.get("args", ()), **request.get("kwargs", {}))
            wire.send(fd_out, {"ok": result})
        except Exception as exc:  # noqa: BLE001 - the student's failure is data for the grader
            wire.send(fd_out, {"raised": {"type": type(exc).__name__, "message": wire.short(str(exc)),
                                          "where": _where(exc, submission)}})


def main(argv: list[str]) -> int:
    fd_in, fd_out = int(argv[0]), int(argv[1])
    submission = Path(os.environ["AUTOGRADER_SUBMISSION"]).resolve()
    sys.path.insert(0, str(submission))
    serve(fd_in, fd_out, submission)
    return 0


if __name__ == "__main__":
    sandbox.exit_now(main(sys.argv[1:]))
