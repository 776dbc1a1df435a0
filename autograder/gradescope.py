"""`python -m autograder gradescope aN -o aN_autograder.zip`: the autograder upload for Gradescope.

Gradescope unpacks the zip into /autograder/source, runs `setup.sh` once (as root) to build the
image, then for every submission copies `run_autograder` to /autograder/, puts the student's files
in /autograder/submission/ and reads /autograder/results/results.json. The package holds the
library, the harness, this assignment's hidden suite (no other suite, no solutions), the grading
build the student's code imports (`grading-build/`), and `package.json`: the grading seed, which
is in no repository, and the choices made when the zip was built (torch build, visibility of
hidden checks). `tests/deploy/test_gradescope_deploy.py` installs it at the real /autograder with
its own setup.sh and grades through its own run_autograder; `AUTOGRADER_ROOT` lets the faster tests
run the same script in a temporary folder.
"""

from __future__ import annotations

import random
import tempfile
import zipfile
from pathlib import Path

from autograder.manifest import REPO, Manifest
from autograder.package_info import GRADING_BUILD, PackageInfo
from autograder.release import ANSWERS_FILE, written_questions
from autograder.student import grading_build, repo_files

APT_PACKAGES = "python3 python3-venv python3-pip"
# the grader's tooling that a package has no use for (the suites import attacks.py: it ships)
NOT_PACKAGED = ("selftest.py", "student.py", "gradescope.py", "regrade.py", "gpu_check.py")
TORCH_INDEX = {"cpu": "https://download.pytorch.org/whl/cpu", "cuda": None}   # cuda: PyPI's default build

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, on its Ubuntu image. It installs the pinned packages of
# requirements.txt into a venv and nothing else: the course is never installed as a package, so the
# grader imports it from /autograder/source alone (never from site-packages), and what runs the
# student's code imports only {build}/. torch is the {torch} build, chosen when the zip was built.
set -euo pipefail
apt-get update -qq && apt-get install -y -qq {apt} >/dev/null
# the pins (numpy 2.4, matplotlib 3.11) need Python >= 3.11, and Ubuntu 22.04's python3 is 3.10
find_python() {{
  for p in python3 python3.13 python3.12 python3.11; do
    if command -v "$p" >/dev/null && "$p" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$p"; return 0
    fi
  done
  return 1
}}
python=$(find_python || true)
if [ -z "$python" ]; then
  apt-get install -y -qq python3.11 python3.11-venv >/dev/null
  python=$(find_python || true)
fi
[ -n "$python" ] || {{ echo "setup.sh: no Python >= 3.11 here, nor from apt (python3.11)" >&2; exit 1; }}
"$python" -m venv /autograder/venv
/autograder/venv/bin/pip install --quiet --disable-pip-version-check{index} -r /autograder/source/requirements.txt
# The student's code runs as `nobody` (root's files unreadable to it) and imports only {build}/,
# the library whose graded regions run the submission; the reference in lib/, the suite and
# package.json (the grading seed) stay root's.
chmod -R go-rwx /autograder/source
chmod o+x /autograder /autograder/source
chmod -R a+rX /autograder/source/{build} /autograder/venv
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission (from a world-readable copy: it holds no secret). The
# verdict is in results/results.json, which the grader writes even when it breaks; the exit code is
# always 0 so Gradescope shows that file. The seed is in source/package.json, readable by root only.
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
cd "$ROOT/source" || exit 0
mkdir -p "$ROOT/results"
PYTHONPATH="$ROOT/source/lib:$ROOT/source" "$ROOT/venv/bin/python" -m autograder grade {assignment} \\
    --package "$ROOT/source/package.json" --submission "$ROOT/submission" \\
    --json "$ROOT/results/results.json" --device cpu
exit 0
"""


def requirements(m: Manifest, torch: str) -> str:
    """The pinned runtime packages of pyproject.toml, torch as the chosen build; triton where the
    assignment's kernels run in its interpreter."""
    import tomllib  # Python >= 3.11: building a package is the instructor's side

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = [f"{p}+cpu" if torch == "cpu" and p.startswith("torch==") else p for p in project["dependencies"]]
    if any(src.startswith("kernels/") and src.endswith(".py") for src in m.files.values()):
        pins += [p for p in project["optional-dependencies"]["dev"] if p.startswith("triton")]
    return "".join(f"{p}\n" for p in pins)


def setup_script(m: Manifest, torch: str) -> str:
    apt = APT_PACKAGES + (" g++" if any(src.endswith(".cu") for src in m.files.values()) else "")
    index = f" --extra-index-url {TORCH_INDEX[torch]}" if TORCH_INDEX[torch] else ""
    return SETUP_SH.format(apt=apt, index=index, torch=torch, build=GRADING_BUILD)


def package_files(m: Manifest, info: PackageInfo) -> dict[str, str | bytes | Path]:
    """Path in the zip -> text or file to copy."""
    files: dict[str, str | bytes | Path] = {
        "setup.sh": setup_script(m, info.torch), "requirements.txt": requirements(m, info.torch),
        "run_autograder": RUN_AUTOGRADER.format(assignment=m.assignment), "package.json": info.to_json()}
    for top in ("lib", "kernels"):
        for path in repo_files(REPO / top):
            files[path.relative_to(REPO).as_posix()] = path
    for path in sorted((REPO / "autograder").glob("*.py")):
        if path.name not in NOT_PACKAGED:
            files[f"autograder/{path.name}"] = path
    for path in [REPO / "autograder" / "suites" / "__init__.py", *m.suite_files()]:
        files[path.relative_to(REPO).as_posix()] = path
    with tempfile.TemporaryDirectory() as tmp:  # the worker's library, made here where every manifest is known
        build = grading_build(m.assignment, Path(tmp) / GRADING_BUILD)
        for path in repo_files(build):
            rel = path.relative_to(build).as_posix()
            files[f"{GRADING_BUILD}/{rel}"] = path.read_bytes()
            if rel.startswith("autograder/probes/"):  # the suite builds the probes' models too
                files[rel] = path.read_bytes()
    files["written_questions.md"] = _questions(m)
    return files


def _questions(m: Manifest) -> str:
    handout = m.stub_dir() / "README.md"
    questions = written_questions(handout.read_text()) if handout.is_file() else []
    return (f"# {m.assignment} written questions: add each as a manually graded question in Gradescope\n\n"
            f"Students hand them in as `{ANSWERS_FILE}` inside their submission.\n\n"
            + "".join(f"{i}. {q}\n" for i, q in enumerate(questions, 1)))


def build_package(m: Manifest, out: Path, *, seed: int | None = None, torch: str = "cpu",
                  hidden_visibility: str = "after_published") -> Path:
    """The zip; `torch`: the build setup.sh installs ("cpu": Gradescope has no GPU); `hidden_visibility`:
    when students see the checks a suite does not mark visible."""
    seed = seed if seed is not None else random.SystemRandom().randrange(1, 2**31)
    info = PackageInfo(m.assignment, seed, torch, hidden_visibility)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in package_files(m, info).items():
            if isinstance(content, Path):
                z.write(content, arcname=name)
            elif isinstance(content, bytes):
                z.writestr(name, content)
            else:
                entry = zipfile.ZipInfo(name)
                entry.external_attr = (0o755 if name in ("setup.sh", "run_autograder") else 0o644) << 16
                z.writestr(entry, content)
    return out
