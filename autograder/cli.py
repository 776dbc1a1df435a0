"""`python -m autograder ...`: grade, release, selftest, list."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from autograder.grade import UnusableSubmission, grade_assignment
from autograder.manifest import REPO, all_manifests, get_manifest
from autograder.release import ReleaseError, release
from autograder.results import summarize, table, to_gradescope, write_json
from autograder.runner import Result

EXIT_OK, EXIT_FAILED, EXIT_HARNESS, EXIT_INCOMPLETE = 0, 1, 2, 3

DESCRIPTION = """\
Grade your assignment, or (instructors) release stubs and check the grader.

  python -m autograder grade a0                 grade assignments/a0_memory/ (your working copy)
  python -m autograder grade all                grade every assignment under assignments/
  python -m autograder grade a2 --submission DIR   grade another folder
  python -m autograder list                     assignments, tasks and points

Outcomes: passed (the only one that scores), failed (wrong answer or not implemented yet),
error (your code crashed), timeout (infinite loop or deadlock), not_run (needs a GPU that this
machine lacks: the points are not lost, they are graded on a GPU machine), flagged (used
something the assignment forbids). The score table names the task and the reason for each row;
results.json is the file to upload.

Exit codes: 0 all passed, 1 something failed, 2 the grader could not run (unknown assignment,
missing folder or file), 3 all gradable checks passed but GPU checks were not run."""


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _exit_code(results: list[Result]) -> int:
    if any(r.outcome == "error" and "is missing from" in r.reason for r in results):
        return EXIT_HARNESS
    if any(r.outcome not in ("passed", "not_run") for r in results):
        return EXIT_FAILED
    return EXIT_INCOMPLETE if any(r.outcome == "not_run" for r in results) else EXIT_OK


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


def cmd_grade(args) -> int:
    start, results, harness_error, code = time.monotonic(), [], "", EXIT_HARNESS
    device = "unknown"
    try:
        device = _device(args.device)
        manifests = list(all_manifests().values()) if args.assignment == "all" else [get_manifest(args.assignment)]
        if args.submission is not None and not Path(args.submission).is_dir():
            raise UnusableSubmission(f"submission folder {args.submission} does not exist")
        for m in manifests:
            results += grade_assignment(m, submission_folder(m, args.submission, args.assignment == "all"), device,
                                        progress=lambda s: print(s, file=sys.stderr))
        print(table(results))
        print(summarize(results))
        code = _exit_code(results)
    except (KeyError, UnusableSubmission) as exc:
        harness_error = str(exc).strip("'\"")
        print(f"error: {harness_error}", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - report, never hide, a broken harness
        harness_error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        print("error: the grader itself failed; please report this to the course staff", file=sys.stderr)
    finally:
        write_json(Path(args.json), to_gradescope(results, device=device, elapsed=time.monotonic() - start,
                                                  harness_error=harness_error))
        print(f"wrote {args.json}", file=sys.stderr)
    return code


def cmd_release(args) -> int:
    try:
        problems = release(check=args.check)
    except ReleaseError as exc:
        print(f"release error: {exc}", file=sys.stderr)
        return EXIT_HARNESS
    if args.check:
        if problems:
            print("stale generated files (run `python -m autograder release`):\n" + "\n".join(problems))
            return EXIT_FAILED
        print("release --check: every stub and solution matches its source")
        return EXIT_OK
    print("\n".join(problems) or "release: everything already up to date")
    return EXIT_OK


def cmd_selftest(args) -> int:
    from autograder.selftest import run_selftest

    names = list(all_manifests()) if args.assignment == "all" else [args.assignment]
    ok = True
    for name in names:
        for case in run_selftest(name, device=_device(args.device), progress=lambda s: print(s, file=sys.stderr)):
            ok &= case.ok
            print(f"{'PASS' if case.ok else 'FAIL'}  {case.case}" + (f"\n      {case.detail}" if case.detail else ""))
    return EXIT_OK if ok else EXIT_FAILED


def cmd_list(args) -> int:
    for m in all_manifests().values():
        print(f"{m.assignment}  {m.folder}  {m.title}  ({m.max_score:g} points)")
        for t in m.tasks:
            pts = sum(c.points for c in m.checks if c.task == t.id)
            print(f"    task {t.id}  {t.title}  [{t.file}]  {pts:g} points")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="grade a submission and write results.json")
    g.add_argument("assignment", help="a0, a1, ... or all")
    g.add_argument("--submission", help="folder with your files (default: assignments/aN_topic/; "
                                        "with 'all', the folder that holds the aN_topic folders)")
    g.add_argument("--json", default="results.json", help="where to write results (default: ./results.json)")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    g.set_defaults(func=cmd_grade)
    r = sub.add_parser("release", help="(instructors) regenerate stubs and solutions from lib/ and kernels/")
    r.add_argument("--check", action="store_true", help="write nothing; fail with a diff if anything is stale")
    r.set_defaults(func=cmd_release)
    s = sub.add_parser("selftest", help="(instructors) solutions full marks, stubs zero, planted breakages caught")
    s.add_argument("assignment", nargs="?", default="all")
    s.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    s.set_defaults(func=cmd_selftest)
    sub.add_parser("list", help="assignments, tasks and points").set_defaults(func=cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
