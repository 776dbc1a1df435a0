"""`python -m autograder regrade aN --submissions DIR --out OUTDIR`: grade a whole class, one
submission at a time, and write one results.json per submission plus OUTDIR/scores.csv.

DIR is laid out one of two ways:
- a folder of folders, one per student and named after them: DIR/alice/memory.py, or with the
  assignment's folder in between as in solutions/ (DIR/alice/a0_memory/memory.py);
- Gradescope's "Export Submissions", unzipped: DIR/submission_metadata.yml and one
  DIR/submission_<id>/ folder per submission holding the uploaded files (either way, as above).
  The yml lists each submission's submitters; a student is named after them ("A + B" for a
  group), or after the folder where the yml does not say.

Each submission's results go to OUTDIR/<its folder name>/results.json (the folder name is unique
where student names need not be). A results.json already complete for the device is kept, so an
interrupted regrade resumes where it stopped; `--force` regrades everything. Gradescope's
containers have no GPU, so the GPU checks are graded by a second run on a GPU machine: with
`--cpu-results DIR2` (an earlier regrade's OUTDIR, or one folder per submission holding the
results.json Gradescope kept) only the groups that need a GPU run, the other checks are read from
DIR2/<folder name>/results.json, and each test's `extra_data.run` names the run it came from.
DIR2 may be OUTDIR itself: the GPU run then completes the CPU run's files in place.
"""

from __future__ import annotations

import csv
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from autograder.cli import submission_folder
from autograder.grade import UnusableSubmission, grade_assignment
from autograder.manifest import OUTCOMES, Manifest
from autograder.results import from_gradescope, to_gradescope, write_json
from autograder.runner import Result

METADATA = "submission_metadata.yml"


@dataclass(frozen=True)
class Submission:
    key: str          # its folder's name: OUTDIR/<key>/ and DIR2/<key>/
    student: str      # who submitted it, for the CSV
    folder: Path


def gradescope_names(yml: str) -> dict[str, str]:
    """submission folder -> its submitters' names, from Gradescope's submission_metadata.yml. Only
    the lines needed are read, so grading needs no YAML library: a top-level key per submission,
    and the `:name:` of each item of its `:submitters:` list (Ruby-style keys, as exported)."""
    names: dict[str, list[str]] = {}
    key, block = "", None  # block: the indentation of the current `:submitters:` key
    for line in yml.splitlines():
        body, indent = line.strip(), len(line) - len(line.lstrip())
        if not body or body.startswith("#"):
            continue
        if indent == 0:
            key, block = _unquote(body.removesuffix(":")), None
            names.setdefault(key, [])
        elif body == ":submitters:":
            block = indent
        elif block is not None and (indent > block or body.startswith("-")):
            if m := re.match(r"-?\s*:name:\s*(.+)", body):
                names[key].append(_unquote(m.group(1)))
        else:
            block = None
    return {k: " + ".join(v) for k, v in names.items() if v}


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) > 1 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if len(text) > 1 and text[0] == text[-1] == '"':
        return json.loads(text)
    return text


def find_submissions(root: Path) -> list[Submission]:
    """One Submission per folder of `root` (hidden folders and `__MACOSX` left out), sorted."""
    meta = root / METADATA
    names = gradescope_names(meta.read_text(errors="replace")) if meta.is_file() else {}
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))
    return [Submission(p.name, names.get(p.name, p.name), p) for p in folders]


def merge(manifest: Manifest, cpu: list[Result], gpu: list[Result]) -> list[Result]:
    """Every check of `manifest`, in its order: those of the groups that need a GPU from `gpu`,
    the others from `cpu`. KeyError names a check missing from the run that should have it."""
    on_gpu = {c.name for g in manifest.groups if g.needs_gpu for c in g.checks}
    cpu_by, gpu_by = {r.check.name: r for r in cpu}, {r.check.name: r for r in gpu}
    return [(gpu_by if c.name in on_gpu else cpu_by)[c.name] for c in manifest.checks]


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _finished(path: Path, manifest: Manifest, device: str) -> dict | None:
    """The results.json at `path` if an earlier regrade on `device` finished it: every check
    recorded and no grader error (a file cut short by an interruption is not valid JSON)."""
    payload = _read(path)
    if payload is None:
        return None
    extra = payload.get("extra_data", {})
    complete = {r.check.name for r in from_gradescope(payload, manifest)} == {c.name for c in manifest.checks}
    return payload if complete and extra.get("device") == device and not extra.get("harness_error") else None


def _cpu_checks(manifest: Manifest, path: Path) -> tuple[list[Result], str] | None:
    """(results of the checks that need no GPU, the device they ran on) from an earlier run's
    results.json; None when it is missing, broken or lacks one of them (grade everything then)."""
    payload = _read(path)
    if payload is None or payload.get("extra_data", {}).get("harness_error"):
        return None
    on_cpu = {c.name for g in manifest.groups if not g.needs_gpu for c in g.checks}
    results = [r for r in from_gradescope(payload, manifest) if r.check.name in on_cpu]
    if {r.check.name for r in results} != on_cpu:
        return None
    return results, payload.get("extra_data", {}).get("device", "unknown")


def _grade(manifest: Manifest, sub: Submission, device: str, cpu_results: Path | None) -> dict:
    """results.json for one submission; a grader failure is recorded, never raised, so one broken
    submission can't stop the class."""
    start = time.monotonic()
    earlier = _cpu_checks(manifest, cpu_results / sub.key / "results.json") if cpu_results else None
    groups = [g for g in manifest.groups if g.needs_gpu or earlier is None]
    try:
        fresh = grade_assignment(manifest, submission_folder(manifest, str(sub.folder), every=False), device,
                                 groups=tuple(g.name for g in groups)) if groups else []
        harness_error = ""
    except Exception as exc:  # noqa: BLE001 - record it and go on with the next student
        harness_error = f"{type(exc).__name__}: {exc}"
        fresh = [Result(manifest.assignment, c, "error", f"could not be graded: {harness_error}")
                 for g in groups for c in g.checks]
    results = merge(manifest, earlier[0], fresh) if earlier else fresh
    payload = to_gradescope(results, device=device, elapsed=time.monotonic() - start, harness_error=harness_error)
    graded_here = {r.check.name for r in fresh}
    for test in payload["tests"]:
        test["extra_data"]["run"] = device if test["extra_data"]["check"] in graded_here else earlier[1]
    payload["extra_data"].update(student=sub.student, submission=sub.key,
                                 cpu_results=str(cpu_results / sub.key / "results.json") if earlier else "")
    return payload


def csv_header(manifest: Manifest) -> list[str]:
    return ["student", "submission", *(f"task {t.id}" for t in manifest.tasks),
            "total", "max_total", "pending", *OUTCOMES, "seconds"]


def score_row(manifest: Manifest, sub: Submission, payload: dict) -> list:
    """One line of scores.csv: points per task, total of the checks that ran, points pending a GPU,
    outcome counts and the grading time (max_total + pending = the assignment's points)."""
    results = from_gradescope(payload, manifest)
    tasks = [sum(r.score for r in results if r.check.task == t.id) for t in manifest.tasks]
    ran = [r for r in results if r.outcome != "not_run"]
    return [sub.student, sub.key, *(f"{p:g}" for p in tasks), f"{sum(r.score for r in results):g}",
            f"{sum(r.check.points for r in ran):g}",
            f"{sum(r.check.points for r in results if r.outcome == 'not_run'):g}",
            *(sum(r.outcome == o for r in results) for o in OUTCOMES), payload.get("execution_time", 0)]


def _line(payload: dict) -> str:
    extra = payload.get("extra_data", {})
    pending = f", {extra['pending_points']:g} pending" if extra.get("pending_points") else ""
    error = f", GRADER ERROR: {extra['harness_error']}" if extra.get("harness_error") else ""
    return f"{payload['score']:g}/{payload['max_score']:g}{pending}{error}"


def regrade(manifest: Manifest, submissions: Path, out: Path, device: str, *, cpu_results: Path | None = None,
            force: bool = False, progress: Callable[[str], None] = lambda s: None) -> list[dict]:
    """Grade every submission in `submissions` (one at a time) into `out`; returns the payloads."""
    for folder, what in ((submissions, "submissions"), (cpu_results, "--cpu-results")):
        if folder is not None and not folder.is_dir():
            raise UnusableSubmission(f"{what} folder {folder} does not exist")
    subs = find_submissions(submissions)
    if not subs:
        raise UnusableSubmission(f"no submission folders in {submissions}")
    payloads, rows = [], []
    for i, sub in enumerate(subs, 1):
        path = out / sub.key / "results.json"
        payload = None if force else _finished(path, manifest, device)
        if payload is None:
            payload = _grade(manifest, sub, device, cpu_results)
            write_json(path, payload)
            progress(f"[{i}/{len(subs)}] {sub.student}: {_line(payload)} ({payload['execution_time']:.1f} s)")
        else:
            progress(f"[{i}/{len(subs)}] {sub.student}: {_line(payload)} (kept from an earlier run)")
        payloads.append(payload)
        rows.append(score_row(manifest, sub, payload))
    with open(out / "scores.csv", "w", newline="") as f:
        csv.writer(f).writerows([csv_header(manifest), *rows])
    return payloads
