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
