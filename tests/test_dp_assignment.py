"""Assignment a3: the public tests pass on the solution (its selftest: tests/test_assignments.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from autograder.manifest import REPO, get_manifest
from autograder.static_check import check_source

A3 = get_manifest("a3")


@pytest.mark.parametrize("line,flagged", [
    ("from torch.nn.parallel import DistributedDataParallel", True),
    ("import torch.nn.parallel as par", True),
    ("from scaletrain.dp.data_parallel import DataParallel", True),
    ("from scaletrain.dp import DataParallel", True),
    ("from scaletrain.dp.bucket import Bucket, assign_buckets", False),
    ("import torch.distributed as dist", False)])
def test_forbidden_names_catch_torch_ddp_and_the_reference(line, flagged):
    findings = check_source(line + "\n", "dp_data_parallel.py", A3.forbidden["dp_data_parallel.py"])
    assert bool(findings) == flagged, findings


@pytest.mark.slow
def test_public_tests_pass_on_the_solution():
    env = dict(os.environ, AUTOGRADER_SUBMISSION=str(A3.solution_dir()))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "assignments/a3_data_parallel"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_the_public_tests_hand_3_2_and_3_3_the_references_buckets():
    """The public tests of 3.2 and 3.3 give the student's DataParallel a bucket assignment as data,
    as the grader does (so they pass whatever the state of 3.1): it must be the reference's."""
    import ast

    from scaletrain.dp.bucket import assign_buckets, bucket_cap_bytes
    from scaletrain.models import GPT, GPTConfig

    source = (A3.stub_dir() / "tests" / "test_a3_public.py").read_text()
    given = {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(source).body
             if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("REFERENCE_BUCKETS", "CAP_MB")}
    params = list(GPT(GPTConfig()).parameters())
    assert given["REFERENCE_BUCKETS"] == assign_buckets(params, bucket_cap_bytes(given["CAP_MB"], params))
