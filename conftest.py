"""Shared pytest setup: GPU tests skip with a reason on CPU (never counted as passed)."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine (GPU checks are not run here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _one_thread_per_test_process():
    # The suite's multi-rank tests already run p processes on 2 cores; don't let torch's
    # intra-op pool in the pytest process fight them.
    torch.set_num_threads(1)
