"""Which tasks' public tests fail on a submission (tests/test_hidden_covers_public.py).

Run as a script, in a process of its own (a submission's modules are imported once per process):
`python tests/public_failures.py TESTS_FOLDER SUBMISSION TASK...` prints {task id: [failed test
ids]} as JSON, from the public tests of the given tasks (selected by their task markers, as
`pytest -m task3_1` does) with $AUTOGRADER_SUBMISSION pointing at SUBMISSION. Speed tests are left
out: they measure the machine (a busy one fails them), not a case the hidden suite should run.
"""

from __future__ import annotations

import json
import os
import sys


class _Failures:
    """A pytest plugin: the task markers of every collected test, and the tests that failed."""

    def __init__(self):
        self.tasks: dict[str, list[str]] = {}
        self.failed: set[str] = set()

    def pytest_collection_modifyitems(self, items):
        for item in items:
            self.tasks[item.nodeid] = [m.name for m in item.iter_markers() if m.name.startswith("task")]

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed.add(report.nodeid)

    def by_task(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for nodeid in sorted(self.failed):
            for marker in self.tasks.get(nodeid, []):
                out.setdefault(marker.removeprefix("task").replace("_", "."), []).append(nodeid)
        return out


def main(tests: str, submission: str, *tasks: str) -> dict[str, list[str]]:
    import pytest

    os.environ["AUTOGRADER_SUBMISSION"] = submission
    plugin = _Failures()
    expr = " or ".join(f"task{t.replace('.', '_')}" for t in tasks)
    code = pytest.main([tests, "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-m", expr, "-k", "not speed"],
                       plugins=[plugin])
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        raise SystemExit(f"pytest could not run the public tests of {tasks} in {tests}: exit code {code}")
    return plugin.by_task()


if __name__ == "__main__":
    result = main(*sys.argv[1:])
    print("PUBLIC-FAILURES " + json.dumps(result))
