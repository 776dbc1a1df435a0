"""`make gpu-check` (`python -m autograder gpu-check`): everything that needs a CUDA GPU, one command, one report.

On a machine with a CUDA GPU it runs, in order:
1. every `gpu`-marked test (`pytest -m gpu`, junit XML read back per test);
2. the bundled solutions graded with `--device cuda` (the CUDA correctness checks, and the speed
   checks with their margins: GB/s, x naive, x native);
3. the kernel benchmark (`scaletrain.ops.benchmark.gpu_rows`: GB/s and % of peak DRAM bandwidth
   per kernel, backend and row length, against naive and native from the same run);
and writes `report.md` and `report.json` (GPU name, versions, every outcome, every figure) under
`--out` (default bench_out/gpu_check). Exit 0 when everything passed, 1 otherwise.

On a machine without one it says so and exits 0 having run nothing: nothing GPU-side can be
checked there, and nothing is reported as passed.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from autograder.manifest import REPO

STEP_TIMEOUT_S = 3600   # each of the three steps; a hang is reported, not waited on forever


def gpu_facts() -> dict:
    """The machine: GPU name, peak DRAM bandwidth, and the versions a reader needs."""
    import torch
    import triton

    from scaletrain.ops.benchmark import peak_gbps

    return {"gpu": torch.cuda.get_device_name(), "peak GB/s": peak_gbps(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__, "python": platform.python_version(),
            "gpus": torch.cuda.device_count()}


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
    """The rows of a `grade all --device cuda` results.json: every check with its outcome and reason."""
    return [{"assignment": t["extra_data"]["assignment"], "task": t["extra_data"]["task"],
             "check": t["extra_data"]["check"], "outcome": t["extra_data"]["outcome"], "reason": t["output"]}
            for t in payload["tests"]]


def _run(cmd: list[str], log: Path) -> int:
    print(f"$ {' '.join(cmd)}", flush=True)
    try:
        with open(log, "w") as f:
            return subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=STEP_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        return 124


def collect(out: Path) -> dict:
    """Run the three steps; the report as data."""
    from scaletrain.ops.benchmark import gpu_rows

    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": gpu_facts()}
    code = _run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                 f"--junitxml={out / 'gpu_tests.xml'}", "tests"], out / "gpu_tests.log")
    report["tests"] = junit_outcomes(out / "gpu_tests.xml") if (out / "gpu_tests.xml").is_file() else []
    report["tests_exit"] = code
    code = _run([sys.executable, "-m", "autograder", "grade", "all", "--submission", "solutions", "--device", "cuda",
                 "--json", str(out / "grade.json")], out / "grade.log")
    report["grade"] = gpu_grades(json.loads((out / "grade.json").read_text())) if (out / "grade.json").is_file() else []
    report["grade_exit"] = code
    report["kernels"] = gpu_rows(peak=report["machine"]["peak GB/s"])
    return report


def passed(report: dict) -> bool:
    return (report["tests_exit"] == 0 and report["grade_exit"] == 0 and bool(report["tests"])
            and all(r["outcome"] == "passed" for r in report["grade"]))


def render(report: dict) -> str:
    """report.md: the machine, the failures first, then every table."""
    from scaletrain import bench
    from scaletrain.ops.benchmark import GPU_COLUMNS

    machine = report["machine"]
    counts = {k: sum(r["outcome"] == k for r in report["tests"]) for k in ("passed", "failed", "error", "skipped")}
    not_passed = [r for r in report["grade"] if r["outcome"] != "passed"]
    lines = [f"# GPU check: {'PASS' if passed(report) else 'FAIL'}", "",
             " · ".join(f"{k} {v}" for k, v in machine.items()), "",
             f"## gpu-marked tests (pytest exit {report['tests_exit']})", "",
             ", ".join(f"{v} {k}" for k, v in counts.items()), ""]
    lines += [f"- {r['outcome']}: `{r['test']}`" for r in report["tests"] if r["outcome"] in ("failed", "error")]
    lines += ["", f"## Solutions graded with --device cuda (exit {report['grade_exit']})", "",
              bench.format_table(report["grade"], ["assignment", "task", "outcome", "check", "reason"]), ""]
    if not_passed:
        lines += [f"{len(not_passed)} check(s) did not pass: "
                  + "; ".join(f"{r['assignment']} {r['check']}: {r['outcome']}" for r in not_passed), ""]
    lines += ["## Kernel benchmark (M = 4096, fp32)", "", bench.format_table(report["kernels"], GPU_COLUMNS), ""]
    return "\n".join(lines)


def main(out: str = "bench_out/gpu_check") -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU on this machine (torch.cuda.is_available() is False): nothing to check "
              "here; run it on a GPU machine. Nothing was run, nothing is reported as passed.")
        return 0
    folder = Path(out)
    report = collect(folder)
    (folder / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (folder / "report.md").write_text(render(report))
    print(render(report))
    print(f"wrote {folder / 'report.md'} and {folder / 'report.json'}")
    return 0 if passed(report) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
