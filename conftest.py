"""Shared pytest setup: one marker per assignment task, and GPU tests skipped with a reason on CPU
(never counted as passed)."""

import pytest
import torch


def pytest_configure(config):
    """`pytest assignments/a2_collectives -m task2_1` runs task 2.1 alone (tasks from the manifests)."""
    from autograder.manifest import all_manifests

    for m in all_manifests().values():
        for t in m.tasks:
            config.addinivalue_line("markers", f"task{t.id.replace('.', '_')}: {m.assignment} task {t.id}, {t.title}")
    _one_assignment_per_session(config)


def _one_assignment_per_session(config):
    """Public tests import an assignment's files by name from its folder, which the first import
    records for the ranks it spawns ($AUTOGRADER_SUBMISSION): one session over two assignments'
    tests sends the second's imports to the first's folder ("a0_memory/softmax_triton.py is
    missing"). Refused before collection, with the commands that work."""
    from pathlib import Path

    from autograder.manifest import REPO

    here = Path(config.invocation_params.dir)
    chosen = [(here / arg.split("::", 1)[0]).resolve() for arg in config.args] or [here.resolve()]
    folders = [t.parent for t in sorted((REPO / "assignments").glob("*/tests"))]
    hit = [f.name for f in folders if any(f.is_relative_to(p) or p.is_relative_to(f) for p in chosen)]
    if len(hit) > 1:
        raise pytest.UsageError(f"these paths hold the public tests of {len(hit)} assignments ({', '.join(hit)}); "
                                "run one assignment per pytest session: `.venv/bin/pytest assignments/<folder>`, or "
                                "`make check` (or `python -m autograder grade all`), which runs each in its own")


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker: the long tests first (see below)
        items.sort(key=lambda item: not _alone(item.nodeid))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine (GPU checks are not run here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs `pytest -n 2`. A file's tests stay on one worker (its module-scoped spawn
    runs once; a notebook's cells run in order in one kernel), except the long selftests
    (`ALONE`), which any free worker takes one at a time, first, so the two workers share them
    instead of one worker getting all of them at the end. (xdist's own `loadgroup` cannot
    do this with pytest 9: it renames `item._nodeid`, which pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndAloneTests(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if _alone(nodeid) else nodeid.split("::", 1)[0]

    config.option.loadscopereorder = False  # keep the workers' order: ALONE tests first
    return FilesAndAloneTests(config, log)


ALONE = ("tests/test_assignments.py::test_selftest_",)  # node-id prefixes: the scheduler sees only ids


def _alone(nodeid: str) -> bool:
    return nodeid.startswith(ALONE)


@pytest.fixture(autouse=True, scope="session")
def _one_thread_per_test_process():
    # The suite's multi-rank tests already run p processes on 2 cores; don't let torch's
    # intra-op pool in the pytest process fight them.
    torch.set_num_threads(1)
