"""Every kernel builds for a GPU, checked on a machine without one.

* CUDA: each kernels/*.cu is compiled by nvcc for sm_80 (compile-only, `-Xptxas -v`), both
  files in parallel; the register / spill report is printed and spills fail the test.  The suite
  builds with -DST_QUICK_CHECK (every template instantiated for fp32 only, a third of the time);
  the fp16 / bf16 instances are compiled by the before-commit hook and by the GPU build.
  torch_binding.cpp needs torch's CUDA headers and is compiled only where the extension is built
  (test_kernels_cuda.py, GPU).
* Triton: each kernel, in its single-tile and looped configurations, goes through Triton's real
  compiler to an sm_80 cubin (scaletrain/ops/toolchain/triton_compile.py), in a worker process with the
  interpreter off.  The interpreter tests alone would accept code the compiler rejects.
"""

import importlib.util
import shutil

import pytest

from scaletrain.ops.toolchain import nvcc
from scaletrain.ops.backends import KERNELS_DIR
from scaletrain.ops.toolchain.isolated import IsolatedWorker

CU_FILES = sorted(KERNELS_DIR.glob("*.cu"))
NVCC = shutil.which("nvcc")


def test_cuda_sources_are_torch_free_and_binding_is_the_only_torch_file():
    assert {p.name for p in CU_FILES} >= {"softmax.cu", "layer_norm.cu"}
    for path in CU_FILES:
        assert "torch/extension.h" not in path.read_text(), f"{path.name} must compile without torch"
    assert "torch/extension.h" in (KERNELS_DIR / "torch_binding.cpp").read_text()


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed: CUDA sources not compiled here")
def test_every_cu_file_compiles_for_sm80_without_spills():
    procs = nvcc.start(CU_FILES)
    for path in CU_FILES:
        report = nvcc.finish(procs, path.name)  # AssertionError on a compile error or a spill
        print(f"\n{path.name}: {len(report)} kernels (fp32 instances)")
        for mangled, (regs, spills) in report.items():
            print(f"  {regs:>4} registers  {spills:>3} B spilled  {mangled[:90]}")
        declared = path.read_text().count("__global__")
        assert len(report) >= declared, f"{path.name}: {declared} __global__ kernels, {len(report)} compiled"


def test_global_writers_reads_the_ptx_state_spaces():
    ptx = (".visible .entry _Z5writePf(\n.param .u64 p)\n{\n\tst.global.f32 [%rd1], %f1;\n\tret;\n}\n"
           ".visible .entry _Z7scratchPf(\n.param .u64 p)\n{\n\tst.shared.f32 [%r1], %f1;\n"
           "\tst.volatile.shared.u32 [%r2], %r3;\n\tld.param.u64 %rd1, [p];\n\tret;\n}\n"
           ".visible .entry _Z6atomicPf(\n.param .u64 p)\n{\n\tred.global.add.f32 [%rd1], %f1;\n}\n")
    assert nvcc.global_writers(ptx) == {"_Z5writePf", "_Z6atomicPf"}


def test_ptxas_report_parser():
    log = ("ptxas info    : Compiling entry function '_Z1kPf' for 'sm_80'\n"
           "ptxas info    : Function properties for _Z1kPf\n"
           "    0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
           "ptxas info    : Used 255 registers, 360 bytes cmem[0]\n")
    assert nvcc.ptxas_report(log) == {"_Z1kPf": (255, 8)}


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_a_compile_error_fails_and_only_successes_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALETRAIN_NVCC_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "bad.cu"
    bad.write_text('__global__ void k(float* y) { y[threadIdx.x] = undeclared; }\n')
    for _ in range(2):  # a failure is never remembered
        with pytest.raises(AssertionError, match="undeclared"):
            nvcc.finish(nvcc.start([bad]), "bad.cu")
    empty = tmp_path / "empty.cu"  # a stub whose #error line was deleted: compiles, computes nothing
    empty.write_text('__global__ void k(float* y) { }\n__global__ void w(float* y) { y[0] = 1.f; }\n')
    with pytest.raises(AssertionError, match="never store to global memory"):
        nvcc.finish(nvcc.start([empty]), "empty.cu")
    good = tmp_path / "good.cu"
    good.write_text('__global__ void k(float* y) { y[threadIdx.x] = 1.f; }\n')
    first = nvcc.start([good])
    assert nvcc.finish(first, "good.cu") and hasattr(first["good.cu"], "pid")
    good.write_text("// only a comment differs\n" + good.read_text())
    second = nvcc.start([good])
    assert nvcc.finish(second, "good.cu") == nvcc.finish(first, "good.cu") and not hasattr(second["good.cu"], "pid")


def _compile_triton_kernels():
    from scaletrain.ops.backends import load_kernel_module
    from scaletrain.ops.toolchain.triton_compile import compile_module
    rows = []
    for name in ("softmax_triton.py", "layer_norm_triton.py"):
        rows += compile_module(load_kernel_module(KERNELS_DIR / name))
    return [(r["kernel"], r["config"].get("SINGLE_TILE"), round(r["seconds"], 2)) for r in rows]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="the triton package is not installed")
def test_triton_kernels_compile_for_sm80():
    with IsolatedWorker({"TRITON_INTERPRET": "0"}, timeout_s=300) as worker:
        rows = worker.run(_compile_triton_kernels)
    for row in rows:
        print(row)
    compiled = {(kernel, single) for kernel, single, _ in rows}
    for kernel in ("softmax_fwd_kernel", "softmax_bwd_kernel", "layer_norm_fwd_kernel", "layer_norm_bwd_dx_kernel"):
        assert {(kernel, True), (kernel, False)} <= compiled, kernel
    assert ("layer_norm_bwd_dwdb_kernel", None) in compiled


def _compile_error_of(path: str) -> str:
    from scaletrain.ops.backends import load_kernel_module
    from scaletrain.ops.toolchain.triton_compile import compile_module
    try:
        compile_module(load_kernel_module(path, name="broken_softmax"), kernels=("softmax_bwd_kernel",))
    except AssertionError as exc:
        return str(exc)
    return "compiled"


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="the triton package is not installed")
def test_a_triton_compile_error_names_the_code_line_and_the_error(tmp_path):
    """Triton's message lists the kernel's source between where and what: the report keeps both ends."""
    line = "dot = tl.sum(y * dy, axis=1)"
    broken = tmp_path / "softmax_triton.py"
    broken.write_text((KERNELS_DIR / "softmax_triton.py").read_text().replace(line, line + " + oops", 1))
    with IsolatedWorker({"TRITON_INTERPRET": "0"}, timeout_s=300) as worker:
        message = worker.run(_compile_error_of, str(broken))
    assert f"`{line} + oops`" in message and "NameError" in message, message
