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
- the public part of the autograder (public checks, `submit`, `list`, the worker with the probes
  of the released assignments), a student README and Makefile, and the release record the
  notebooks read (`lib/scaletrain/student_release.json`: which assignments' references are absent).
  Not: solutions/, hidden suites, planted submissions and the attacks on the grader they use,
  probes of unreleased assignments, ANSWERS.md, the selftest, the release/Gradescope/regrade
  tooling, CI.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from autograder.manifest import PUBLIC_MANIFEST, REPO, Manifest, all_manifests, public_record
from autograder.leaks import code_lines, find_in, secret_lines, text_lines
from autograder.public import stub_markers
from autograder.pyparse import parse_python
from autograder.release import ANSWERS_FILE, COMMENT, ReleaseError, course_order, outputs, render

TEMPLATES = Path(__file__).resolve().parent / "templates" / "student"
PROBES = REPO / "autograder" / "probes"
# the autograder's own modules ship (public checks, submit, the harness: nothing secret in them);
# the hidden suites (autograder/suites/, a package) and these instructor tools stay behind
INSTRUCTOR_ONLY = ("selftest.py", "student.py", "gradescope.py", "regrade.py", "gpu_check.py")
# what the suites' trusted side imports and nothing a student or the sandboxed worker needs: the
# attacks on the grader (a report forger among them) that the suites plant
GRADER_ONLY = ("attacks.py",)
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
    comment = COMMENT[Path(rel).suffix]
    if state == "solved":
        return _retitle(generated[m.solution_dir() / stub_name],
                        f"{comment} The reference of {m.assignment} ({m.title}), released with its solutions.")
    if state == "open" and rel.startswith("lib/"):
        return _shim(m, stub_name)
    if state == "open":  # a kernel file: the library loads kernels/ itself; the stub says what to write
        return _retitle(generated[m.stub_dir() / stub_name],
                        f"{comment} {m.assignment}'s stub: you write this kernel in assignments/{m.folder}/{stub_name}; "
                        f"its reference arrives with the {m.assignment} solutions.")
    text = render((REPO / rel).read_text(), source=rel, comment=comment, stub=True,
                  message=lambda func: f"{m.assignment} ({m.title}) is not released yet: `{func}` arrives with it")
    return _retitle(text, f"{comment} Part of {m.assignment} ({m.title}), not released yet: its graded parts are stubs.")


def _retitle(text: str, first_line: str) -> str:
    """`text` with its generated header (which names the course repository's source, and in the
    student repository would name this very file) replaced by a line true where it ships."""
    return first_line + "\n" + text.split("\n", 1)[1]


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
        if path.name not in INSTRUCTOR_ONLY + GRADER_ONLY:
            files[f"autograder/{path.name}"] = path
    for path in probe_files({m.folder for m in plan.released}):  # what the worker runs: public by design
        files[path.relative_to(REPO).as_posix()] = path
    files["lib/scaletrain/student_release.json"] = _release_record(plan)
    files[f"autograder/{PUBLIC_MANIFEST.name}"] = json.dumps(
        {"solved": sorted(plan.solved),
         "assignments": [public_record(m, stub_markers(m)) for m in plan.released]}, indent=1) + "\n"
    files["conftest.py"] = REPO / "conftest.py"
    files["pyproject.toml"] = _student_pyproject()
    files[".gitignore"] = REPO / ".gitignore"
    files["Makefile"] = TEMPLATES / "Makefile"
    files["README.md"] = _student_readme(plan)
    return files


def probe_files(folders: set[str]) -> list[Path]:
    """The probe modules the sandboxed worker runs for these assignment folders: each one's own
    probe, the package, `common` (`ctx.remote`'s default probe) and the probe modules they import.
    Not the probes of other assignments: those name what the hidden checks of unreleased work do."""
    wanted, todo = set(), ["__init__", "common", *sorted(folders)]
    while todo:
        name = todo.pop()
        path = PROBES / f"{name}.py"
        if name in wanted or not path.is_file():
            continue
        wanted.add(name)
        todo += _probe_imports(path)
    return [PROBES / f"{name}.py" for name in sorted(wanted)]


def _probe_imports(path: Path) -> list[str]:
    """The `autograder.probes.X` modules a probe file imports (X)."""
    names = []
    for node in ast.walk(parse_python(path.read_text(), path.name)):
        if isinstance(node, ast.ImportFrom) and node.module == "autograder.probes":
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autograder.probes."):
            names.append(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            names += [a.name.split(".")[2] for a in node.names if a.name.startswith("autograder.probes.")]
    return names


def _release_record(plan: Plan) -> str:
    """`scaletrain.student_code.missing_references`' source: the assignments whose reference the
    library lacks, so the notebooks skip a demo of the open assignment instead of running its stub."""
    record = {state: {m.assignment: m.folder for m in all_manifests().values() if plan.state(m.assignment) == state}
              for state in ("open", "unreleased")}
    return json.dumps(record, indent=1) + "\n"


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
    m = plan.released[-1]  # the open one: an example on a solved assignment would edit a file nobody grades
    first = m.tasks[0]
    fields = {"ASSIGNMENTS": table, "A": m.assignment, "FOLDER": m.folder, "WORKFLOW": _workflow(m),
              "FILES": ", ".join(f"`{name}`" for name in m.files), "MARK": _marker(first.id),
              "YOURS": _yours(m)}
    text = (TEMPLATES / "README.md").read_text()
    for key, value in fields.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def _workflow(m: Manifest) -> str:
    """The README's command block for assignment `m`, comments aligned."""
    first = m.tasks[0]
    rows = [(f"$EDITOR assignments/{m.folder}/{first.file}", "fill in the NotImplementedError parts"),
            (f".venv/bin/pytest assignments/{m.folder} -m {_marker(first.id)}",
             f"task {first.id}'s public tests"),
            (f".venv/bin/python -m autograder grade {m.assignment}", "every public test, one row per test, by task"),
            (f"$EDITOR assignments/{m.folder}/{ANSWERS_FILE}", "the written questions of the handout"),
            (f".venv/bin/python -m autograder submit {m.assignment}", f"writes {m.assignment}_submission.zip: upload it")]
    width = max(len(cmd) for cmd, _ in rows) + 2
    return "\n".join(f"{cmd.ljust(width)}# {why}" for cmd, why in rows)


def _marker(task_id: str) -> str:
    """The pytest marker of a task ("3.1" -> "task3_1"), as the root conftest.py registers it."""
    return f"task{task_id.replace('.', '_')}"


def _yours(m: Manifest) -> str:
    """How the library runs the student's files, said of `m`'s first library module; kernels
    are files the notebooks load instead of kernels/ (`IMPL = "student"`)."""
    module = next((src for src in m.files.values() if src.startswith("lib/") and src.endswith(".py")), None)
    if module is None:
        return (f"the kernels in `kernels/` are its stubs, and the notebooks run your files in "
                f"`assignments/{m.folder}/` instead")
    name = module[len("lib/"):-len(".py")].replace("/", ".")
    stub = next(stub for stub, src in m.files.items() if src == module)
    return (f"the library module it replaces runs *your* file (`{name}` is your "
            f"`assignments/{m.folder}/{stub}`), so later tasks and the library's commands use your code")


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
    plan = make_plan(assignment)
    probes = {p.relative_to(REPO).as_posix() for p in probe_files({plan.released[-1].folder})}
    files = {rel: content for rel, content in file_map(plan).items()
             if rel.startswith(("lib/", "kernels/", "autograder/"))
             and (not rel.startswith("autograder/probes/") or rel in probes)}
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


def _given_lines(plan: Plan) -> set[str]:
    """Every normalized line of code in lib/ and kernels/ that ships by design: outside the
    SOLUTION regions, and inside those of solved assignments. A region line equal to one of them
    (the in-place copy back that the naive collectives share with the ring) gives nothing away."""
    owners = _owners()
    given = set()
    for top in ("lib", "kernels"):
        for path in repo_files(REPO / top):
            rel = path.relative_to(REPO).as_posix()
            comment = COMMENT.get(path.suffix)
            if rel in owners:
                m, stub_name = owners[rel]
                folder = m.solution_dir() if plan.state(m.assignment) == "solved" else m.stub_dir()
                given |= code_lines(outputs(m)[folder / stub_name], comment)
            elif comment:
                given |= code_lines(path.read_text(errors="replace"), comment)
    return given


def solution_lines(plan: Plan) -> dict[str, str]:
    """Normalized line -> 'source:line' for every line inside a SOLUTION region of an assignment
    whose solution does not ship, unless it is given code elsewhere too (`_given_lines`)."""
    found: dict[str, str] = {}
    given = _given_lines(plan)
    for rel, (m, _) in _owners().items():
        if plan.state(m.assignment) != "solved":
            for key, where in secret_lines(rel, (REPO / rel).read_text(), COMMENT[Path(rel).suffix], given).items():
                found.setdefault(key, where)
    return found


def find_leaks(out: Path, plan: Plan) -> list[str]:
    """'file:line: <text> (from source:line)' for every solution line found in the built
    repository, inside any line of any file (autograder/leaks.py, the check `release` runs too)."""
    lines = []
    for path in repo_files(out):
        try:
            lines += [(path.relative_to(out).as_posix(), i, line) for i, line in enumerate(text_lines(path), 1)]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError):
            continue
    return find_in(lines, solution_lines(plan))
