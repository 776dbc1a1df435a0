"""`release --student OUT`: the repository a class clones, built from this one, with nothing to copy.

What goes in (DESIGN.md, "Three audiences, three builds"):
- assignments a0..aN (the `--through` one included): handout, stubs, public tests, answers file;
- notebooks 00..NN; the library (`lib/`) and `kernels/`, where every SOLUTION region is
    - the solution, for the assignments whose solutions are released (`--solutions`; by default
      every assignment before the `--through` one: a3 goes out with a0-a2 solved),
    - the student's own file, for a released assignment not solved yet: the library module
      runs `assignments/<folder>/<file>` (`scaletrain.student_code`), so a3's DP uses the
      student's buckets and notebook 03 demos the student's code,
    - the stub, for kernels of an unsolved assignment and for assignments not released yet;
- the public part of the autograder (public checks, `submit`, `list`), a student README and
  Makefile. Not: solutions/, hidden suites, planted submissions, ANSWERS.md, the selftest,
  the release/Gradescope/regrade tooling, CI.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from autograder.manifest import PUBLIC_MANIFEST, REPO, Manifest, all_manifests, public_record
from autograder.public import stub_markers
from autograder.release import ANSWERS_FILE, COMMENT, ReleaseError, outputs, render

TEMPLATES = Path(__file__).resolve().parent / "templates" / "student"
# the autograder's own modules ship (public checks, submit, the harness: nothing secret in them);
# the hidden suites (autograder/suites/, a package) and these instructor tools stay behind
INSTRUCTOR_ONLY = ("selftest.py", "student.py", "gradescope.py", "regrade.py", "gpu_check.py")
SKIP_PARTS = {"__pycache__", ".ipynb_checkpoints"}


@dataclass(frozen=True)
class Plan:
    released: tuple[Manifest, ...]     # assignments a0..aN
    solved: frozenset[str]             # assignments whose solutions ship

    def state(self, assignment: str) -> str:
        """'solved', 'open' (released, the student writes it) or 'unreleased'."""
        if assignment in self.solved:
            return "solved"
        return "open" if any(m.assignment == assignment for m in self.released) else "unreleased"


def course_order(name: str) -> tuple[int, str]:
    """Where an assignment ("a1", "a1_kernels", "a1b") or a notebook ("01b_attention.ipynb") sits
    in the course: (module number, suffix), so a1 < a1b < a2 and notebook 01b goes with a1b."""
    m = re.match(r"a?(\d+)([a-z]*)", name)
    return int(m.group(1)), m.group(2)


def make_plan(through: str | None, solutions: str | None = None) -> Plan:
    """`through`: the last released assignment (None: all). `solutions`: comma-separated assignments ("a0,a1"), "" for none, None for all before `through`."""
    manifests = all_manifests()
    last = (through or list(manifests)[-1]).split("_")[0]
    if last not in manifests:
        raise ReleaseError(f"--through {through!r}: unknown assignment; known: {', '.join(manifests)}")
    released = tuple(m for a, m in manifests.items() if course_order(a) <= course_order(last))
    if solutions is None:
        solved = {m.assignment for m in released if m.assignment != last}
    else:
        solved = {s.strip().split("_")[0] for s in solutions.split(",") if s.strip()}
    bad = solved - {m.assignment for m in released}
    if bad:
        raise ReleaseError(f"--solutions {', '.join(sorted(bad))}: not among the released assignments a0..{last}")
    return Plan(released, frozenset(solved))


def _owners() -> dict[str, tuple[Manifest, str]]:
    """Reference source (relative to the repo) -> (its assignment, its stub name)."""
    return {src: (m, name) for m in all_manifests().values() for name, src in m.files.items()}


def _shim(m: Manifest, stub_name: str) -> str:
    return (f"# Student repository: this module runs your assignments/{m.folder}/{stub_name}\n"
            f"# ({m.assignment}: {m.title}). Its reference arrives with the {m.assignment} solutions.\n"
            f"from scaletrain.student_code import run_student_file\n\n"
            f"run_student_file(globals(), {m.folder!r}, {stub_name!r})\n")


def _library_text(rel: str, owner: tuple[Manifest, str], plan: Plan) -> str:
    m, stub_name = owner
    state = plan.state(m.assignment)
    generated = outputs(m)
    if state == "solved":
        return generated[m.solution_dir() / stub_name]
    if state == "open" and rel.startswith("lib/"):
        return _shim(m, stub_name)
    if state == "open":  # a kernel file: the library loads kernels/ itself; the stub says what to write
        return generated[m.stub_dir() / stub_name]
    path = REPO / rel
    return render(path.read_text(), source=rel, comment=COMMENT[path.suffix], stub=True,
                  message=lambda func: f"{m.assignment} ({m.title}) is not released yet: `{func}` arrives with it")


def repo_files(folder: Path):
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not SKIP_PARTS & set(path.parts) and not path.name.endswith(".pyc") \
                and ".egg-info" not in str(path):
            yield path


def file_map(plan: Plan) -> dict[str, str | Path]:
    """Every file of the student repository: relative path -> text, or the Path to copy."""
    owners = _owners()
    files: dict[str, str | Path] = {}
    for top in ("lib", "kernels"):
        for path in repo_files(REPO / top):
            rel = path.relative_to(REPO).as_posix()
            files[rel] = _library_text(rel, owners[rel], plan) if rel in owners else path
    for m in plan.released:
        for path in repo_files(m.stub_dir()):
            files[path.relative_to(REPO).as_posix()] = path
    last = max(course_order(m.assignment) for m in plan.released)
    for path in sorted((REPO / "notebooks").glob("[0-9][0-9]*_*.ipynb")):
        if course_order(path.name) <= last:
            files[f"notebooks/{path.name}"] = path
    for path in sorted((REPO / "autograder").glob("*.py")):
        if path.name not in INSTRUCTOR_ONLY:
            files[f"autograder/{path.name}"] = path
    for path in repo_files(REPO / "autograder" / "probes"):  # what the worker runs: public by design
        files[path.relative_to(REPO).as_posix()] = path
    files[f"autograder/{PUBLIC_MANIFEST.name}"] = json.dumps(
        {"solved": sorted(plan.solved),
         "assignments": [public_record(m, stub_markers(m)) for m in plan.released]}, indent=1) + "\n"
    files["conftest.py"] = REPO / "conftest.py"
    files["pyproject.toml"] = _student_pyproject()
    files[".gitignore"] = REPO / ".gitignore"
    files["Makefile"] = TEMPLATES / "Makefile"
    files["README.md"] = _student_readme(plan)
    return files


def _student_pyproject() -> str:
    """The project file with the student repository's tests: the public tests (notebooks on demand)."""
    text = (REPO / "pyproject.toml").read_text()
    for pattern, new in ((r'^testpaths = \["tests", "notebooks"\]$', 'testpaths = ["assignments"]'),
                         (r'^(addopts = ".*) --nbval-lax(.*")$', r"\1\2")):
        text, count = re.subn(pattern, new, text, flags=re.M)
        if count != 1:
            raise ReleaseError(f"pyproject.toml: no line matches {pattern!r}; update _student_pyproject")
    return text


def _student_readme(plan: Plan) -> str:
    rows = []
    for m in plan.released:
        nb = next((p.name for p in (REPO / "notebooks").glob("[0-9][0-9]*_*.ipynb")
                   if course_order(p.name) == course_order(m.assignment)), "")
        state = "solution included in `lib/`" if m.assignment in plan.solved else "**yours to write**"
        rows.append(f"| {m.assignment} | {m.title} | `assignments/{m.folder}/` | `notebooks/{nb}` | "
                    f"{m.max_score:g} | {state} |")
    table = "\n".join(["| # | topic | folder | notebook | points | status |", "|---|---|---|---|---|---|", *rows])
    return (TEMPLATES / "README.md").read_text().replace("{{ASSIGNMENTS}}", table)


def build(out: Path, plan: Plan) -> dict[str, str | Path]:
    """Write the student repository into `out` (which must not exist or be empty)."""
    if out.exists() and any(out.iterdir()):
        raise ReleaseError(f"{out} exists and is not empty; give a new folder")
    files = file_map(plan)
    _write(out, files)
    return files


def grading_build(assignment: str, out: Path) -> Path:
    """What the worker grading `assignment` imports (autograder/untrusted.py): the student
    repository's library, kernels and public autograder for that release, so the graded regions
    run the submission and nothing of their reference exists there. World-readable: the worker
    may run as another account."""
    files = {rel: content for rel, content in file_map(make_plan(assignment)).items()
             if rel.startswith(("lib/", "kernels/", "autograder/"))}
    _write(out, files)
    for path in [out, *out.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return out


def _write(out: Path, files: dict[str, str | Path]) -> None:
    for rel, content in files.items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copy2(content, target)
        else:
            target.write_text(content)


def summary(out: Path, plan: Plan) -> str:
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    count = sum(1 for p in out.rglob("*") if p.is_file())
    released = ", ".join(m.assignment for m in plan.released)
    solved = ", ".join(sorted(plan.solved)) or "none"
    return (f"student repository in {out}: {count} files, {size / 1024:.0f} KiB; assignments {released}; "
            f"solutions included: {solved}; answers file per assignment: {ANSWERS_FILE}")


# ---------------------------------------------------------------- the leak check

MIN_LEAK_CHARS = 24   # shorter lines (`return out`, `}`) are shared by any two programs


def _normal(line: str) -> str:
    return " ".join(line.split())


def _given_lines(plan: Plan) -> set[str]:
    """Every normalized line of lib/ and kernels/ that ships by design: outside the SOLUTION
    regions, and inside those of solved assignments. A region line equal to one of them (the
    in-place copy back that the naive collectives share with the ring) gives nothing away."""
    owners = _owners()
    given = set()
    for top in ("lib", "kernels"):
        for path in repo_files(REPO / top):
            rel = path.relative_to(REPO).as_posix()
            if rel in owners:
                m, stub_name = owners[rel]
                folder = m.solution_dir() if plan.state(m.assignment) == "solved" else m.stub_dir()
                text = outputs(m)[folder / stub_name]
            else:
                text = path.read_text(errors="replace")
            given.update(_normal(line) for line in text.splitlines())
    return given


def solution_lines(plan: Plan) -> dict[str, str]:
    """Normalized line -> 'source:line' for every line inside a SOLUTION region of an assignment
    whose solution does not ship, unless it is given code elsewhere too (`_given_lines`)."""
    found: dict[str, str] = {}
    given = _given_lines(plan)
    for rel, (m, stub_name) in _owners().items():
        if plan.state(m.assignment) == "solved":
            continue
        comment = COMMENT[Path(rel).suffix]
        inside = False
        for i, line in enumerate((REPO / rel).read_text().splitlines(), 1):
            tag = line.strip()
            if tag.startswith(f"{comment} BEGIN SOLUTION") or tag.startswith(f"{comment} END SOLUTION"):
                inside = tag.startswith(f"{comment} BEGIN")
            elif inside and not tag.startswith(f"{comment} STUB:"):
                key = _normal(line)
                if len(key) >= MIN_LEAK_CHARS and key not in given:
                    found.setdefault(key, f"{rel}:{i}")
    return found


def _text_lines(path: Path) -> list[str]:
    """A file's lines as a reader sees them (a notebook's cell sources, not its JSON)."""
    text = path.read_text(errors="replace")
    if path.suffix == ".ipynb":
        cells = json.loads(text)["cells"]
        return [line for c in cells for line in "".join(c["source"]).splitlines()]
    return text.splitlines()


def find_leaks(out: Path, plan: Plan) -> list[str]:
    """'file:line: <text> (from source:line)' for every solution line found in the built repository."""
    secret = solution_lines(plan)
    leaks = []
    for path in repo_files(out):
        try:
            lines = _text_lines(path)
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError):
            continue
        for i, line in enumerate(lines, 1):
            key = _normal(line)
            if key in secret:
                leaks.append(f"{path.relative_to(out)}:{i}: {key[:80]} (from {secret[key]})")
    return leaks
