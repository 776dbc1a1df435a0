"""CUDA kernels checked on a CPU: kernels/*.cu compiled unmodified as host C++ and run by an emulator.

The same softmax.cu and layer_norm.cu that nvcc builds for the GPU (cuda_ext.py) are compiled
by g++ with the shim in kernels/cuda_cpu/ (cuda_cpu.h: the CUDA subset the course uses, and
what it cannot model; runtime.cpp: the scheduler and its checks; README.md: both, with
examples), after two textual rewrites (cuda_cpu_build.py, which also caches the builds).

`make_backend(folder)` is a scaletrain.ops Backend ("cuda-cpu") over CPU tensors: each call
copies its inputs into guarded buffers (read-only, ending flush against an inaccessible page),
fills its outputs with NaN, calls the extern "C" launcher of launchers.h through ctypes and
copies the outputs back.  A fault, a shared-memory race (a read not ordered after the write by a
barrier), a barrier or warp collective that not every thread reaches, or a launch over the time
limit raises `KernelError` naming the kernel, the block and the thread;
`naming_kernels()` adds the kernels the last call ran to a failed comparison's message.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import subprocess
import threading
from pathlib import Path

import torch

from scaletrain.ops.toolchain.cuda_cpu_build import SHIM_DIR, SOURCES, build, rewrite
from scaletrain.ops.interface import BACKEND_DTYPES, KERNELS_DIR, Backend
from scaletrain.ops.mask import MaskView

__all__ = ["SOURCES", "SHIM_DIR", "KernelError", "rewrite", "build", "load", "make_backend", "last_launches",
           "naming_kernels"]

_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # StDtype of launchers.h


class KernelError(RuntimeError):
    """A launch the emulator stopped: out-of-bounds access, divergent barrier or collective, timeout."""


# ---- the loaded library -------------------------------------------------------------------------
class _MaskArgs(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), *[(f, ctypes.c_int64) for f in
                ("size1", "size2", "stride0", "stride1", "stride2", "col_stride")]]


def _thread_locals(path: Path) -> list[tuple[int, int, str]]:
    """(offset, bytes, demangled name) of the library's thread-local symbols: its static
    __shared__ variables (cuda_cpu.h), named in race reports.  Empty without binutils' readelf."""
    readelf = shutil.which("readelf")
    if readelf is None:
        return []
    listing = subprocess.run([readelf, "-sW", "--demangle", str(path)], capture_output=True, text=True,
                             timeout=60).stdout
    found = {}
    for line in listing.splitlines():  # Num: Value Size Type Bind Vis Ndx Name
        parts = line.split(None, 7)
        if len(parts) == 8 and parts[3] == "TLS" and parts[6] != "UND":
            found[int(parts[1], 16)] = (int(parts[2]), parts[7].replace("st::", ""))
    return [(offset, size, name) for offset, (size, name) in sorted(found.items())]


class _Library:
    """The loaded emulator: the launchers of launchers.h and the emulator's own API."""

    def __init__(self, path: Path):
        self.path = path
        self.dll = ctypes.CDLL(str(path))
        self.lock = threading.Lock()
        c = ctypes
        sig = {"cuda_emu_alloc": (c.c_void_p, [c.c_size_t, c.c_char_p]),
               "cuda_emu_set_writable": (c.c_int, [c.c_void_p, c.c_int]),
               "cuda_emu_free": (None, [c.c_void_p]), "cuda_emu_set_time_limit": (None, [c.c_double]),
               "cuda_emu_take_trace": (c.c_char_p, []), "cuda_emu_error_message": (c.c_char_p, []),
               "cuda_emu_convert": (None, [c.c_int, c.c_void_p, c.c_void_p, c.c_int64]),
               "st_softmax_fwd": (c.c_int, [c.c_int, c.c_void_p, c.c_void_p, c.c_int64, c.c_int64, _MaskArgs,
                                            c.c_int64, c.c_void_p]),
               "st_softmax_bwd": (c.c_int, [c.c_int, c.c_void_p, c.c_void_p, c.c_void_p, c.c_int64, c.c_int64,
                                            c.c_void_p]),
               "st_layer_norm_fwd": (c.c_int, [c.c_int, *[c.c_void_p] * 6, c.c_int64, c.c_int64, c.c_float,
                                               c.c_void_p]),
               "st_layer_norm_bwd": (c.c_int, [c.c_int, *[c.c_void_p] * 9, c.c_int64, c.c_int64, c.c_void_p]),
               "st_layer_norm_bwd_workspace": (c.c_int64, [c.c_int64, c.c_int64])}
        for name, (res, args) in sig.items():
            if hasattr(self.dll, name):  # a library of softmax.cu alone has no layer_norm launchers
                fn = getattr(self.dll, name)
                fn.restype, fn.argtypes = res, args
        self.dll.cuda_emu_name_shared.argtypes = [c.c_long, c.c_long, c.c_char_p]
        for offset, size, name in _thread_locals(path):
            self.dll.cuda_emu_name_shared(offset, size, name.encode())

    def call(self, what: str, launcher: str, *args) -> None:
        """One launcher call: its launches recorded, a failure raised as KernelError."""
        self.dll.cuda_emu_set_time_limit(float(os.environ.get("SCALETRAIN_CUDA_CPU_TIMEOUT", "120")))
        self.dll.cuda_emu_take_trace()
        rc = getattr(self.dll, launcher)(*args)
        _LAST[:] = self.dll.cuda_emu_take_trace().decode().splitlines()
        if rc != 0:
            raise KernelError(f"{what} (CUDA emulated on the CPU): {self.dll.cuda_emu_error_message().decode()}")


_LAST: list[str] = []  # the launches of the last launcher call, any library


@functools.cache
def _load(path: str) -> _Library:
    return _Library(Path(path))


@functools.cache
def _load_folder(folder: str, include: str, sources: tuple[str, ...]) -> _Library:
    return _load(str(build(folder, include=include, sources=sources)))


def load(folder: Path | str = KERNELS_DIR, *, include: Path | str = KERNELS_DIR, sources=SOURCES) -> _Library:
    """Build (or find in the cache) and load the emulator library of `folder`, once per process."""
    return _load_folder(str(Path(folder).resolve()), str(Path(include).resolve()), tuple(sources))


class _Buffers:
    """Guarded copies of one call's tensors; freed on exit."""

    def __init__(self, lib: _Library):
        self.lib, self.owned = lib, []

    def _alloc(self, nbytes: int, name: str) -> tuple[int, torch.Tensor]:
        ptr = self.lib.dll.cuda_emu_alloc(max(nbytes, 1), name.encode())
        if not ptr:
            raise MemoryError(f"the CUDA emulator could not map {nbytes} bytes for {name}")
        self.owned.append(ptr)
        return ptr, torch.frombuffer((ctypes.c_char * max(nbytes, 1)).from_address(ptr), dtype=torch.uint8)[:nbytes]

    def input(self, t: torch.Tensor | None, name: str) -> int | None:
        if t is None:
            return None
        t = t.detach().contiguous()
        ptr, raw = self._alloc(t.numel() * t.element_size(), name)
        raw.view(t.dtype).copy_(t.reshape(-1))
        self.lib.dll.cuda_emu_set_writable(ptr, 0)
        return ptr

    def output(self, shape, dtype: torch.dtype, name: str) -> tuple[int, torch.Tensor]:
        numel = 1
        for s in shape:
            numel *= s
        ptr, raw = self._alloc(numel * torch.empty((), dtype=dtype).element_size(), name)
        view = raw.view(dtype).view(*shape)
        view.fill_(float("nan"))  # an element no thread writes stays NaN
        return ptr, view

    def __enter__(self):
        self.lib.lock.acquire()
        return self

    def __exit__(self, *exc):
        for ptr in self.owned:
            self.lib.dll.cuda_emu_free(ptr)
        self.lib.lock.release()


def _mask_args(buf: _Buffers, mask: MaskView | None) -> _MaskArgs:
    if mask is None:
        return _MaskArgs(None, 1, 1, 0, 0, 0, 0)
    t = mask.tensor  # broadcast: copy only the elements the strides reach, from data_ptr on
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    ptr = buf.input(t.as_strided((span,), (1,)), "mask")
    return _MaskArgs(ptr, *mask.kernel_args())


def _check(x: torch.Tensor, name: str) -> None:
    if x.device.type != "cpu":
        raise ValueError(f"backend 'cuda-cpu' runs the CUDA kernels on the CPU: {name} must be a CPU tensor, "
                         f"got {x.device} (use x.cpu(), or backend='cuda' on a GPU)")
    if x.dtype not in _DTYPES:
        raise TypeError(f"backend 'cuda-cpu' supports float32, float16 and bfloat16; {name} is {x.dtype}")


def make_backend(folder: Path | str = KERNELS_DIR, *, include: Path | str = KERNELS_DIR) -> Backend:
    """A Backend running `folder`'s .cu kernels in the emulator (built on the first kernel call).
    softmax.cu and layer_norm.cu make two libraries: one that does not compile leaves the other's
    functions working."""
    softmax_lib = functools.partial(load, folder, include=include, sources=("softmax.cu",))
    layer_norm_lib = functools.partial(load, folder, include=include, sources=("layer_norm.cu",))

    def softmax_fwd(x, mask: MaskView | None = None, causal_len: int = 0):
        _check(x, "x")
        lib = softmax_lib()
        with _Buffers(lib) as buf:
            xp = buf.input(x, "x")
            yp, y = buf.output(x.shape, x.dtype, "y")
            lib.call("softmax forward", "st_softmax_fwd", _DTYPES[x.dtype], xp, yp, x.shape[0], x.shape[1],
                     _mask_args(buf, mask), causal_len, None)
            return y.clone()

    def softmax_bwd(y, dy):
        _check(y, "y")
        lib = softmax_lib()
        with _Buffers(lib) as buf:
            yp, dyp = buf.input(y, "y"), buf.input(dy, "dy")
            dxp, dx = buf.output(y.shape, y.dtype, "dx")
            lib.call("softmax backward", "st_softmax_bwd", _DTYPES[y.dtype], yp, dyp, dxp, y.shape[0], y.shape[1],
                     None)
            return dx.clone()

    def layer_norm_fwd(x, weight, bias, eps):
        _check(x, "x")
        lib = layer_norm_lib()
        rows, cols = x.shape
        with _Buffers(lib) as buf:
            xp, wp, bp = buf.input(x, "x"), buf.input(weight, "weight"), buf.input(bias, "bias")
            yp, y = buf.output(x.shape, x.dtype, "y")
            mp, mean = buf.output((rows,), torch.float32, "mean")
            rp, rstd = buf.output((rows,), torch.float32, "rstd")
            lib.call("layer_norm forward", "st_layer_norm_fwd", _DTYPES[x.dtype], xp, wp, bp, yp, mp, rp, rows, cols,
                     eps, None)
            return y.clone(), mean.clone(), rstd.clone()

    def layer_norm_bwd(dy, x, weight, mean, rstd, need_dweight, need_dbias):
        _check(x, "x")
        lib = layer_norm_lib()
        rows, cols = x.shape
        with _Buffers(lib) as buf:
            ins = [buf.input(t, n) for t, n in ((dy, "dy"), (x, "x"), (weight, "weight"), (mean.float(), "mean"),
                                                 (rstd.float(), "rstd"))]
            dxp, dx = buf.output(x.shape, x.dtype, "dx")
            dwp, dw = buf.output((cols,), x.dtype, "dweight") if need_dweight else (None, None)
            dbp, db = buf.output((cols,), x.dtype, "dbias") if need_dbias else (None, None)
            wsp = None
            if need_dweight or need_dbias:
                wsp, _ = buf.output((lib.dll.st_layer_norm_bwd_workspace(rows, cols),), torch.float32, "workspace")
            lib.call("layer_norm backward", "st_layer_norm_bwd", _DTYPES[x.dtype], *ins, dxp, dwp, dbp, wsp, rows,
                     cols, None)
            return dx.clone(), None if dw is None else dw.clone(), None if db is None else db.clone()

    return Backend(name="cuda-cpu", softmax_fwd=softmax_fwd, softmax_bwd=softmax_bwd, layer_norm_fwd=layer_norm_fwd,
                   layer_norm_bwd=layer_norm_bwd, dtypes=BACKEND_DTYPES["cuda"])


def last_launches() -> list[str]:
    """The kernels ("name <<<grid, block, smem>>>") the last emulated launcher call ran."""
    return list(_LAST)


@contextlib.contextmanager
def naming_kernels():
    """Wrong numbers name the kernels that computed them: an AssertionError raised inside gains
    the emulator's last launches (a comparison sees the output, not which kernel wrote it)."""
    try:
        yield
    except AssertionError as exc:
        if not _LAST:
            raise
        raise AssertionError(f"{exc} [CUDA emulated on the CPU; kernels launched: {'; '.join(_LAST)}]") from exc
