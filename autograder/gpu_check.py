"""`make gpu-check` (`python -m autograder gpu-check`): everything that needs a CUDA GPU, one command, one report.

It runs on a GPU machine as it comes (no network, a CUDA torch already installed, no nbval): it
installs nothing and uses no venv of its own.  Of the interpreters it can see -- this one,
$GPU_PYTHON, the repository's .venv, `python3` and `python` on PATH -- it takes the first whose
torch sees a CUDA GPU, and runs everything there with PYTHONPATH = lib:. (the checkout, not an
installed copy).  The first GPU run (an H200, 2026-11-27) had torch 2.11 / triton 3.6 against the
pins 2.13 / 3.9, and `make gpu-check` then failed before testing anything (issue 29).  In order:
1. every `gpu`-marked test (`pytest -m gpu` with the repository's addopts replaced: they name
   nbval's --nbval-lax; junit XML read back per test);
2. the bundled solutions of the assignments with a GPU group (a1, a1b, a2) graded with `--device
   cuda` (the CUDA correctness checks, and the speed checks with their margins: GB/s, x naive,
   x native); the others grade the same on any machine, and `make test` grades them;
3. a small class (the solution, the untouched stub, one planted bug: CLASS) regraded as an
   instructor does after Gradescope: `regrade --device cpu`, then `regrade --device cuda
   --cpu-results` on the same folder (only the GPU groups run), scores.csv read back;
4. the kernel benchmark (`scaletrain.ops.benchmark.gpu_rows`: GB/s and % of peak DRAM bandwidth
   per kernel, backend and row length, against naive and native from the same run);
and writes `report.md` and `report.json` (GPU name, the versions that ran beside the pins, every
outcome, every figure) under `--out` (default bench_out/gpu_check), again after every step: a run
stopped half-way leaves a report of what it finished, headed INCOMPLETE.  What needs no GPU here
runs beside the GPU steps: step 3's CPU regrade, and step 2's grading of an assignment whose GPU
groups need more GPUs than the machine has (a2's NCCL ring, `Group.gpus`, on one GPU). Exit 0 when everything
passed (a check `not_run` for want of a second GPU is listed, not failed), 1 otherwise.

On a machine without a GPU it says so and exits 0 having run nothing: nothing GPU-side can be
checked there, and nothing is reported as passed.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

from autograder.manifest import REPO

PINNED = ("torch", "triton", "numpy")   # the versions a report sets beside the pins (numpy: interpreter_compat.py)
STEP_TIMEOUT_S = 3600   # each step; a hang is reported, not waited on forever
# assignment -> the planted bug of the class's third student.  a1b: its only GPU group is the speed
# checks (~40 s a student on an H200) where a1's rebuild the CUDA extension per student (~100 s),
# and `grade a1 --device cuda` (step 2) already runs that build in the sandbox: the class proves
# the regrade's merge of CPU and GPU results, which is the same for every assignment.
CLASS = {"a1b": "backward without the rowsum(dO * O) term"}
CHILD_ENV = "AUTOGRADER_GPU_CHECK_PYTHON"           # set in the re-executed gpu-check: the interpreter it runs on
# what an interpreter must answer for gpu-check to run there: its torch, CUDA, triton, pytest-xdist
PROBE = ("import importlib.util as u, json, platform, torch; c = torch.cuda.is_available(); "
         "t = u.find_spec('triton') and __import__('triton'); print(json.dumps({'cuda': c, "
         "'gpu': torch.cuda.get_device_name() if c else None, 'torch': torch.__version__, "
         "'torch cuda': torch.version.cuda, 'triton': t.__version__ if t else None, "
         "'python': platform.python_version(), 'xdist': bool(u.find_spec('xdist'))}))")


def gpu_facts() -> dict:
    """The machine: GPU name, peak DRAM bandwidth, and the versions a reader needs."""
    import numpy
    import torch
    import triton

    from scaletrain.ops.benchmark import peak_gbps

    # numpy: the Triton interpreter grades the class's CPU half, and an older Triton's interpreter
    # depends on it (scaletrain/ops/toolchain/interpreter_compat.py)
    return {"gpu": torch.cuda.get_device_name(), "peak GB/s": peak_gbps(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "gpus": torch.cuda.device_count()}


def pins() -> dict:
    """The versions pyproject.toml pins (PINNED) and the Python it requires."""
    text = (REPO / "pyproject.toml").read_text()
    found = {name: re.search(rf'"{name}==([^";]+)', text) for name in PINNED}
    python = re.search(r'requires-python = "([^"]+)"', text)
    return {**{k: m.group(1) if m else None for k, m in found.items()}, "python": python.group(1) if python else None}


def versions(machine: dict) -> list[dict]:
    """What ran beside what is pinned, one row per package."""
    pinned = pins()
    return [{"package": name, "ran": machine.get(name), "pinned": pinned[name],
             "same": str(machine.get(name) or "").split("+")[0] == pinned[name]} for name in PINNED] + [
        {"package": "python", "ran": machine.get("python"), "pinned": pinned["python"], "same": None}]


def candidates() -> list[str]:
    """Interpreters to try, in order, each once."""
    found = [sys.executable, os.environ.get("GPU_PYTHON"), str(REPO / ".venv" / "bin" / "python"),
             shutil.which("python3"), shutil.which("python")]
    return list(dict.fromkeys(p for p in found if p and Path(p).is_file()))


def probe(python: str) -> dict | None:
    """PROBE's answer from `python`, or None (no torch there, or it failed)."""
    try:
        proc = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if proc.returncode == 0 and lines else None


def find_cuda_python(tried: list[str] | None = None) -> tuple[str, dict] | tuple[None, None]:
    """(the first of candidates() whose torch sees a CUDA GPU, its PROBE answer); `tried` collects
    every interpreter asked and what it said."""
    for python in candidates():
        facts = probe(python)
        if tried is not None:
            tried.append(f"{python}: " + ("no torch" if facts is None else
                                         f"torch {facts['torch']}, CUDA {'yes' if facts['cuda'] else 'no'}"))
        if facts and facts["cuda"]:
            return python, facts
    return None, None


def environment() -> dict:
    """This environment with the checkout first on PYTHONPATH: lib/ (scaletrain) and the root (autograder)."""
    path = [str(REPO / "lib"), str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}


def gpu_assignments() -> list[str]:
    """The assignments with a group that needs a GPU: the only ones whose grade depends on the device."""
    from autograder.manifest import all_manifests

    return [a for a, m in all_manifests().items() if any(g.needs_gpu for g in m.groups)]


def beside_gpu_steps(gpus: int) -> list[str]:
    """The GPU assignments whose every GPU group needs more GPUs than `gpus` (a2's NCCL ring on a
    one-GPU machine): their grading does no GPU work here, so it runs beside the GPU steps."""
    from autograder.manifest import get_manifest

    return [a for a in gpu_assignments() if all(g.gpus > gpus for g in get_manifest(a).groups if g.needs_gpu)]


def commands(python: str, out: Path, *, xdist: bool = False) -> dict[str, list[str]]:
    """The command of every step, by name ("tests", "grade <aN>", "class <aN> cpu", "class <aN> cuda")."""
    from autograder.manifest import get_manifest

    tests = [python, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
             "--strict-markers", "-ra", *(["-n", "6"] if xdist else []), f"--junitxml={out / 'gpu_tests.xml'}", "tests"]
    cmds = {"tests": tests}
    for a in gpu_assignments():
        cmds[f"grade {a}"] = [python, "-m", "autograder", "grade", a, "--submission",
                              str(get_manifest(a).solution_dir()), "--device", "cuda", "--json", str(out / f"grade-{a}.json")]
    for a in CLASS:
        regrade = [python, "-m", "autograder", "regrade", a, "--submissions", str(out / "class" / a / "submissions"),
                   "--out", str(out / "class" / a / "results")]
        cmds[f"class {a} cpu"] = [*regrade, "--device", "cpu"]
        cmds[f"class {a} cuda"] = [*regrade, "--device", "cuda", "--cpu-results", str(out / "class" / a / "results")]
    return cmds


def class_folder(assignment: str, root: Path) -> Path:
    """root/{solution,stub,planted}/ with the assignment's files as a student submits them: the
    solutions, the stubs, and the solutions with CLASS[assignment]'s bug planted."""
    from autograder.manifest import get_manifest

    m = get_manifest(assignment)
    plant = next(p for p in m.planted if p.name == CLASS[assignment])
    for name, source in (("solution", m.solution_dir()), ("stub", m.stub_dir()), ("planted", m.solution_dir())):
        (root / name).mkdir(parents=True, exist_ok=True)
        for file in m.files:
            text = (source / file).read_text()
            (root / name / file).write_text(plant.apply(text) if name == "planted" and file == plant.file else text)
    return root


def class_rows(assignment: str, results: Path) -> list[dict]:
    """scores.csv of the class regrade, a row per student, with the assignment named."""
    path = results / "scores.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [{"assignment": assignment, **row} for row in csv.DictReader(f)]


def class_as_expected(rows: list[dict]) -> bool:
    """For each assignment of CLASS: nothing pending (the GPU groups ran), the solution at full
    marks, the stub at 0, the planted bug below full marks."""
    by = {(r["assignment"], r["name"]): r for r in rows}
    try:
        return all(all(float(by[a, n]["pending"]) == 0 for n in ("solution", "stub", "planted"))
                   and float(by[a, "solution"]["total"]) == float(by[a, "solution"]["max"])
                   and float(by[a, "stub"]["total"]) == 0
                   and float(by[a, "planted"]["total"]) < float(by[a, "planted"]["max"]) for a in CLASS)
    except KeyError:  # a student or a column missing: the regrade did not finish
        return False


def junit_outcomes(path: Path) -> list[dict]:
    """[{"test", "outcome"}] from pytest's junit XML: passed, failed, error or skipped."""
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        rows.append({"test": f"{case.get('classname')}::{case.get('name')}",
                     "outcome": {"failure": "failed"}.get(outcome, outcome)})
    return rows


def gpu_grades(payload: dict) -> list[dict]:
    """The rows of a `grade aN --device cuda` results.json: every check with its outcome and reason."""
    return [{"assignment": t["extra_data"]["assignment"], "task": t["extra_data"]["task"],
             "check": t["extra_data"]["check"], "outcome": t["extra_data"]["outcome"], "reason": t["output"]}
            for t in payload["tests"]]


class Step:
    """One step's subprocess, started now and waited for later (the class's CPU regrade, which
    needs no GPU, runs while the GPU steps do); its log in `log`, its seconds printed at the end."""

    def __init__(self, name: str, cmd: list[str], log: Path):
        print(f"$ {' '.join(cmd)}", flush=True)
        self.name, self.log, self.start = name, log, time.monotonic()
        self._out = open(log, "w")
        self._proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._out, stderr=subprocess.STDOUT, env=environment())

    def wait(self) -> int:
        """The exit code (124: past STEP_TIMEOUT_S, and killed)."""
        try:
            code = self._proc.wait(timeout=max(1.0, STEP_TIMEOUT_S - (time.monotonic() - self.start)))
        except subprocess.TimeoutExpired:
            self.stop()
            code = 124
        self._out.close()
        print(f"  {self.name}: exit {code} after {time.monotonic() - self.start:.0f} s (log: {self.log})", flush=True)
        return code

    def stop(self) -> None:
        """Kill it if it still runs (gpu-check stopped early leaves no orphan)."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


def _run(name: str, cmd: list[str], log: Path) -> int:
    return Step(name, cmd, log).wait()


def steps() -> list[str]:
    """Every step's name, in the order they finish."""
    return ["tests", *(f"grade {a}" for a in gpu_assignments()),
            *(f"class {a} {device}" for a in CLASS for device in ("cpu", "cuda")), "kernels"]


def collect(out: Path, *, xdist: bool = False, save: Callable[[dict], None] = lambda report: None) -> dict:
    """Run the steps; the report as data.  `save(report)` after every step, report["pending"]
    naming the steps not finished: a run stopped half-way (a time limit) leaves a report of what
    it did, marked INCOMPLETE."""
    from scaletrain.ops.benchmark import gpu_rows

    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": gpu_facts(), "pending": steps(), "tests_exit": None, "tests": [], "grade_exit": 0,
              "grade": [], "class_exit": 0, "class": [], "kernels": [], "kernels_error": ""}
    report["versions"] = versions(report["machine"])
    cmds = commands(sys.executable, out, xdist=xdist)

    def done(step: str) -> None:
        report["pending"].remove(step)
        save(report)

    save(report)
    for a in CLASS:
        class_folder(a, out / "class" / a / "submissions")
    on_cpu = {f"class {a} cpu": Step(f"class {a} cpu", cmds[f"class {a} cpu"], out / "class" / a / "regrade-cpu.log")
              for a in CLASS}
    on_cpu |= {f"grade {a}": Step(f"grade {a}", cmds[f"grade {a}"], out / f"grade-{a}.log")
               for a in beside_gpu_steps(report["machine"].get("gpus", 1))}
    try:
        report["tests_exit"] = _run("tests", cmds["tests"], out / "gpu_tests.log")
        report["tests"] = junit_outcomes(out / "gpu_tests.xml") if (out / "gpu_tests.xml").is_file() else []
        done("tests")
        for a in gpu_assignments():
            beside = on_cpu.get(f"grade {a}")
            code = beside.wait() if beside else _run(f"grade {a}", cmds[f"grade {a}"], out / f"grade-{a}.log")
            report["grade_exit"] = max(report["grade_exit"], 0 if code == 3 else code)  # 3: checks not run (one GPU)
            found = out / f"grade-{a}.json"
            report["grade"] += gpu_grades(json.loads(found.read_text())) if found.is_file() else []
            done(f"grade {a}")
        for a in CLASS:
            report["class_exit"] |= on_cpu[f"class {a} cpu"].wait()
            done(f"class {a} cpu")
            report["class_exit"] |= _run(f"class {a} cuda", cmds[f"class {a} cuda"], out / "class" / a / "regrade-cuda.log")
            report["class"] += class_rows(a, out / "class" / a / "results")
            done(f"class {a} cuda")
        try:  # "% datasheet" of the datasheet (ops.ceiling), not the memory clock's figure
            report["kernels"] = gpu_rows()
        except Exception as exc:  # noqa: BLE001 - the report is still written, and says FAIL with the cause
            report["kernels_error"] = f"{type(exc).__name__}: {exc}"
        done("kernels")
    finally:
        for step in on_cpu.values():
            step.stop()
    return report


def wants_more_gpus(row: dict) -> bool:
    """A check not run because the machine has too few GPUs (a2's NCCL ring needs 2): listed, not failed."""
    return row["outcome"] == "not_run" and re.match(r"needs \d+ GPUs", row["reason"] or "") is not None


def passed(report: dict) -> bool:
    return (not report.get("pending") and report["tests_exit"] == 0 and report["grade_exit"] == 0 and bool(report["tests"])
            and bool(report["grade"]) and all(r["outcome"] == "passed" or wants_more_gpus(r) for r in report["grade"])
            and report.get("class_exit") == 0 and class_as_expected(report.get("class", []))
            and not report.get("kernels_error"))


def render(report: dict) -> str:
    """report.md: the machine, the failures first, then every table."""
    from scaletrain import bench
    from scaletrain.ops.benchmark import GPU_COLUMNS

    machine = report["machine"]
    counts = {k: sum(r["outcome"] == k for r in report["tests"]) for k in ("passed", "failed", "error", "skipped")}
    not_passed = [r for r in report["grade"] if r["outcome"] != "passed"]
    verdict = "INCOMPLETE" if report.get("pending") else "PASS" if passed(report) else "FAIL"
    lines = [f"# GPU check: {verdict}", "",
             *([f"Not finished (stopped, or still running): {', '.join(report['pending'])}", ""]
               if report.get("pending") else []),
             " · ".join(f"{k} {v}" for k, v in machine.items()), "", *_versions_section(report),
             f"## gpu-marked tests (pytest exit {report['tests_exit']})", "",
             ", ".join(f"{v} {k}" for k, v in counts.items()), ""]
    lines += [f"- {r['outcome']}: `{r['test']}`" for r in report["tests"] if r["outcome"] in ("failed", "error")]
    lines += ["", f"## Solutions graded with --device cuda (exit {report['grade_exit']})", "",
              bench.format_table(report["grade"], ["assignment", "task", "outcome", "check", "reason"]), ""]
    if not_passed:
        lines += [f"{len(not_passed)} check(s) did not pass: "
                  + "; ".join(f"{r['assignment']} {r['check']}: {r['outcome']}" for r in not_passed), ""]
    lines += _class_section(report)
    lines += ["## Kernel benchmark (M = 4096, fp32)", "", f"failed: {report['kernels_error']}" if report.get("kernels_error")
              else bench.format_table(report["kernels"], GPU_COLUMNS), ""]
    return "\n".join(lines)


def _versions_section(report: dict) -> list[str]:
    from scaletrain import bench

    return ["## Versions that ran, beside the pins (pyproject.toml)", "",
            bench.format_table(report.get("versions", [])), ""]


def _class_section(report: dict) -> list[str]:
    """The class regrade's scores.csv: regrade --device cpu, then --device cuda --cpu-results."""
    from scaletrain import bench

    rows = report.get("class", [])
    columns = [c for c in ("assignment", "name", "total", "max", "pending", "passed", "failed", "error", "timeout",
                           "not_run", "flagged") if rows and c in rows[0]]
    verdict = "as expected" if class_as_expected(rows) else "NOT as expected"
    return [f"## A class regraded: regrade --device cpu, then --device cuda --cpu-results (exit "
            f"{report.get('class_exit')}; solution full, stub 0, planted {CLASS} below full: {verdict})", "",
            bench.format_table(rows, columns) if rows else "(no scores.csv)", ""]


def main(out: str = "bench_out/gpu_check") -> int:
    """Find the CUDA interpreter and run again on it (CHILD_ENV set, the checkout on PYTHONPATH);
    there, _check.  Without one: say so, exit 0, run nothing."""
    if os.environ.get(CHILD_ENV):
        return _check(Path(out))
    tried: list[str] = []
    python, facts = find_cuda_python(tried)
    if python is None:
        print("gpu-check: no CUDA GPU for any interpreter here (" + "; ".join(tried) + "): nothing to check "
              "here; run it on a GPU machine. Nothing was run, nothing is reported as passed.")
        return 0
    print(f"gpu-check: running on {python} (torch {facts['torch']}, CUDA {facts['torch cuda']}, "
          f"triton {facts['triton']}); PYTHONPATH = the checkout; nothing installed", flush=True)
    os.execve(python, [python, "-m", "autograder", "gpu-check", "--out", out], {**environment(), CHILD_ENV: python})
    return 2  # not reached


def save(report: dict, folder: Path) -> None:
    """report.json and report.md as they stand (written again after every step)."""
    (folder / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (folder / "report.md").write_text(render(report))


def _check(folder: Path) -> int:
    import importlib.util

    report = collect(folder, xdist=importlib.util.find_spec("xdist") is not None, save=lambda r: save(r, folder))
    print(render(report))
    print(f"wrote {folder / 'report.md'} and {folder / 'report.json'}")
    return 0 if passed(report) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
