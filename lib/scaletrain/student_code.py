"""In the student repository, a graded library module *is* the student's assignment file.

`python -m autograder release --student` replaces each library module whose assignment is
released but not yet solved (e.g. `scaletrain/dp/bucket.py` while a3 is open) by a two-line
module calling `run_student_file`. Everything that imports the library then runs the student's
code: the notebooks' demos, a later file of the same assignment (a3's `dp_data_parallel.py`
imports `scaletrain.dp.bucket`), and a later assignment built on an earlier one. Nothing of the
reference is left to import.

The student file is executed in the library module's own namespace (not aliased to the
top-level module `dp_bucket` the tests import) so that import cycles resolve exactly as they do
for the reference: `scaletrain/dp/__init__.py` may import `scaletrain.dp.data_parallel` while the
student's `dp_data_parallel.py` is itself being imported.
"""

from __future__ import annotations

import os
from pathlib import Path

SUBMISSION_ENV = "AUTOGRADER_SUBMISSION"  # the same variable as autograder.checks: one submission folder
REPO = Path(__file__).resolve().parents[2]


def student_file(folder: str, filename: str) -> Path:
    """The student's copy of `filename`: in $AUTOGRADER_SUBMISSION when that folder holds it (public
    tests run on a submission outside the repository), else in assignments/<folder>/."""
    override = os.environ.get(SUBMISSION_ENV)
    if override and (Path(override) / filename).is_file():
        return Path(override).resolve() / filename
    path = REPO / "assignments" / folder / filename
    if not path.is_file():
        raise ImportError(f"{path} is missing: this library module runs your assignments/{folder}/{filename}; "
                          f"restore it from the stub (git checkout -- assignments/{folder}/{filename})")
    return path


def run_student_file(namespace: dict, folder: str, filename: str) -> None:
    """Execute the student's file in `namespace` (a module's globals). Tracebacks name the
    student's file and line, because the code is compiled under that path."""
    path = student_file(folder, filename)
    namespace["__file__"] = str(path)
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 - the student's own code
