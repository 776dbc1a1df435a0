"""Building the CUDA emulator's libraries: kernels/*.cu rewritten, compiled by g++ against the
shim in kernels/cuda_cpu/, cached (scaletrain.ops.toolchain.cuda_cpu runs them).

Two textual rewrites happen on the way, nothing else: `k<<<grid, block, smem, stream>>>(args)`
becomes a call of the emulator's launcher (cuda_cpu.h's `Launch`), and `extern __shared__ T s[];`
a pointer to the launch's dynamic shared memory; a `#line` keeps the file's line numbers, so
errors point at the real source line.  Builds are cached per translation unit under
$SCALETRAIN_CUDA_CPU_CACHE (default ~/.cache/scaletrain/cuda_cpu; "off": a temporary folder)
keyed by the compiler, the flags and the rewritten sources: a first build costs ~10 s of CPU
(the units compile in parallel), later processes find the library at once.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scaletrain.ops.interface import KERNELS_DIR

__all__ = ["SOURCES", "SHIM_DIR", "FLAGS", "CONTRACT_FLAGS", "KERNEL_FLAGS", "LINK_FLAGS", "rewrite", "build"]

SOURCES = ("softmax.cu", "layer_norm.cu")
SHIM_DIR = KERNELS_DIR / "cuda_cpu"
FLAGS = ("-std=c++17", "-O1", "-fPIC", "-fno-strict-aliasing", "-fno-gnu-unique", "-fno-ipa-icf",
         "-Wno-unknown-pragmas",
         # fixed-size arrays (static __shared__, locals) are bounds-checked: a trap the runtime reports
         "-fsanitize=bounds", "-fsanitize-undefined-trap-on-error")


def _contract_flags() -> tuple[str, ...]:
    """g++ flags that fuse `a * b + c` into one FMA, as nvcc does by default (-fmad=true) and
    Triton too: without them the emulator rounded every product and passed LayerNorm's backward at
    N = 1, whose dx an H200 left at 1e-5..6e-5.  -O1 fuses only with
    -fexpensive-optimizations; on x86-64 only where the CPU has FMA (else nothing: products round)."""
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return ("-ffp-contract=fast", "-fexpensive-optimizations")
    try:
        has_fma = machine in ("x86_64", "amd64") and " fma " in Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        has_fma = False
    return ("-mfma", "-ffp-contract=fast", "-fexpensive-optimizations") if has_fma else ()


CONTRACT_FLAGS = _contract_flags()
# the kernels' loads and stores call hooks (runtime.cpp) that check shared memory for races
KERNEL_FLAGS = ("-fsanitize=thread", *CONTRACT_FLAGS)
# every symbol stays visible (error messages name kernels through dladdr) but binds inside its own
# library: two builds (the reference and a submission) can share a process
LINK_FLAGS = ("-shared", "-Wl,-Bsymbolic")


# ---- source rewriting ---------------------------------------------------------------------------
_EXTERN_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s*|alignas\(\s*\d+\s*\)\s*)?"
                            r"([A-Za-z_][\w:<>, ]*?)\s+(\w+)\s*\[\s*\]\s*;")


def _matching(text: str, start: int, open_: str, close: str) -> int:
    """Index of the bracket closing the one at `start` (scanning right)."""
    depth = 0
    for i in range(start, len(text)):
        depth += (text[i] == open_) - (text[i] == close)
        if depth == 0:
            return i
    raise ValueError(f"unbalanced {open_!r} after offset {start}")


def _callee_start(text: str, end: int) -> int:
    """Start of the kernel expression that ends just before `end` (an id, maybe with <template args>)."""
    k = end
    while k > 0 and text[k - 1].isspace():
        k -= 1
    if text[k - 1] == ">":
        depth = 0
        while True:
            k -= 1
            depth += (text[k] == ">") - (text[k] == "<")
            if depth == 0:
                break
    while k > 0 and (text[k - 1].isalnum() or text[k - 1] in "_:"):
        k -= 1
    return k


def rewrite(source: str, name: str = "kernel.cu") -> str:
    """`source` with its launches and dynamic shared declarations in the emulator's form; same lines."""
    out, i = [f'#line 1 "{name}"\n'], 0
    while (j := source.find("<<<", i)) >= 0:
        line_start = source.rfind("\n", 0, j) + 1
        if "//" in source[line_start:j]:  # in a comment
            out.append(source[i:j + 3])
            i = j + 3
            continue
        k, close = _callee_start(source, j), source.find(">>>", j)
        paren = close + 3
        while 0 <= close and paren < len(source) and source[paren].isspace():
            paren += 1
        if close < 0 or paren >= len(source) or source[paren] != "(":
            raise ValueError(f"{name}: cannot parse the launch at line {source.count(chr(10), 0, j) + 1}")
        end = _matching(source, paren, "(", ")")
        callee, config, args = source[k:j].strip(), source[j + 3:close], source[paren + 1:end]
        out.append(source[i:k])
        text = callee.replace("\\", "\\\\").replace('"', '\\"')
        out.append(f'::cuda_emu::Launch("{text}", {config})({callee}{", " if args.strip() else ""}{args})')
        i = end + 1
    out.append(source[i:])
    return _EXTERN_SHARED.sub(r"\1* \2 = static_cast<\1*>(::cuda_emu::dynamic_shared());", "".join(out))


# ---- build, cached --------------------------------------------------------------------------------
def _cache_dir() -> Path | None:
    where = os.environ.get("SCALETRAIN_CUDA_CPU_CACHE", str(Path.home() / ".cache" / "scaletrain" / "cuda_cpu"))
    return None if where == "off" else Path(where)


def _compiler() -> str:
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"the CUDA emulator compiles kernels with a C++17 compiler; {cxx!r} is not on PATH "
                           "(install g++, or set CXX)")
    return cxx


def _run(cmd: list[str], what: str, timeout_s: float) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what}: the compiler did not finish within {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        log = proc.stdout + proc.stderr
        errors = [ln for ln in log.splitlines() if "error" in ln] or log.splitlines()[-5:]
        raise RuntimeError(f"{what} does not compile for the CPU emulator: " + " | ".join(errors[:3]))


def _cached(cache: Path, key: str, suffix: str, make) -> Path:
    """cache/key.suffix, made by make(partial_path) unless present; atomic, so that concurrent
    builds of the same key both end with the same complete file."""
    target = cache / f"{key[:24]}{suffix}"
    if not target.is_file():
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        make(partial)
        os.replace(partial, target)
    return target


def build(folder: Path | str = KERNELS_DIR, *, include: Path | str = KERNELS_DIR, sources=SOURCES,
          timeout_s: float = 600) -> Path:
    """The emulator library of `sources` (softmax.cu and layer_norm.cu) in `folder`, with the
    headers (*.cuh, *.h) of `include`: built, or found in the cache.  Each translation unit is
    cached on its own (a change to softmax.cu recompiles only softmax.cu).  RuntimeError with the
    compiler's first errors when a source does not compile."""
    folder, include, sources = Path(folder), Path(include), tuple(sources)
    missing = [s for s in sources if not (folder / s).is_file()]
    if missing:
        raise FileNotFoundError(f"cannot build the CUDA kernels: {', '.join(missing)} missing from {folder}")
    headers = {p.name: rewrite(p.read_text(), p.name) for p in sorted([*include.glob("*.cuh"), *include.glob("*.h")])}
    units = {s: rewrite((folder / s).read_text(), s) for s in sources}
    cxx = _compiler()
    shim = sorted((p.name, p.read_text()) for p in [*SHIM_DIR.glob("*.h"), SHIM_DIR / "runtime.cpp"])
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    base = repr((version, FLAGS, LINK_FLAGS, shim))
    cache = _cache_dir() or Path(tempfile.mkdtemp(prefix="scaletrain-cuda-cpu-"))
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="scaletrain-cuda-cpu-build-") as tmp:
        work = Path(tmp)
        for name, text in {**headers, **units}.items():
            (work / name).write_text(text)
        compile_ = [cxx, *FLAGS, f"-I{SHIM_DIR}", f"-I{work}", "-x", "c++", "-include", "cuda_runtime.h", "-c"]
        jobs = {"runtime.cpp": (SHIM_DIR / "runtime.cpp", base, [])}
        jobs.update({s: (work / s, repr((base, KERNEL_FLAGS, sorted(headers.items()), s, units[s])), KERNEL_FLAGS)
                     for s in sources})
        keys = {s: hashlib.sha256(k.encode()).hexdigest() for s, (_, k, _) in jobs.items()}
        objects = {}
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:  # the units compile in parallel
            futures = {s: pool.submit(_cached, cache, keys[s], ".o", lambda out, src=src, s=s, extra=extra: _run(
                                          [*compile_, *extra, str(src), "-o", str(out)], s, timeout_s))
                       for s, (src, _, extra) in jobs.items()}
            objects = {s: f.result() for s, f in futures.items()}
        key = hashlib.sha256("".join(sorted(keys.values())).encode()).hexdigest()
        return _cached(cache, key, ".so", lambda out: _run(
            [cxx, *LINK_FLAGS, "-o", str(out), *map(str, objects.values())],
            "linking the CPU emulator", timeout_s))
