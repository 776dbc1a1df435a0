"""Compile CUDA sources with nvcc for sm_80 without a GPU, and read ptxas' register report.

`nvcc -std=c++17 -arch=sm_80 -c file.cu -Xptxas -v` runs the whole device pipeline (front end,
PTX, ptxas) and prints, per kernel, registers used and bytes spilled to local memory; the PTX it
keeps tells which kernels ever store to global memory (a kernel whose body was deleted compiles
too, and does nothing: `finish` fails it).  The files
compile in parallel (one nvcc each); `quick=True` adds -DST_QUICK_CHECK, which instantiates
every template for fp32 only (kernel_utils.cuh), a third of the ptxas time.  Used by
tests/test_kernels_compile.py and the a1 grader (a student's .cu with the reference headers).

Successful compilations are remembered, as ccache does, under a key made of the nvcc version,
the flags and the preprocessed source without comments, line markers or blank lines
(`nvcc -E -Xcompiler -P`): the suite compiles kernels/softmax.cu and its released copy
solutions/a1_kernels/softmax.cu, which differ only in a comment, once.
$SCALETRAIN_NVCC_CACHE moves the cache (default ~/.cache/scaletrain/nvcc); "off" disables it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from scaletrain.ops.backends import KERNELS_DIR

__all__ = ["start", "finish", "collect", "verdict", "ptxas_report", "global_writers"]

_WRITES = "scaletrain: stores to global memory:"  # the line `finish` adds to the log it caches


@dataclass
class _Cached:
    """Stands in for the Popen of a compilation already seen."""
    log: str
    returncode: int = 0

    def communicate(self, timeout=None):
        return self.log, None

    def kill(self):
        pass

    keep_dir = None


def _cache_dir() -> Path | None:
    where = os.environ.get("SCALETRAIN_NVCC_CACHE", str(Path.home() / ".cache" / "scaletrain" / "nvcc"))
    return None if where == "off" else Path(where)


def _key(nvcc: str, flags: list[str], source: Path) -> str | None:
    """Hash of (nvcc version, flags, preprocessed source); None if preprocessing fails."""
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    pre = subprocess.run([nvcc, *flags, "-E", "-Xcompiler", "-P", str(source)], capture_output=True, text=True,
                         timeout=120)
    if pre.returncode != 0:
        return None
    code = "\n".join(line.strip() for line in pre.stdout.splitlines() if line.strip())  # comments leave blanks
    return hashlib.sha256("\0".join([version, *flags, _WRITES, code]).encode()).hexdigest()


def start(files, *, include_dirs=(KERNELS_DIR,), quick: bool = True, arch: int = 80) -> dict | None:
    """Start one nvcc per file (compile only, output discarded); None when nvcc is not installed.
    Returns {file name: process} for `finish`."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    flags = ["-std=c++17", f"-arch=sm_{arch}", *[f"-I{d}" for d in include_dirs]]
    flags += ["-DST_QUICK_CHECK"] if quick else []
    cache, procs = _cache_dir(), {}
    for f in map(Path, files):
        key = _key(nvcc, flags, f) if cache is not None else None
        hit = cache / f"{key}.log" if key else None
        if hit is not None and hit.is_file():
            procs[f.name] = _Cached(hit.read_text())
            continue
        keep = tempfile.mkdtemp(prefix="scaletrain-nvcc-")  # the PTX, for global_writers
        proc = subprocess.Popen([nvcc, *flags, "-Xptxas", "-v", "--keep", "--keep-dir", keep, "-c", "-o", os.devnull,
                                 str(f)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL)
        proc.cache_path, proc.keep_dir = hit, keep  # where finish() records a success; the PTX
        procs[f.name] = proc
    return procs


def finish(procs: dict, name: str, timeout_s: float = 300.0) -> dict[str, tuple[int, int]]:
    """Wait for `name`'s nvcc and judge it (`verdict`)."""
    return verdict(name, **collect(procs[name], timeout_s))


def collect(proc, timeout_s: float = 300.0) -> dict:
    """Wait for one compilation of `start`: {"returncode", "log"} (returncode None: it timed out).
    A fresh compilation's log gains the line naming the kernels whose PTX stores to global memory,
    as a cached log has it, and a successful one is cached. Asking twice gives the same answer."""
    if hasattr(proc, "result"):
        return proc.result
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return {"returncode": None, "log": f"nvcc did not finish within {timeout_s:.0f} s"}
    finally:
        ptx = _take_ptx(proc)
    if proc.returncode == 0 and ptx is not None:
        log += f"\n{_WRITES} {' '.join(sorted(global_writers(ptx)))}\n"
        path = getattr(proc, "cache_path", None)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(log)
    proc.result = {"returncode": proc.returncode, "log": log}
    return proc.result


def verdict(name: str, returncode: int | None, log: str, kernels: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """{kernel: (registers, spilled bytes)} of a compilation `collect` returned, for the kernels
    whose mangled name contains one of `kernels` (all when empty).  AssertionError with the first
    compiler errors if it failed, naming the kernels that spill registers or never store to
    global memory (an empty body compiles too, and computes nothing), or when no kernel matches."""
    if returncode is None:
        raise AssertionError(f"{name}: {log}")
    if returncode != 0:
        errors = [line for line in log.splitlines() if "error" in line] or log.splitlines()[-5:]
        raise AssertionError(f"nvcc failed on {name}: " + " | ".join(errors[:3]))
    report = {k: v for k, v in ptxas_report(log).items() if not kernels or any(part in k for part in kernels)}
    if not report:
        wanted = f" named after {', '.join(kernels)}" if kernels else ""
        raise AssertionError(f"nvcc compiled {name} but reported no kernel{wanted} (is anything launched?)")
    spilled = sorted(k for k, (_, spills) in report.items() if spills > 0)
    if spilled:
        raise AssertionError(f"{name}: registers spill to local memory in {', '.join(spilled)}")
    writers = next((line[len(_WRITES):].split() for line in log.splitlines() if line.startswith(_WRITES)), [])
    idle = sorted(set(report) - set(writers))
    if idle:
        raise AssertionError(f"{name}: {len(idle)} kernel(s) never store to global memory, e.g. {idle[0][:60]}: "
                             "an empty body compiles but computes nothing")
    return report


def _take_ptx(proc) -> str | None:
    """The PTX nvcc left in `proc.keep_dir`, which is removed; None when there is none (a cached
    compilation, or one already finished)."""
    if proc.keep_dir is None:
        return None
    ptx = "\n".join(p.read_text() for p in Path(proc.keep_dir).glob("*.ptx"))
    shutil.rmtree(proc.keep_dir, ignore_errors=True)
    proc.keep_dir = None
    return ptx


def global_writers(ptx: str) -> set[str]:
    """Names of the PTX entry functions whose body stores to global (or generic) memory:
    st / atom / red without a .shared, .local or .param state space."""
    writers = set()
    for chunk in ptx.split(".entry ")[1:]:
        name, body = chunk.split("(", 1)[0].strip(), chunk.split(".entry", 1)[0]
        for m in re.finditer(r"\b(?:st|atom|red)((?:\.\w+)+)", body):
            if not {"shared", "local", "param", "const"} & set(m.group(1).split(".")):
                writers.add(name)
                break
    return writers


def ptxas_report(log: str) -> dict[str, tuple[int, int]]:
    """{mangled kernel name: (registers, spill-store bytes)} from `ptxas -v` output."""
    report, current, spills = {}, None, 0
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            current, spills = m.group(1), 0
        elif (m := re.search(r"(\d+) bytes spill stores", line)) and current:
            spills = int(m.group(1))
        elif (m := re.search(r"Used (\d+) registers", line)) and current:
            report[current] = (int(m.group(1)), spills)
    return report
