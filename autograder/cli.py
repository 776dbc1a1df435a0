"""`python -m autograder ...`: grade, release, selftest, list."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

from autograder import zygote
from autograder.invocation import (EXIT_FAILED, EXIT_HARNESS, EXIT_INCOMPLETE, EXIT_OK, choose_device,  # noqa: F401
                                   submission_folder)
from autograder.grade import UnusableSubmission, check_library_origin, grade_assignment
from autograder.manifest import REPO, all_manifests, get_manifest, hidden_suites_present
from autograder import package_info
from autograder.package_info import TORCH_BUILDS, VISIBILITIES, PackageError
from autograder.release import LEAK, ReleaseError, release
from autograder.results import summarize, table, to_gradescope, write_json
from autograder.runner import Result
from autograder.untrusted import BUILD_ENV


DESCRIPTION = """\
Grade your assignment, or (instructors) release stubs and check the grader.

  python -m autograder grade a0                 grade assignments/a0_memory/ (your working copy)
  python -m autograder grade all                grade every assignment under assignments/
  python -m autograder grade a2 --submission DIR   grade another folder
  python -m autograder submit a0                write a0_submission.zip: the file to upload
  python -m autograder list                     assignments, tasks and points

Outcomes: passed (the only one that scores), failed (wrong answer or not implemented yet),
error (your code crashed), timeout (infinite loop or deadlock), not_run (needs a GPU that this
machine lacks: the points are not lost, they are graded on a GPU machine), flagged (used
something the assignment forbids). The score table names the task and the reason for each row.
Upload the zip that `submit` writes (your files and written answers); results.json, where `grade`
writes one, is that run's report, not a submission.

Exit codes: 0 all passed, 1 something failed, 2 the grader could not run (unknown assignment,
missing folder or file, --device cuda without a GPU), 3 all gradable checks passed but GPU checks
were not run."""


def exit_code(results: list[Result]) -> int:
    """The CLI's exit status for a run's results: 0 all passed, 1 something failed, 2 a missing
    file (the input was unusable), 3 incomplete (GPU checks not run)."""
    if any(r.outcome == "error" and "is missing from" in r.reason for r in results):
        return EXIT_HARNESS
    if any(r.outcome not in ("passed", "not_run") for r in results):
        return EXIT_FAILED
    return EXIT_INCOMPLETE if any(r.outcome == "not_run" for r in results) else EXIT_OK


def _sandbox_choice(args) -> None:
    """--unsafe-no-sandbox reaches every process the grader starts; without it, as root, an account
    that can't run student code is an error here (exit 2), before anything is graded."""
    from autograder import sandbox

    if getattr(args, "unsafe_no_sandbox", False):
        os.environ[sandbox.UNSAFE_ENV] = "1"
        sandbox._account.cache_clear()
    sandbox.worker_account()


def _use_package(path: Path, assignment: str) -> str:
    """Grade as the package at `path` (its package.json) was built to: its seed, its grading build
    beside it; the visibility it gives the checks a suite keeps hidden."""
    info = package_info.load(path)
    info.check_assignment(assignment)
    info.apply()
    os.environ[BUILD_ENV] = str(path.resolve().parent / package_info.GRADING_BUILD)
    return info.hidden_visibility


def cmd_grade(args) -> int:
    from autograder import sandbox
    from autograder.context import clip
    from autograder.grade import ignored_files

    start, results, harness_error, code = time.monotonic(), [], "", EXIT_HARNESS
    device, notes, broken = "unknown", [], []
    hidden_visibility = "visible"
    try:
        check_library_origin()
        _sandbox_choice(args)
        if getattr(args, "package", None):
            hidden_visibility = _use_package(Path(args.package), args.assignment)
        device = choose_device(args.device)
        manifests = list(all_manifests().values()) if args.assignment == "all" else [get_manifest(args.assignment)]
        if args.submission is not None and not Path(args.submission).is_dir():
            raise UnusableSubmission(f"submission folder {args.submission} does not exist")
        print(f"sandbox: {sandbox.describe()}", file=sys.stderr)
        with zygote.preloaded():
            for m in manifests:
                folder = submission_folder(m, args.submission, args.assignment == "all")
                try:
                    results += grade_assignment(m, folder, device, progress=lambda s: print(s, file=sys.stderr))
                    ignored = ignored_files(m, folder)
                    if ignored:
                        notes.append(f"{m.assignment}: not graded (not a file of the assignment): {', '.join(ignored)}")
                except UnusableSubmission:
                    raise
                except Exception as exc:  # noqa: BLE001 - a broken harness costs this assignment only
                    traceback.print_exc()
                    broken.append(clip(f"{m.assignment}: {type(exc).__name__}: {exc}"))
                    results += [Result(m.assignment, c, "error", f"the grader failed on this assignment: {broken[-1]}")
                                for c in m.checks]
        print(table(results))
        print(summarize(results))
        harness_error = clip("; ".join(broken))
        code = EXIT_HARNESS if broken else exit_code(results)
        if broken:
            print("error: the grader itself failed; please report this to the course staff", file=sys.stderr)
    except (KeyError, UnusableSubmission, PackageError, sandbox.SandboxError) as exc:
        harness_error = str(exc).strip("'\"")
        print(f"error: {harness_error}", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - report, never hide, a broken harness
        harness_error = clip(f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
        print("error: the grader itself failed; please report this to the course staff", file=sys.stderr)
    finally:
        payload = to_gradescope(results, device=device, elapsed=time.monotonic() - start, harness_error=harness_error,
                                hidden_visibility=hidden_visibility)
        payload["output"] = "\n".join([payload["output"], *notes])
        payload["extra_data"].update(sandbox=sandbox.describe(), unsafe_no_sandbox=sandbox.unsafe())
        try:
            write_json(Path(args.json), payload)
            print(f"wrote {args.json}", file=sys.stderr)
        except OSError as exc:
            print(f"error: results not written: {exc}", file=sys.stderr)
            code = EXIT_HARNESS
    return code


def cmd_release(args) -> int:
    if args.student:
        return cmd_student_release(args)
    try:
        problems = release(check=args.check)
    except ReleaseError as exc:
        print(f"release error: {exc}", file=sys.stderr)
        return EXIT_HARNESS
    leaks = [p for p in problems if p.startswith(LEAK)]
    if leaks:  # the stub or handout says what the solution writes: state the contract instead
        print(f"release error: {len(leaks)} solution line(s) in student-facing text (docstrings and "
              f"comments of the sources, handouts, HINTS.md, public tests, notebooks):\n  "
              + "\n  ".join(p[len(LEAK):] for p in leaks), file=sys.stderr)
    problems = [p for p in problems if not p.startswith(LEAK)]
    if args.check:
        if problems:
            print("stale generated files (run `python -m autograder release`):\n" + "\n".join(problems))
        else:
            print("release --check: every stub and solution matches its source")
        return EXIT_FAILED if problems or leaks else EXIT_OK
    print("\n".join(problems) or "release: everything already up to date")
    return EXIT_FAILED if leaks else EXIT_OK


def cmd_public_grade(args) -> int:
    """`grade` in a student repository: the public tests, one row each (no hidden suite here)."""
    from autograder.public import public_table, run_public
    try:
        manifests = list(all_manifests().values()) if args.assignment == "all" else [get_manifest(args.assignment)]
        results = []
        for m in manifests:
            folder = submission_folder(m, args.submission, args.assignment == "all")
            if not folder.is_dir():
                raise KeyError(f"submission folder {folder} does not exist")
            print(f"{m.assignment}: running the public tests on {folder} ...", file=sys.stderr)
            results.append(run_public(m, folder))
            print(public_table(m, results[-1]))
    except (KeyError, FileNotFoundError) as exc:
        print(f"error: {str(exc).strip(chr(39))}", file=sys.stderr)
        return EXIT_HARNESS
    return EXIT_OK if all(r.outcome in ("passed", "not_run") for rs in results for r in rs) else EXIT_FAILED


def cmd_student_release(args) -> int:
    from autograder import student
    try:
        plan = student.make_plan(args.through, args.solutions)
        out = Path(args.student)
        student.build(out, plan)
    except ReleaseError as exc:
        print(f"release error: {exc}", file=sys.stderr)
        return EXIT_HARNESS
    print(student.summary(out, plan))
    leaks = student.find_leaks(out, plan)
    if leaks:
        print(f"release error: {len(leaks)} line(s) of unreleased solutions found in {out}:\n  "
              + "\n  ".join(leaks[:20]), file=sys.stderr)
        return EXIT_FAILED
    print(f"leak check: no line of an unreleased solution in {out}")
    return EXIT_OK


def cmd_submit(args) -> int:
    from autograder.public import SubmitRefused, submit
    try:
        m = get_manifest(args.assignment)
        folder = submission_folder(m, args.submission, False)
        out, warnings = submit(m, folder, Path(args.output or f"{m.assignment}_submission.zip"))
    except (KeyError, SubmitRefused) as exc:
        print(f"submit refused: {str(exc).strip(chr(39))}", file=sys.stderr)
        return EXIT_HARNESS
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"wrote {out} ({out.stat().st_size / 1024:.1f} KiB): upload this file")
    return EXIT_OK


def cmd_gradescope(args) -> int:
    from autograder.gradescope import build_package
    try:
        out = build_package(get_manifest(args.assignment), Path(args.output), seed=args.seed, torch=args.torch,
                            hidden_visibility=args.hidden_visibility)
    except (KeyError, ReleaseError, PackageError) as exc:
        print(f"error: {str(exc).strip(chr(39))}", file=sys.stderr)
        return EXIT_HARNESS
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB): upload it as the Gradescope autograder")
    return EXIT_OK


def cmd_selftest(args) -> int:
    from autograder.selftest import run_selftest

    try:
        device = choose_device(args.device)
    except UnusableSubmission as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_HARNESS
    names = list(all_manifests()) if args.assignment == "all" else [args.assignment]
    ok = True
    for name in names:
        for case in run_selftest(name, device=device, progress=lambda s: print(s, file=sys.stderr)):
            ok &= case.ok
            print(f"{'PASS' if case.ok else 'FAIL'}  {case.case} ({case.seconds:.1f} s)"
                  + (f"\n      {case.detail}" if case.detail else ""))
    return EXIT_OK if ok else EXIT_FAILED


def cmd_regrade(args) -> int:
    """(instructors) Grade every submission of a class; layouts, seeds and resuming: autograder/regrade.py."""
    from autograder.regrade import command

    return command(args)


def cmd_gpu_check(args) -> int:
    from autograder.gpu_check import main as gpu_check

    return gpu_check(args.out)


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
    g.add_argument("--unsafe-no-sandbox", action="store_true", help="(local use only) as root, run student code "
                   "as root without capabilities where no unprivileged account can run it; results.json records it")
    g.add_argument("--package", metavar="PACKAGE_JSON", help="(grading packages) the package.json of an "
                   "unpacked Gradescope package: its seed, its grading build, its visibility of hidden checks")
    g.set_defaults(func=cmd_grade if hidden_suites_present() else cmd_public_grade)
    r = sub.add_parser("release", help="(instructors) regenerate stubs and solutions from lib/ and kernels/")
    r.add_argument("--check", action="store_true", help="write nothing; fail with a diff if anything is stale")
    r.add_argument("--student", metavar="OUT", help="instead: write the student repository into the new folder OUT")
    r.add_argument("--through", default=None, help="with --student: the last released assignment (e.g. a3)")
    r.add_argument("--solutions", default=None, help="with --student: assignments whose solutions ship, "
                                                     "e.g. a0,a1,a2 ('' for none; default: all before --through)")
    r.set_defaults(func=cmd_release)
    s = sub.add_parser("selftest", help="(instructors) solutions full marks, stubs zero, planted breakages caught")
    s.add_argument("assignment", nargs="?", default="all")
    s.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    s.set_defaults(func=cmd_selftest)
    rg = sub.add_parser("regrade", help="(instructors) grade a class's submissions: results.json each, scores.csv")
    rg.add_argument("assignment", help="a0, a1, ...")
    rg.add_argument("--submissions", required=True, metavar="DIR",
                    help="one folder per student, or Gradescope's export")
    rg.add_argument("--out", required=True, metavar="OUT", help="folder for <submission>/results.json and scores.csv")
    rg.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    rg.add_argument("--cpu-results", metavar="DIR2",
                    help="an earlier run's OUT: grade only the GPU groups, take the rest from it")
    rg.add_argument("--force", action="store_true", help="regrade submissions already graded in OUT")
    seed = rg.add_mutually_exclusive_group()
    seed.add_argument("--package", metavar="ZIP", help="the Gradescope package (aN_autograder.zip): grade on its "
                      "seed, the hidden inputs Gradescope graded on")
    seed.add_argument("--seed", type=int, help="grade on this seed's hidden inputs")
    rg.add_argument("--due", metavar="ISO8601", help="the deadline with its UTC offset, e.g. 2026-11-20T23:59-08:00: "
                    "scores.csv's late column (hours)")
    rg.set_defaults(func=cmd_regrade)
    sub.add_parser("list", help="assignments, tasks and points").set_defaults(func=cmd_list)
    u = sub.add_parser("submit", help="write the zip to upload: your files and written answers")
    u.add_argument("assignment")
    u.add_argument("--submission", help="folder with your files (default: assignments/aN_topic/)")
    u.add_argument("-o", "--output", help="zip to write (default: ./aN_submission.zip)")
    u.set_defaults(func=cmd_submit)
    gc = sub.add_parser("gpu-check", help="(instructors) on a CUDA GPU: gpu tests, grade --device cuda, kernel "
                                          "benchmark, one report; on a CPU: says so, exits 0")
    gc.add_argument("--out", default="bench_out/gpu_check", help="folder for report.md and report.json")
    gc.set_defaults(func=cmd_gpu_check)
    z = sub.add_parser("gradescope", help="(instructors) build the Gradescope autograder zip of one assignment")
    z.add_argument("assignment")
    z.add_argument("-o", "--output", required=True, help="zip to write, e.g. a2_autograder.zip")
    z.add_argument("--seed", type=int, default=None, help="grading seed baked into the package (default: random)")
    z.add_argument("--torch", choices=TORCH_BUILDS, default="cpu",
                   help="the torch build setup.sh installs (default: cpu; Gradescope has no GPU)")
    z.add_argument("--hidden-visibility", choices=VISIBILITIES, default="after_published",
                   help="when students see the checks a suite keeps hidden (default: after_published)")
    z.set_defaults(func=cmd_gradescope)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
