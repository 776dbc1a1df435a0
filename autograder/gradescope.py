"""`python -m autograder gradescope aN -o aN_autograder.zip`: the autograder upload for Gradescope.

Gradescope unpacks the zip into /autograder/source, runs `setup.sh` once to build the image,
then for every submission copies `run_autograder` to /autograder/, puts the student's files in
/autograder/submission/ and reads /autograder/results/results.json. The package holds the
library, the harness and this assignment's hidden suite only (no other suite, no solutions, no
planted submissions), and a grading seed that is in no repository: hidden inputs differ from the
public default. `AUTOGRADER_ROOT` (default /autograder) and `AUTOGRADER_PYTHON` let a test run
the same script in a temporary folder.
"""

from __future__ import annotations

import random
import tempfile
import zipfile
from pathlib import Path

from autograder.manifest import REPO, Manifest
from autograder.release import ANSWERS_FILE, written_questions
from autograder.student import INSTRUCTOR_ONLY, grading_build, repo_files

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, on its Ubuntu image: Python, a venv, the pinned stack.
set -euo pipefail
apt-get update -qq && apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
python3 -m venv /autograder/venv
# torch is pinned (pyproject.toml). Set TORCH_INDEX_URL to PyTorch's CPU wheel index to install
# the CPU build instead of the multi-GB CUDA one: Gradescope's machines have no GPU.
/autograder/venv/bin/pip install --quiet ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} /autograder/source
"""

LOCK_SOURCE = """# The student's code runs as `nobody` (root's files unreadable to it) and imports only build/, the
# library whose graded regions run the submission; the reference in lib/ and the suite stay root's.
chmod -R go-rwx /autograder/source
chmod o+x /autograder /autograder/source
chmod -R a+rX /autograder/source/build /autograder/venv
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission. The verdict is in results/results.json, which the
# grader writes even when it breaks; the exit code is always 0 so Gradescope shows that file.
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PY="${{AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}}"
cd "$ROOT/source" || exit 0
mkdir -p "$ROOT/results"
AUTOGRADER_SEED="${{AUTOGRADER_SEED:-{seed}}}" AUTOGRADER_BUILD="$ROOT/source/build" "$PY" -m autograder grade {assignment} \\
    --submission "$ROOT/submission" --json "$ROOT/results/results.json" --device cpu
exit 0
"""


def package_files(m: Manifest, seed: int) -> dict[str, str | bytes | Path]:
    """Path in the zip -> text or file to copy."""
    # only where every group is trusted: a legacy group runs the suite, as `nobody`, beside the
    # student's code and needs to read it (the threat model in autograder/README.md says what that leaves open)
    setup = SETUP_SH + (LOCK_SOURCE if all(g.trusted for g in m.groups) else "")
    files: dict[str, str | bytes | Path] = {"setup.sh": setup,
                                    "run_autograder": RUN_AUTOGRADER.format(seed=seed, assignment=m.assignment),
                                    "pyproject.toml": REPO / "pyproject.toml"}
    for top in ("lib", "kernels"):
        for path in repo_files(REPO / top):
            files[path.relative_to(REPO).as_posix()] = path
    for path in sorted((REPO / "autograder").glob("*.py")):
        if path.name not in INSTRUCTOR_ONLY:
            files[f"autograder/{path.name}"] = path
    suite = REPO / "autograder" / "suites" / f"{m.folder}.py"
    files["autograder/suites/__init__.py"] = REPO / "autograder" / "suites" / "__init__.py"
    files[f"autograder/suites/{suite.name}"] = suite
    with tempfile.TemporaryDirectory() as tmp:  # the worker's library, made here where every manifest is known
        build = grading_build(m.assignment, Path(tmp) / "build")
        for path in repo_files(build):
            files[f"build/{path.relative_to(build).as_posix()}"] = path.read_bytes()
    handout = m.stub_dir() / "README.md"
    questions = written_questions(handout.read_text()) if handout.is_file() else []
    files["written_questions.md"] = (
        f"# {m.assignment} written questions: add each as a manually graded question in Gradescope\n\n"
        f"Students hand them in as `{ANSWERS_FILE}` inside their submission.\n\n"
        + "".join(f"{i}. {q}\n" for i, q in enumerate(questions, 1)))
    return files


def build_package(m: Manifest, out: Path, *, seed: int | None = None) -> Path:
    seed = seed if seed is not None else random.SystemRandom().randrange(1, 2**31)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in package_files(m, seed).items():
            if isinstance(content, Path):
                z.write(content, arcname=name)
            elif isinstance(content, bytes):
                z.writestr(name, content)
            else:
                info = zipfile.ZipInfo(name)
                info.external_attr = (0o755 if name in ("setup.sh", "run_autograder") else 0o644) << 16
                z.writestr(info, content)
    return out
