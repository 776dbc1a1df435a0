"""Compile the Triton kernels for a GPU architecture on a machine without a GPU.

The interpreter (TRITON_INTERPRET=1) runs a kernel as numpy code, so it accepts Python that
Triton's compiler rejects (a variable first assigned inside a loop and used after it, a
`break`, a list); `triton.compile` with an explicit target runs the real pipeline (Triton IR ->
LLVM -> PTX -> cubin through ptxas) without a device.  The tests and the a1 grader use it so
that a kernel that passes on CPU also builds for sm_80.  Results are cached by Triton
($TRITON_CACHE_DIR, default ~/.triton/cache): a second run of unchanged kernels is instant.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from types import ModuleType

__all__ = ["KERNEL_SIGNATURES", "compile_kernel", "compile_module", "compile_ptx", "local_memory_bytes"]

_I, _F = "i32", "*fp32"
_MASK_ARGS = dict(rows=_I, cols=_I, causal_len=_I, m_size1=_I, m_size2=_I, m_stride0=_I, m_stride1=_I,
                  m_stride2=_I, m_col_stride=_I)

# kernel name -> (signature with the storage pointer type as "{T}", constexpr configurations)
KERNEL_SIGNATURES = {
    "softmax_fwd_kernel": (
        dict(x_ptr="{T}", y_ptr="{T}", mask_ptr="{T}", **_MASK_ARGS),
        [dict(HAS_MASK=True, CAUSAL=True, SINGLE_TILE=True, BLOCK_M=4, BLOCK_N=1024),
         dict(HAS_MASK=True, CAUSAL=True, SINGLE_TILE=False, BLOCK_M=1, BLOCK_N=8192)]),
    "softmax_bwd_kernel": (
        dict(y_ptr="{T}", dy_ptr="{T}", dx_ptr="{T}", rows=_I, cols=_I),
        [dict(SINGLE_TILE=True, BLOCK_M=4, BLOCK_N=1024), dict(SINGLE_TILE=False, BLOCK_M=1, BLOCK_N=8192)]),
    "layer_norm_fwd_kernel": (
        dict(x_ptr="{T}", w_ptr="{T}", b_ptr="{T}", y_ptr="{T}", mean_ptr=_F, rstd_ptr=_F, rows=_I, cols=_I,
             eps="fp32"),
        [dict(HAS_W=True, HAS_B=True, SINGLE_TILE=True, BLOCK_M=4, BLOCK_N=1024),
         dict(HAS_W=True, HAS_B=True, SINGLE_TILE=False, BLOCK_M=1, BLOCK_N=8192)]),
    "layer_norm_bwd_dx_kernel": (
        dict(dy_ptr="{T}", x_ptr="{T}", w_ptr="{T}", mean_ptr=_F, rstd_ptr=_F, dx_ptr="{T}", part_w_ptr=_F,
             part_b_ptr=_F, rows=_I, cols=_I),
        [dict(HAS_W=True, PARTIALS=True, SINGLE_TILE=True, BLOCK_M=4, BLOCK_N=1024),
         dict(HAS_W=True, PARTIALS=False, SINGLE_TILE=True, BLOCK_M=1, BLOCK_N=8192),
         dict(HAS_W=True, PARTIALS=False, SINGLE_TILE=False, BLOCK_M=1, BLOCK_N=8192)]),
    "layer_norm_bwd_dwdb_kernel": (
        dict(dy_ptr="{T}", x_ptr="{T}", mean_ptr=_F, rstd_ptr=_F, part_w_ptr=_F, part_b_ptr=_F, rows=_I, cols=_I),
        [dict(ROWS_PER_GROUP=256, BLOCK_M=64, BLOCK_N=64)]),
}


def compile_module(module: ModuleType, *, arch: int = 80, storage: str = "fp16",
                   kernels: tuple[str, ...] | None = None) -> list[dict]:
    """Compile every kernel of KERNEL_SIGNATURES that `module` defines (those named in `kernels`
    only, when given), in each configuration, for sm_{arch}.  Returns one row per compilation (kernel, config, seconds, shared bytes).
    A compile failure raises AssertionError naming the kernel, its configuration and the
    compiler's message (NotImplementedError for an untouched stub).  The module must have been
    imported WITHOUT the interpreter (its kernels must be JITFunctions)."""
    import triton

    rows = []
    for name, (signature, configs) in KERNEL_SIGNATURES.items():
        fn = getattr(module, name, None)
        if fn is None or (kernels is not None and name not in kernels):
            continue
        if not isinstance(fn, triton.runtime.JITFunction):
            raise TypeError(f"{name} is not a @triton.jit function compiled for a GPU "
                            "(was the module imported under TRITON_INTERPRET=1?)")
        for config in configs:
            start = time.perf_counter()
            try:
                kernel = compile_kernel(fn, signature, config, arch, storage)
            except Exception as exc:
                if "NotImplementedError" in str(exc):  # an untouched stub: the raise is still there
                    raise NotImplementedError(f"{name} still raises NotImplementedError") from exc
                raise AssertionError(f"{name} {config} does not compile for sm_{arch}: {_error(exc)}") from exc
            rows.append({"kernel": name, "config": config, "seconds": time.perf_counter() - start,
                         "shared_bytes": kernel.metadata.shared})
    return rows


def compile_kernel(fn, signature: dict, config: dict, arch: int, storage: str, options: dict | None = None):
    """triton.compile of `fn` for sm_{arch} with "{T}" pointers of `storage`, `config` constexpr,
    and compile `options` (num_warps, num_stages)."""
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silence Triton 3.9's FutureWarning
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {k: v.replace("{T}", f"*{storage}") for k, v in signature.items()}
    return triton.compile(ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in config}}, constexprs=config),
                          target=GPUTarget("cuda", arch, 32), options=options)


def compile_ptx(module: ModuleType, name: str, *, arch: int = 80, storage: str = "fp16") -> str:
    """The PTX of kernel `name` (KERNEL_SIGNATURES, first configuration) for sm_{arch}: what the
    GPU runs, readable without one (e.g. whether `a * b + c` became fma.rn.f32)."""
    signature, configs = KERNEL_SIGNATURES[name]
    return compile_kernel(getattr(module, name), signature, configs[0], arch, storage).asm["ptx"]


def local_memory_bytes(kernel) -> int:
    """Bytes a thread of the compiled `kernel` keeps in local memory (registers ptxas spilled, arrays
    it could not keep in registers): the STACK figure of cuobjdump's resource usage of its cubin, the
    tool Triton ships beside ptxas. Without a GPU nothing else reports it (the driver does, on load);
    local memory is DRAM behind the L1, so kilobytes of it a thread turn a tile loop memory-bound."""
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        report = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name],
                                capture_output=True, text=True, timeout=60, check=True).stdout
    stacks = re.findall(r"STACK:(\d+)", report)
    if not stacks:
        raise RuntimeError(f"cuobjdump printed no STACK figure: {report[-300:]!r}")
    return max(int(b) for b in stacks)


def _error(exc: Exception) -> str:
    """Where and what of a Triton CompilationError, whose message lists the kernel's source
    between the two: "at 18:38: `y = x * scale + oops`: NameError(...)"."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    if len(lines) < 3 or not lines[-2].strip().startswith("^"):
        return " ".join(str(exc).split())[-400:]
    return f"{lines[0].strip()} `{lines[-3].strip()}`: {lines[-1].strip()}"[:600]
