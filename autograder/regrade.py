"""`python -m autograder regrade aN --submissions DIR --out OUTDIR [--package ZIP | --seed N]`: grade
a whole class, one submission at a time, on the hidden inputs Gradescope graded on, and write one
results.json per submission, OUTDIR/scores.csv (a row per student) and OUTDIR/histogram.png.

The hidden inputs are drawn from the grading seed, and Gradescope's is the package's (its
package.json), not the public default: `--package aN_autograder.zip` reads it, `--seed N` names
one, and with neither a warning says the scores may differ from Gradescope's. The seed reaches the
trusted runners through $AUTOGRADER_SEED, set for the regrade only, and is recorded in every
results.json (`extra_data.seed`) and in scores.csv's `seed` column.

DIR is laid out one of three ways:
- a folder of folders, one per student and named after them: DIR/alice/memory.py, or with the
  assignment's folder in between as in solutions/ (DIR/alice/a0_memory/memory.py);
- Gradescope's "Export Submissions", unzipped: DIR/submission_metadata.yml and one
  DIR/submission_<id>/ folder per submission holding the uploaded files (either way, as above);
- the folder the export was unzipped into: DIR/assignment_<id>_export/ holding the above.
Anything else (an empty folder, a single submission's files, an export without its yml) is refused
with the reason: grading it as a folder of folders would give the class one "student" at 0.
The yml names each submission's submitters (name, SID, email) and its time; every member of a
group gets a row of scores.csv, with lateness in hours against `--due`.

Each submission's results go to OUTDIR/<its folder name>/results.json (the folder name is unique
where student names need not be). A results.json already complete for the device and the seed is
kept, so an interrupted regrade (Ctrl-C: exit 130) resumes where it stopped; `--force` regrades
everything. Gradescope's containers have no GPU, so the GPU checks are graded by a second run on a
GPU machine: with `--cpu-results DIR2` (an earlier regrade's OUTDIR, or one folder per submission
holding the results.json Gradescope kept) only the groups that need a GPU run, the other checks are
read from DIR2/<folder name>/results.json, and each test's `extra_data.run` names the run it came
from. DIR2 may be OUTDIR itself: the GPU run then completes the CPU run's files in place.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import statistics
import sys
import time
import zipfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, ContextManager

from autograder import zygote
from autograder.checks import SEED_ENV, grading_seed
from autograder.invocation import EXIT_FAILED, EXIT_HARNESS, EXIT_OK, choose_device, submission_folder
from autograder.grade import UnusableSubmission, grade_assignment, shared_build
from autograder.manifest import OUTCOMES, REPO, Manifest, get_manifest
from autograder.package_info import PackageError, PackageInfo
from autograder.results import from_gradescope, to_gradescope, write_json
from autograder.runner import Result

METADATA = "submission_metadata.yml"
PACKAGE_JSON = "package.json"
EXPORT_FOLDER = re.compile(r"assignment_\d+_export")   # the top folder of Gradescope's export zip
HISTOGRAM = "histogram.png"
EXIT_INTERRUPTED = 130                                 # the shell's code for a Ctrl-C


class Interrupted(Exception):
    """Ctrl-C during a regrade: what was graded stays in OUTDIR, and the same command resumes."""

    def __init__(self, done: int, total: int):
        super().__init__(f"interrupted after {done} of {total} submissions; rerun the same command to resume")


@dataclass(frozen=True)
class Submitter:
    name: str
    sid: str = ""
    email: str = ""


@dataclass(frozen=True)
class Submission:
    key: str                            # its folder's name: OUTDIR/<key>/ and DIR2/<key>/
    folder: Path
    submitters: tuple[Submitter, ...]   # the yml's, or one named after the folder
    created_at: str = ""                # the yml's `:created_at:`, ISO 8601; "" outside an export

    @property
    def student(self) -> str:
        """Who submitted it, in progress lines and results.json ("A + B" for a group)."""
        return " + ".join(s.name for s in self.submitters)


# ---------------------------------------------------------------- Gradescope's submission_metadata.yml

@dataclass
class Metadata:
    submitters: list[dict[str, str]]
    created_at: str = ""


_KEY = re.compile(r"(-\s*)?:(\w+):\s*(.*)")   # `- :name: Ada`, `:sid: '100'` (Ruby-symbol keys, as exported)


def gradescope_metadata(yml: str) -> dict[str, Metadata]:
    """submission folder -> its submitters (name, sid, email) and `:created_at:`, from Gradescope's
    submission_metadata.yml. Only these lines are read, so grading needs no YAML library: a
    top-level key per submission, its own `:created_at:` (not a `:history:` item's), and the items of
    its `:submitters:` list; `:results:` and anything else nested is skipped."""
    entries: dict[str, Metadata] = {}
    entry, level, in_submitters = None, None, False  # level: the indentation of a submission's keys
    for line in yml.splitlines():
        body, indent = line.strip(), len(line) - len(line.lstrip())
        if not body or body.startswith(("#", "---", "...")):  # comments, YAML's document markers
            continue
        if indent == 0:
            entry = entries.setdefault(_unquote(body.removesuffix(":")), Metadata([]))
            level, in_submitters = None, False
            continue
        level = indent if level is None else level
        m = _KEY.fullmatch(body)
        if entry is None or indent < level or not m:
            continue
        item, key, value = bool(m.group(1)), m.group(2), _unquote(m.group(3))
        if indent == level and not item:
            in_submitters = key == "submitters"
            entry.created_at = value if key == "created_at" else entry.created_at
        elif in_submitters and item:
            entry.submitters.append({key: value})
        elif in_submitters and entry.submitters and indent > level:
            entry.submitters[-1].setdefault(key, value)
    return entries


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) > 1 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if len(text) > 1 and text[0] == text[-1] == '"':
        return json.loads(text)
    return text


def parse_time(text: str, what: str) -> datetime:
    """An ISO 8601 time with its UTC offset (Gradescope writes `2026-11-20 10:00:00.123456000 -08:00`).
    A time without one is refused: lateness would silently shift by the machine's time zone."""
    try:
        when = datetime.fromisoformat(re.sub(r"\s*UTC$", "+00:00", text.strip()))
    except ValueError:
        raise UnusableSubmission(f"{what} {text!r} is not an ISO 8601 time: "
                                 "write it as 2026-11-20T23:59-08:00") from None
    if when.tzinfo is None:
        raise UnusableSubmission(f"{what} {text!r} has no UTC offset: write it as {when.isoformat()}-08:00 "
                                 "(your time zone's offset) or with Z for UTC")
    return when


def hours_late(created_at: str, due: datetime | None) -> str:
    """scores.csv's `late`: hours after `due` (0 when on time); empty without --due or a time."""
    if due is None or not created_at:
        return ""
    late = (parse_time(created_at, "submission time") - due).total_seconds() / 3600
    return f"{late:.2f}" if late > 0 else "0"


# ---------------------------------------------------------------- where the submissions are

def _folders(root: Path) -> list[Path]:
    """The visible subfolders of `root` (hidden folders, `__MACOSX` and `__pycache__` left out), sorted."""
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))


EXPECTED = ("expected Gradescope's export (submission_metadata.yml beside one submission_<id>/ folder each), "
            "the folder holding its assignment_<id>_export/, or one folder per student")


def locate(root: Path, m: Manifest) -> Path:
    """The folder whose subfolders are the submissions: `root` itself, or the one
    assignment_<id>_export/ inside it. A folder that is neither an export nor a folder of
    submissions is refused with the reason, never graded as one student at 0."""
    if not root.is_dir():
        raise UnusableSubmission(f"--submissions {root} is not a folder: {EXPECTED}")
    if (root / METADATA).is_file():
        return root
    folders = _folders(root)
    exports = [p for p in folders if EXPORT_FOLDER.fullmatch(p.name) or (p / METADATA).is_file()]
    if len(exports) > 1:
        raise UnusableSubmission(f"{root} holds {len(exports)} exports ({', '.join(p.name for p in exports)}): "
                                 "point --submissions at one of them")
    if exports and not (exports[0] / METADATA).is_file():
        raise UnusableSubmission(f"{exports[0]} has no {METADATA}: unzip Gradescope's export whole "
                                 f"(\"Export Submissions\"), then point --submissions at it; {EXPECTED}")
    if exports:
        return exports[0]
    loose = sorted(p.name for p in root.iterdir()
                   if p.is_file() and (p.suffix in (".py", ".ipynb") or p.name in m.files))
    if loose or any(p.name == m.folder for p in folders):
        what = ", ".join(loose) or f"{m.folder}/"
        raise UnusableSubmission(f"{root} holds {what} itself: that is one submission (grade it with `grade "
                                 f"{m.assignment} --submission {root}`); {EXPECTED}")
    if not folders:
        raise UnusableSubmission(f"{root} holds no submission folders: {EXPECTED}")
    return root


def find_submissions(root: Path, m: Manifest) -> list[Submission]:
    """One Submission per submission folder found from `root` (see `locate`), sorted by folder."""
    export = locate(root, m)
    meta = export / METADATA
    entries = gradescope_metadata(meta.read_text(errors="replace")) if meta.is_file() else {}
    subs = []
    for p in _folders(export):
        entry = entries.get(p.name, Metadata([]))
        people = tuple(Submitter(s.get("name") or p.name, s.get("sid", ""), s.get("email", ""))
                       for s in entry.submitters) or (Submitter(p.name),)
        when = parse_time(entry.created_at, f"{meta}: {p.name}'s :created_at:").isoformat() if entry.created_at else ""
        subs.append(Submission(p.name, p, people, when))
    return subs


# ---------------------------------------------------------------- the grading seed

def read_package(path: Path, m: Manifest, warn: Callable[[str], None]) -> PackageInfo:
    """The package.json of a Gradescope package zip: the seed Gradescope graded with. Refused when
    it is missing or for another assignment; a warning when the package's suite is not this
    repository's (the regrade grades with this repository's checks)."""
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            if PACKAGE_JSON not in names:
                raise PackageError(_no_package_json(path, z.read("run_autograder").decode()
                                                    if "run_autograder" in names else ""))
            info = PackageInfo.from_json(z.read(PACKAGE_JSON).decode(), f"{path}:{PACKAGE_JSON}")
            ours = {path.relative_to(REPO).as_posix(): path.read_bytes() for path in m.suite_files()}
            theirs = {name: z.read(name) for name in names if name.startswith(f"autograder/suites/{m.folder}/")}
    except (OSError, zipfile.BadZipFile) as exc:
        raise PackageError(f"--package {path}: {exc}; "
                           f"pass the zip that `gradescope {m.assignment} -o ZIP` wrote") from None
    if info.assignment != m.assignment:
        raise PackageError(f"--package {path} grades {info.assignment}, not {m.assignment}: pass "
                           f"{m.assignment}'s package, or regrade {info.assignment}")
    if theirs and theirs != ours:
        warn(f"warning: {path}'s autograder/suites/{m.folder} differs from this repository's: the seed is the "
             "package's, the checks are this repository's")
    return info


def _no_package_json(path: Path, run_autograder: str) -> str:
    """Why a package without package.json can't be used, and its fix (an older package baked its seed
    into run_autograder: that seed can still be named with --seed)."""
    old = re.search(r"AUTOGRADER_SEED:-(\d+)", run_autograder)
    hint = f"; this one's run_autograder grades with seed {old.group(1)}: pass --seed {old.group(1)}" if old else ""
    return (f"--package {path} has no {PACKAGE_JSON}: it was built by an older grader. Rebuild the package "
            f"with this version (`python -m autograder gradescope aN -o ZIP`){hint}")


def choose_seed(m: Manifest, package: str | None, seed: int | None, warn: Callable[[str], None]) -> int:
    """The grading seed: the package's, else --seed, else the default with one warning line (its
    hidden inputs are not the ones Gradescope graded on)."""
    if package:
        return read_package(Path(package), m, warn).seed
    if seed is not None:
        return seed
    default = grading_seed()
    source = f"${SEED_ENV}" if SEED_ENV in os.environ else "the public default"
    warn(f"warning: no --package or --seed: grading on seed {default} ({source}), whose hidden inputs are not "
         f"Gradescope's; pass --package {m.assignment}_autograder.zip to grade on the package's")
    return default


@contextlib.contextmanager
def seeded(seed: int):
    """$AUTOGRADER_SEED = `seed` inside the block, as before it after: the trusted runners (and
    results.json) read it when they draw the hidden inputs."""
    before = os.environ.get(SEED_ENV)
    os.environ[SEED_ENV] = str(seed)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SEED_ENV, None)
        else:
            os.environ[SEED_ENV] = before


# ---------------------------------------------------------------- grading

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


def _finished(path: Path, manifest: Manifest, device: str, seed: int) -> dict | None:
    """The results.json at `path` if an earlier regrade on `device` and `seed` finished it: every
    check recorded and no grader error (one graded on other hidden inputs is graded again)."""
    payload = _read(path)
    if payload is None:
        return None
    extra = payload.get("extra_data", {})
    complete = {r.check.name for r in from_gradescope(payload, manifest)} == {c.name for c in manifest.checks}
    same_run = extra.get("device") == device and extra.get("seed") == seed
    return payload if complete and same_run and not extra.get("harness_error") else None


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


def _grade(manifest: Manifest, sub: Submission, device: str, cpu_results: Path | None, build: Path | None) -> dict:
    """results.json for one submission; a grader failure is recorded, never raised, so one broken
    submission can't stop the class."""
    start = time.monotonic()
    earlier = _cpu_checks(manifest, cpu_results / sub.key / "results.json") if cpu_results else None
    groups = [g for g in manifest.groups if g.needs_gpu or earlier is None]
    try:
        fresh = grade_assignment(manifest, submission_folder(manifest, str(sub.folder), every=False), device,
                                 groups=tuple(g.name for g in groups), build=build) if groups else []
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
    payload["extra_data"].update(student=sub.student, submission=sub.key, submitted_at=sub.created_at,
                                 cpu_results=str(cpu_results / sub.key / "results.json") if earlier else "")
    return payload


# ---------------------------------------------------------------- scores.csv and the histogram

def task_points(manifest: Manifest, payload: dict) -> list[float]:
    """Points per task of `manifest`, in its order, from a results.json."""
    results = from_gradescope(payload, manifest)
    return [sum(r.score for r in results if r.check.task == t.id) for t in manifest.tasks]


def csv_header(manifest: Manifest) -> list[str]:
    return ["name", "sid", "email", "submission", "submitted_at", "late", "total", "max",
            *(t.id for t in manifest.tasks), "pending", *OUTCOMES, "seconds", "seed"]


def score_rows(manifest: Manifest, sub: Submission, payload: dict, due: datetime | None) -> list[list]:
    """scores.csv's lines for one submission, one per submitter (a group's members share its scores):
    who, when and how late; total of the checks that ran and their points (max); points per task;
    points pending a GPU; outcome counts; grading time; the seed its hidden inputs came from."""
    results = from_gradescope(payload, manifest)
    ran = [r for r in results if r.outcome != "not_run"]
    scores = [f"{sum(r.score for r in results):g}", f"{sum(r.check.points for r in ran):g}",
              *(f"{p:g}" for p in task_points(manifest, payload)),
              f"{sum(r.check.points for r in results if r.outcome == 'not_run'):g}",
              *(sum(r.outcome == o for r in results) for o in OUTCOMES), payload.get("execution_time", 0),
              payload.get("extra_data", {}).get("seed", "")]
    when = [sub.key, sub.created_at, hours_late(sub.created_at, due)]
    return [[s.name, s.sid, s.email, *when, *scores] for s in sub.submitters]


def histogram_figure(manifest: Manifest, points: list[list[float]], seed: int):
    """One subplot per task and one for the total: how many students got how many points, and the
    median. `points` holds one list per student (task points in the manifest's order)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    caps = [sum(c.points for c in manifest.checks if c.task == t.id) for t in manifest.tasks]
    panels = [(f"task {t.id}: {_short(t.title)}", cap, [p[i] for p in points])
              for i, (t, cap) in enumerate(zip(manifest.tasks, caps))]
    panels.append(("total", sum(caps), [sum(p) for p in points]))
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(3.6 * cols, 2.8 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    for k, (title, cap, values) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, k + 1)
        ax.hist(values, bins=_bins(cap), color="tab:blue", edgecolor="white")
        ax.set_title(f"{title}\nmedian {statistics.median(values):g}" if values else title, fontsize=9)
        ax.set_xlabel(f"points (of {cap:g})", fontsize=8)
        ax.set_ylabel("students", fontsize=8)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    students = f"{len(points)} student{'s' * (len(points) != 1)}"
    fig.suptitle(f"{manifest.assignment}: {students}, hidden inputs of seed {seed}")
    return fig


def _bins(cap: float) -> list[float]:
    """Bar edges: one bar per point, centred on it, up to 20 points; else 20 equal bars."""
    if cap <= 20:
        return [i - 0.5 for i in range(int(cap) + 2)]
    return [cap * i / 20 for i in range(21)]


def _short(title: str, width: int = 28) -> str:
    return title if len(title) <= width else title[:width - 1].rstrip() + "…"


def write_scores(out: Path, manifest: Manifest, graded: list[tuple[Submission, dict]], due: datetime | None,
                 seed: int) -> None:
    """OUTDIR/scores.csv and, beside it, the class histogram (a student per scores.csv row)."""
    rows = [row for sub, payload in graded for row in score_rows(manifest, sub, payload, due)]
    with open(out / "scores.csv", "w", newline="") as f:
        csv.writer(f).writerows([csv_header(manifest), *rows])
    points = [task_points(manifest, payload) for sub, payload in graded for _ in sub.submitters]
    histogram_figure(manifest, points, seed).savefig(out / HISTOGRAM, dpi=100)


def _line(payload: dict) -> str:
    extra = payload.get("extra_data", {})
    pending = f", {extra['pending_points']:g} pending" if extra.get("pending_points") else ""
    error = f", GRADER ERROR: {extra['harness_error']}" if extra.get("harness_error") else ""
    return f"{payload['score']:g}/{payload['max_score']:g}{pending}{error}"


def regrade(manifest: Manifest, submissions: Path, out: Path, device: str, *, seed: int | None = None,
            due: datetime | None = None, cpu_results: Path | None = None, force: bool = False,
            progress: Callable[[str], None] = lambda s: None,
            preload: Callable[[], ContextManager] = contextlib.nullcontext) -> list[dict]:
    """Grade every submission found from `submissions` (one at a time) into `out` on the hidden
    inputs of `seed` (default: $AUTOGRADER_SEED or the public one); returns the payloads. Ctrl-C
    raises Interrupted, saying how far it got; what was graded is kept for the next run. `preload`
    (the CLI's: `zygote.preloaded`) is entered once the input is known to be usable and the seed set."""
    if cpu_results is not None and not cpu_results.is_dir():
        raise UnusableSubmission(f"--cpu-results folder {cpu_results} does not exist")
    subs = find_submissions(submissions, manifest)
    seed = grading_seed() if seed is None else seed
    graded: list[tuple[Submission, dict]] = []
    try:
        with seeded(seed), preload(), shared_build(manifest) as build:
            for i, sub in enumerate(subs, 1):
                graded.append((sub, _grade_or_keep(manifest, sub, out, device, seed, cpu_results, force, build,
                                                   lambda s: progress(f"[{i}/{len(subs)}] {sub.student}: {s}"))))
    except KeyboardInterrupt:  # counted on disk: Ctrl-C may land between a results.json and its progress line
        kept = sum(_finished(out / s.key / "results.json", manifest, device, seed) is not None for s in subs)
        raise Interrupted(kept, len(subs)) from None
    write_scores(out, manifest, graded, due, seed)
    return [payload for _, payload in graded]


def _grade_or_keep(manifest: Manifest, sub: Submission, out: Path, device: str, seed: int, cpu_results: Path | None,
                   force: bool, build: Path | None, progress: Callable[[str], None]) -> dict:
    """One submission's results.json: an earlier run's when it finished on this device and seed,
    else graded now and written whole before the next submission starts."""
    path = out / sub.key / "results.json"
    payload = None if force else _finished(path, manifest, device, seed)
    if payload is not None:
        progress(f"{_line(payload)} (kept from an earlier run)")
        return payload
    payload = _grade(manifest, sub, device, cpu_results, build)
    write_json(path, payload)
    progress(f"{_line(payload)} ({payload['execution_time']:.1f} s)")
    return payload


# ---------------------------------------------------------------- the command

def command(args) -> int:
    """`regrade`'s exit status: 0 done, 1 a grader error in some submission, 2 unusable input
    (refused with the reason), 130 interrupted (the same command resumes)."""
    say = lambda s: print(s, file=sys.stderr)  # noqa: E731
    start, out = time.monotonic(), Path(args.out)
    try:
        manifest = get_manifest(args.assignment)
        seed = choose_seed(manifest, args.package, args.seed, say)
        due = parse_time(args.due, "--due") if args.due else None
        payloads = regrade(manifest, Path(args.submissions), out, choose_device(args.device), seed=seed, due=due,
                           cpu_results=Path(args.cpu_results) if args.cpu_results else None,
                           force=args.force, progress=say, preload=zygote.preloaded)
    except (KeyError, UnusableSubmission, PackageError) as exc:
        say(f"error: {str(exc).strip(chr(39) + chr(34))}")
        return EXIT_HARNESS
    except Interrupted as exc:
        say(str(exc))
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # before the search for submissions ended, or once the last one was graded
        say("interrupted; rerun the same command to resume")
        return EXIT_INTERRUPTED
    print(f"{len(payloads)} submissions in {time.monotonic() - start:.1f} s on seed {seed}; "
          f"wrote {out / 'scores.csv'} and {out / HISTOGRAM}")
    return EXIT_FAILED if any(p["extra_data"]["harness_error"] for p in payloads) else EXIT_OK
