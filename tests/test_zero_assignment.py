"""a5's stub detection reads the generated files (its selftest runs in tests/test_assignments.py)."""

from autograder.suites.a5_zero import MANIFEST
from autograder.suites.a5_zero.judge import unimplemented

def test_stub_detection_reads_the_generated_files():
    every = {f for t in MANIFEST.tasks for f in t.functions}
    files = ("zero_engine.py", "zero_stage3.py")  # task 5.4 in its own file
    assert set().union(*(unimplemented(MANIFEST.stub_dir() / f) for f in files)) == every
    assert all(unimplemented(MANIFEST.solution_dir() / f) == set() for f in files)
