"""Only regular files are graded, and a file the static check can't read is the file's fault
(issue 28, parts 8 and 9): a link to the reference earns nothing and a 300,000-term expression is
an `error` of that file's checks with exit code 1, never "the grader could not run" (2)."""

import json
import os
import subprocess
import sys

from autograder.grade import static_outcomes
from autograder.manifest import REPO, get_manifest

A0 = get_manifest("a0")


def _grade(folder, tmp_path) -> tuple[int, dict]:
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", "a0", "--submission", str(folder),
                           "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO)
    return proc.returncode, json.loads(out.read_text())


def test_a_link_to_the_reference_is_an_error_not_a_copy(tmp_path):
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "memory.py").symlink_to(REPO / "solutions/a0_memory/memory.py")
    decided = static_outcomes(A0, folder)
    assert set(decided) == {c.name for c in A0.checks}
    assert {v for v in decided.values()} == {("error", "memory.py is a symbolic link, not a regular file: "
                                                       "submit the file itself")}
    code, payload = _grade(folder, tmp_path)
    assert code == 1 and payload["score"] == 0


def test_a_fifo_is_not_opened(tmp_path):
    folder = tmp_path / "sub"
    folder.mkdir()
    os.mkfifo(folder / "memory.py")  # reading it would block the grader
    assert {o for o, _ in static_outcomes(A0, folder).values()} == {"error"}


def test_a_file_too_deep_for_the_parser_is_the_files_error(tmp_path):
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "memory.py").write_text("x = " + "+".join(["1"] * 300_000) + "\n")
    decided = static_outcomes(A0, folder)
    assert {o for o, _ in decided.values()} == {"error"}
    assert all("could not parse" in why for _, why in decided.values())
    code, payload = _grade(folder, tmp_path)
    assert code == 1 and not payload["extra_data"]["harness_error"]
