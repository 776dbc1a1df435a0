"""What an assignment is made of: its files, tasks, test groups, checks and planted breakages.

Each assignment has one suite, a package `autograder/suites/aN_topic/` split by role (`__init__.py`:
the `MANIFEST`; `names.py`: files and check names; `planted.py`; `inputs.py`: hidden inputs;
`judge.py`: group functions and verdicts); they are discovered here, so adding an assignment
touches no shared file.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTCOMES = ("passed", "failed", "error", "timeout", "not_run", "flagged")


@dataclass(frozen=True)
class Task:
    id: str                      # "2.1"
    title: str
    file: str                    # stub file the task is written in
    functions: tuple[str, ...] = ()  # functions whose SOLUTION regions belong to this task


@dataclass(frozen=True)
class Check:
    task: str
    name: str                    # unique within the assignment; the row in the score table
    points: float
    # Gradescope: visible | hidden | after_due_date | after_published; None: a hidden check, whose
    # visibility the package chooses (`gradescope aN --hidden-visibility`)
    visibility: str | None = None
    # value checks this one is granted with (`grade.with_values`): evidence (bytes, messages, memory,
    # call counts, compiling) and worked examples a table could answer earn points only when these
    # passed in the same run. Each is a check of a group on the same hardware that needs nothing itself.
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Group:
    """Checks that run together in one subprocess (e.g. one spawn of p ranks)."""
    name: str
    fn: str                      # "package.module:function", called with a GroupContext
    checks: tuple[Check, ...]
    timeout_s: float = 60.0
    needs_gpu: bool = False
    gpus: int = 1  # the CUDA GPUs a needs_gpu group uses (a2's NCCL ring: 2); with fewer, not_run
    # the group function runs in a process that never imports the submission; it reaches the
    # student's code only through ctx.remote / ctx.untrusted (autograder/untrusted.py). False is the
    # legacy path (the suite beside the student's code, as the sandbox account): the harness's own
    # tests use it; a suite may not (tests/test_assignments.py)
    trusted: bool = True


@dataclass(frozen=True)
class Planted:
    """A broken submission made from the solution by text replacements, and what it must get."""
    name: str
    file: str
    replace: tuple[str, str] | tuple[tuple[str, str], ...]  # (old, new), or several such pairs
    expect: dict[str, str | tuple[str, ...]]  # check name -> outcome, or the outcomes a race picks from
    groups: tuple[str, ...] = ()  # groups to grade (all when empty)
    timeout_s: float | None = None  # shorter group limit, for plants that are meant to hang

    def apply(self, text: str) -> str:
        """`text` (the solution's `file`) with every replacement made; ValueError naming the
        first text to replace that is not there."""
        for old, new in (self.replace,) if isinstance(self.replace[0], str) else self.replace:
            if old not in text:
                raise ValueError(f"text to replace not found in {self.file}: {old!r}")
            text = text.replace(old, new)
        return text

    def allowed(self, check: str) -> tuple[str, ...]:
        """The outcomes `check` may get: one, or several where a race between ranks decides which."""
        want = self.expect[check]
        return (want,) if isinstance(want, str) else tuple(want)


@dataclass(frozen=True)
class Manifest:
    assignment: str              # "a2"
    folder: str                  # "a2_collectives"
    title: str
    files: dict[str, str]        # stub name -> reference source, relative to the repo
    tasks: tuple[Task, ...]
    groups: tuple[Group, ...]
    forbidden: dict[str, tuple[str, ...]] = field(default_factory=dict)
    planted: tuple[Planted, ...] = ()
    # planted submissions that break a boundary a public test exercises (tests/test_hidden_covers_public.py)
    public_boundary: tuple[str, ...] = ()
    stub_markers: dict[str, tuple[str, ...]] = field(default_factory=dict)  # student repo only (submit)

    def __post_init__(self):
        names = [c.name for g in self.groups for c in g.checks]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"{self.assignment}: check names must be unique, repeated: {sorted(dupes)}")
        task_ids = {t.id for t in self.tasks}
        for g in self.groups:
            for c in g.checks:
                if c.task not in task_ids:
                    raise ValueError(f"{self.assignment}: check {c.name!r} names unknown task {c.task!r}")
        self._check_needs()
        for t in self.tasks:
            if t.file not in self.files:
                raise ValueError(f"{self.assignment}: task {t.id} names file {t.file!r} not in files")
        for p in self.planted:
            unknown = set(p.expect) - set(names)
            bad = {o for check in p.expect for o in p.allowed(check) if o not in OUTCOMES}
            if unknown or bad or p.file not in self.files:
                raise ValueError(f"{self.assignment}: planted {p.name!r} is inconsistent "
                                 f"(unknown checks {sorted(unknown)}, outcomes {sorted(bad)}, file {p.file!r})")

        missing = set(self.public_boundary) - {p.name for p in self.planted}
        if missing:
            raise ValueError(f"{self.assignment}: public_boundary names no planted submission: {sorted(missing)}")

    def _check_needs(self) -> None:
        """Every `needs` names a value check of this manifest that is graded in the same run as the
        check needing it (same `needs_gpu`) and needs nothing itself (no chains to resolve)."""
        on_gpu = {c.name: g.needs_gpu for g in self.groups for c in g.checks}
        needs = {c.name: c.needs for c in self.checks}
        for g in self.groups:
            for c in g.checks:
                bad = [n for n in c.needs if n == c.name or on_gpu.get(n) != g.needs_gpu or needs.get(n)]
                if bad:
                    raise ValueError(f"{self.assignment}: check {c.name!r} needs {bad}: not a value check of "
                                     "this assignment graded in the same run")

    @property
    def checks(self) -> tuple[Check, ...]:
        return tuple(c for g in self.groups for c in g.checks)

    @property
    def max_score(self) -> float:
        return sum(c.points for c in self.checks)

    def task(self, task_id: str) -> Task:
        return next(t for t in self.tasks if t.id == task_id)

    def stub_dir(self) -> Path:
        return REPO / "assignments" / self.folder

    def solution_dir(self) -> Path:
        return REPO / "solutions" / self.folder

    def suite_files(self) -> list[Path]:
        """The hidden suite's source files: every .py of its package `suites/<folder>/`."""
        return sorted((REPO / "autograder" / "suites" / self.folder).glob("*.py"))


PUBLIC_MANIFEST = Path(__file__).resolve().parent / "public_manifest.json"


def hidden_suites_present() -> bool:
    """True in the instructor repository and the grading package; False in a student repository,
    which carries only `public_manifest.json` (tasks, check names and points, no checks)."""
    return (Path(__file__).resolve().parent / "suites" / "__init__.py").is_file()


def public_record(m: Manifest, stub_markers: dict[str, list[str]]) -> dict:
    """What a student repository may know of an assignment: its files, tasks, check names and
    points, forbidden names, and the stub lines `submit` looks for. No group code, no plants."""
    return {"assignment": m.assignment, "folder": m.folder, "title": m.title, "files": m.files,
            "tasks": [vars(t) for t in m.tasks], "forbidden": m.forbidden, "stub_markers": stub_markers,
            "checks": [dict(vars(c), needs_gpu=g.needs_gpu) for g in m.groups for c in g.checks]}


def _from_public(r: dict) -> Manifest:
    by_gpu = {flag: tuple(Check(c["task"], c["name"], c["points"], c["visibility"])
                          for c in r["checks"] if c["needs_gpu"] == flag) for flag in (False, True)}
    groups = tuple(Group("hidden-gpu" if flag else "hidden", "", checks, needs_gpu=flag)
                   for flag, checks in by_gpu.items() if checks)
    tasks = tuple(Task(t["id"], t["title"], t["file"], tuple(t["functions"])) for t in r["tasks"])
    return Manifest(r["assignment"], r["folder"], r["title"], r["files"], tasks, groups,
                    forbidden={k: tuple(v) for k, v in r["forbidden"].items()},
                    stub_markers={k: tuple(v) for k, v in r["stub_markers"].items()})


def all_manifests() -> dict[str, Manifest]:
    """{"a0": Manifest, ...} from every package autograder/suites/aN_*/, sorted by assignment; in a
    student repository, from public_manifest.json."""
    if not hidden_suites_present():
        return {r["assignment"]: _from_public(r) for r in json.loads(PUBLIC_MANIFEST.read_text())["assignments"]}
    from autograder import suites

    found = {}
    for info in pkgutil.iter_modules(suites.__path__):
        module = importlib.import_module(f"autograder.suites.{info.name}")
        manifest = getattr(module, "MANIFEST", None)
        if isinstance(manifest, Manifest):
            found[manifest.assignment] = manifest
    # "a1b" sorts after "a1", before "a2"
    return dict(sorted(found.items(), key=lambda kv: (int(re.match(r"a(\d+)", kv[0]).group(1)), kv[0])))


def get_manifest(assignment: str) -> Manifest:
    manifests = all_manifests()
    key = assignment.split("_")[0]  # accept "a2" and "a2_collectives"
    if key not in manifests:
        known = ", ".join(f"{m.assignment} ({m.folder})" for m in manifests.values())
        raise KeyError(f"unknown assignment {assignment!r}; known: {known}")
    return manifests[key]
