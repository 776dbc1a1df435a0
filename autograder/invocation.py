"""What every grading command shares (`grade`, `regrade`, `selftest`): the exit codes, the device
to grade on and the folder of an assignment's submission. Its own room so that `regrade` needs
nothing of the CLI that starts it (no import circle)."""

from __future__ import annotations

from pathlib import Path

from autograder.grade import UnusableSubmission

EXIT_OK, EXIT_FAILED, EXIT_HARNESS, EXIT_INCOMPLETE = 0, 1, 2, 3


def choose_device(choice: str) -> str:
    """The device to grade on. `--device cuda` where no CUDA device is visible is unusable input
    (exit 2), not a grade in which every GPU check, Triton ones included, fails."""
    if choice == "cpu":
        return choice
    import torch
    if torch.cuda.is_available():
        return "cuda"
    if choice == "cuda":
        raise UnusableSubmission("no CUDA device visible: run on a GPU machine or use --device auto/cpu")
    return "cpu"


def submission_folder(m, submission: str | None, every: bool) -> Path:
    """The folder to grade for assignment `m`: its working copy under assignments/ by default;
    with --submission DIR, DIR itself, or DIR/<assignment folder> for `grade all` and for a DIR
    laid out like solutions/ (it holds the assignment's folder and none of its files)."""
    if submission is None:
        return m.stub_dir()
    root = Path(submission)
    nested = root / m.folder
    if every or (nested.is_dir() and not any((root / name).is_file() for name in m.files)):
        return nested
    return root
