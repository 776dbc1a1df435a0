"""kernels/attention_mma.cu and attention_mma_bwd.cu build for the GPUs they are launched on, checked
without one: nvcc for sm_80 (A100) and sm_90 (H100 / H200), every instance (fp16 / bf16 x head dim
64 / 128 x causal or not) through ptxas without spills and storing its outputs
(scaletrain.ops.toolchain.nvcc), and the forward's PTX holds the tensor-core mma.sync of both
element types, the ldmatrix loads (plain and .trans) and the cp.async copies, not the pre-sm_80
traps of mma.cuh and async_copy.cuh.  The flags are test_kernels_compile.py's (its sm_80
compilation of every kernels/*.cu is this one's, cached: -DST_QUICK_CHECK changes nothing in
these files, which instantiate fp16 and bf16 only); the numbers on the CPU:
test_attention_mma_cuda_cpu.py."""

import shutil
import subprocess

import pytest

from scaletrain.ops.backends import KERNELS_DIR
from scaletrain.ops.toolchain import nvcc

NVCC = shutil.which("nvcc")
SOURCES = [KERNELS_DIR / "attention_mma.cu", KERNELS_DIR / "attention_mma_bwd.cu"]

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed: CUDA sources not compiled here")


def test_attention_mma_compiles_for_sm80_and_sm90_without_spills():
    procs = {arch: nvcc.start(SOURCES, arch=arch) for arch in (80, 90)}
    for arch, proc in procs.items():
        for source, kernels in zip(SOURCES, (8, 16)):  # 2 dtypes x 2 head dims x causal or not (x dQ, dK dV)
            report = nvcc.finish(proc, source.name)  # AssertionError on an error, a spill, an idle kernel
            print(f"\n{source.name}, sm_{arch}:")
            for mangled, (regs, _) in sorted(report.items()):
                print(f"  {regs:>4} registers  {mangled[:90]}")
            assert len(report) == kernels, f"{source.name}, sm_{arch}: {len(report)} kernels, expected {kernels}"


def test_the_ptx_uses_mma_sync_ldmatrix_and_cp_async():
    ptx = subprocess.run([NVCC, "-std=c++17", "-arch=sm_80", f"-I{KERNELS_DIR}", "--ptx", "-o", "-", str(SOURCES[0])],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    for kind in ("f16.f16", "bf16.bf16"):
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.f32" in ptx, kind
    for load in ("ldmatrix.sync.aligned.m8n8.x4.shared.b16", "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                 "cp.async.cg.shared.global", "cp.async.wait_group 0"):
        assert load in ptx, load
    assert "trap;" not in ptx
