"""`package.json`: what a grading package was built with, read by its own grader and by a regrade.

`gradescope aN` writes it at the package's root (autograder/gradescope.py); `run_autograder`
hands it to `grade --package`, so the grading seed lives in one root-only file and nowhere a
submission can read it (Gradescope copies `run_autograder` to a world-readable /autograder/). A
class regrade reads the same file from the zip and grades on the same hidden inputs.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from autograder.checks import SEED_ENV

GRADING_BUILD = "grading-build"   # the worker's library in a package: not build/, where setuptools writes
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
TORCH_BUILDS = ("cpu", "cuda")


class PackageError(Exception):
    """The package.json is missing, malformed, or for another assignment (exit 2, the reason)."""


@dataclass(frozen=True)
class PackageInfo:
    assignment: str
    seed: int
    torch: str = "cpu"                        # which build setup.sh installs
    hidden_visibility: str = "after_published"  # Gradescope visibility of the checks a suite keeps hidden

    def __post_init__(self):
        if not isinstance(self.seed, int) or self.seed <= 0:
            raise PackageError(f"package.json: seed must be a positive integer, got {self.seed!r}")
        if self.torch not in TORCH_BUILDS:
            raise PackageError(f"package.json: torch must be one of {TORCH_BUILDS}, got {self.torch!r}")
        if self.hidden_visibility not in VISIBILITIES:
            raise PackageError(f"package.json: hidden_visibility must be one of {VISIBILITIES}, "
                               f"got {self.hidden_visibility!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> PackageInfo:
        try:
            fields = json.loads(text)
            return cls(**{k: fields[k] for k in asdict(cls("a0", 1))})
        except (ValueError, TypeError, KeyError) as exc:
            raise PackageError(f"{where}: not a package.json of this grader ({exc}); "
                               "rebuild the package with `python -m autograder gradescope aN`") from None

    def check_assignment(self, assignment: str) -> None:
        if assignment.split("_")[0] != self.assignment:
            raise PackageError(f"the package grades {self.assignment}, not {assignment}")

    def apply(self) -> None:
        """The grading seed, for this process and every runner it starts (they read it when used)."""
        os.environ[SEED_ENV] = str(self.seed)


def load(path: Path) -> PackageInfo:
    if not path.is_file():
        raise PackageError(f"{path}: no such file; `--package` takes the package.json of an unzipped package")
    return PackageInfo.from_json(path.read_text(), str(path))
