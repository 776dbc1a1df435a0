"""The trusted side of a1's suite through a real worker: masks cross as their own storage, the
student's kernels run under the grader's wrappers into NaN-filled outputs, and the GPU speed
protocol (clock here, batch less an empty batch, sampled outputs) runs end to end on the CPU
through the Triton interpreter, so its plumbing is tested where no GPU is
(autograder/suites/a1_kernels/, autograder/probes/a1_kernels.py)."""

import math
import os
import shutil
from pathlib import Path

import pytest
import torch

from autograder.manifest import get_manifest
from autograder.student import grading_build
from autograder.suites.a1_kernels import judge as suite
from autograder.suites.a1_kernels import judge_speed
from autograder.untrusted import BUILD_ENV, Untrusted
from scaletrain.ops import conformance as cf
from scaletrain.ops.mask import MaskView

A1 = get_manifest("a1")
pytestmark = pytest.mark.slow


class _Ctx:
    """The two things of a GroupContext the suite's helpers use."""

    def __init__(self, worker):
        self.device, self._worker = "cpu", worker

    def untrusted(self):
        return self._worker


def _submission(root: Path, name: str, plant=None) -> Path:
    folder = root / name / A1.folder
    shutil.copytree(A1.solution_dir(), folder)
    if plant is not None:
        target = folder / plant.file
        target.write_text(plant.apply(target.read_text()))
    return folder


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    root = tmp_path_factory.mktemp("a1-trusted")
    os.environ[BUILD_ENV] = str(grading_build("a1", root / "build"))
    zeros = next(p for p in A1.planted if p.name == "softmax that returns zeros")
    started = {name: Untrusted(_submission(root, name, plant), timeout_s=120)
               for name, plant in (("solution", None), ("zeros", zeros))}
    yield {name: _Ctx(w) for name, w in started.items()}
    for w in started.values():
        w.close()
    os.environ.pop(BUILD_ENV)


def test_a_broadcast_mask_travels_as_its_own_elements():
    mask = torch.randn(2, 1, 1, 37).expand(2, 3, 37, 37)
    sent = suite._send(MaskView.broadcast(mask))
    assert sent["mask"].numel() == 2 * 37  # not 2 * 3 * 37 * 37
    rebuilt = MaskView(tensor=sent["mask"].clone(), **dict(zip(
        ("size1", "size2", "stride0", "stride1", "stride2", "col_stride"), sent["view"])))
    assert torch.equal(rebuilt.dense(2 * 3 * 37, 37), mask.reshape(-1, 37))


def test_the_solution_passes_masked_causal_trials_in_the_worker(workers):
    backend = suite.remote_backend(workers["solution"])
    cf.softmax_forward(backend, (2, 3, 37, 37), mask_shape=(2, 1, 1, 37), pad=True, causal=True)
    cf.layer_norm_backward(backend, (31, 257))


def test_unwritten_outputs_are_nan_not_leftover_memory(workers):
    """Task 1.5 alone: the dx kernel is not launched, so dx is exactly the grader's NaN fill."""
    backend = suite.remote_backend(workers["solution"], skip=("layer_norm_bwd_dx_kernel",))
    x, w = torch.randn(5, 40), torch.ones(40)
    mean, rstd = x.mean(-1), torch.rsqrt(x.var(-1, unbiased=False) + 1e-5)
    dx, dw, db = backend.layer_norm_bwd(torch.randn_like(x), x, w, mean, rstd, True, True)
    assert torch.isnan(dx).all() and not torch.isnan(dw).any() and not torch.isnan(db).any()


def test_speed_protocol_runs_on_the_cpu_and_checks_the_timed_outputs(workers):
    kw = dict(kernels="triton", shape=(64, 256), pairs=2, reps=2, interpret=True)
    row = judge_speed.speed_ratios(workers["solution"], "softmax", "fwd", **kw)
    assert row["seconds"] > 0 and all(math.isfinite(row[k]) and row[k] > 0 for k in ("x naive", "x native", "GB/s"))
    with pytest.raises(AssertionError, match="the timed calls' output"):
        judge_speed.speed_ratios(workers["zeros"], "softmax", "fwd", **kw)


def test_the_grader_can_launch_the_kernels_with_other_tiles(workers):
    """The kernels' design is the student's: it must hold for any tile the launcher may choose (a
    row of several tiles, a tile wider than the row, one row per program)."""
    for tile in ((1, 16), (4, 128)):
        backend = suite.remote_backend(workers["solution"], tile=tile)
        cf.softmax_forward(backend, (5, 37), mask_shape=(5, 37))
        cf.layer_norm_backward(backend, (3, 100), grads=("dx",))
