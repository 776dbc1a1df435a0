"""a5's stub detection reads the generated files (its selftest runs in tests/test_assignments.py)."""

from autograder.suites.a5_zero import MANIFEST, unimplemented

def test_stub_detection_reads_the_generated_files():
    every = {f for t in MANIFEST.tasks for f in t.functions}
    assert unimplemented(MANIFEST.stub_dir() / "zero_engine.py") == every
    assert unimplemented(MANIFEST.solution_dir() / "zero_engine.py") == set()
