"""kernels/attention_mma.cu and attention_mma_bwd.cu, FlashAttention-2's forward and backward on
tensor cores (mma.sync m16n8k16, ldmatrix, cp.async), run on the CPU by the CUDA emulator, whose mma
rebuilds A and B from every lane's registers by the PTX ISA's fragment layout
(kernels/cuda_cpu/runtime.cpp, mma_m16n8k16):

* O and L, and dQ, dK, dV, against torch's attention in float64 on the same rounded inputs: head
  dims 64 and 128, fp16 and bf16, causal and not, sequences that end inside a 64-row block and a
  tile, seq_q != seq_k, several CTAs and heads, scores large enough to move the running max;
* what the kernels do not run (fp32, other head dims) is refused with a clear error;
* planted wrong fragment layouts (V's B fragment loaded by ldmatrix without .trans, Q's A
  registers in the wrong order) compile, run, and give wrong numbers: the emulator models the
  layouts, it does not ignore them;
* the K tile read before its cp.async copy was waited for is stopped (the copy had not landed);
* the emulator's mma and ldmatrix themselves: one warp's D = A B + C from fragments written out
  by the ISA's table or loaded by ldmatrix (plain and .trans), and a lane that leaves before the
  mma is named.
The GPU runs against SDPA: test_attention_mma_gpu.py, and test_attention_triton.py's `gpu` tests with
backend "cuda" (fp16 / bf16 at head dim 64 and 128 pick these kernels); the compile check:
test_attention_mma_compile.py."""

import ctypes
import shutil

import pytest
import torch
import torch.nn.functional as F

from scaletrain.ops.interface import KERNELS_DIR
from scaletrain.ops.testing import attention_grad_atol
from scaletrain.ops.toolchain.attention_cuda_cpu import MMA_SOURCES
from scaletrain.testing import TOLERANCE, assert_close

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="no host C++ compiler: the CUDA emulator cannot build")


def _reference(q, k, v, causal):
    qd, kd, vd = (t.double() for t in (q, k, v))
    seq_q, seq_k, d = q.shape[1], k.shape[1], q.shape[2]
    hidden = torch.full((seq_q, seq_k), -torch.inf, dtype=torch.float64).triu(1) if causal else 0.0
    return (F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal),
            torch.logsumexp(qd @ kd.transpose(1, 2) / d ** 0.5 + hidden, -1))


def _inputs(bh, seq_q, seq_k, d, dtype, seed=0, gain=1.0):
    gen = torch.Generator().manual_seed(seed)
    return tuple((gain * torch.randn(bh, s, d, generator=gen)).to(dtype) for s in (seq_q, seq_k, seq_k))


# gain 5: scores of +-100 and more, whose row max moves from tile to tile (the rescale of O and l)
@pytest.mark.parametrize("bh,seq_q,seq_k,d,causal,dtype,gain", [
    (2, 70, 70, 64, True, torch.float16, 1), (3, 17, 17, 64, False, torch.bfloat16, 1),
    (1, 130, 90, 64, True, torch.bfloat16, 1), (1, 33, 150, 128, False, torch.float16, 1),
    (2, 64, 128, 128, True, torch.bfloat16, 1), (1, 1, 1, 128, True, torch.float16, 1),
    (1, 100, 200, 64, False, torch.float16, 5)])
def test_attention_mma_cu_matches_torch_in_the_emulator(bh, seq_q, seq_k, d, causal, dtype, gain):
    from scaletrain.ops.toolchain.attention_cuda_cpu import attention_fwd_mma
    q, k, v = _inputs(bh, seq_q, seq_k, d, dtype, gain=gain)
    o, lse = attention_fwd_mma(q, k, v, causal)
    ref_o, ref_lse = _reference(q, k, v, causal)
    # P is rounded to the storage type before P V, as in FlashAttention-2: one storage rounding
    assert_close(o, ref_o, rtol=TOLERANCE[dtype], what="O")
    assert_close(lse, ref_lse, rtol=TOLERANCE[torch.float32], what="L")


@pytest.mark.parametrize("bh,seq_q,seq_k,d,causal,dtype", [
    (2, 70, 70, 64, True, torch.float16), (1, 33, 100, 64, False, torch.bfloat16),
    (1, 90, 40, 128, True, torch.float16), (2, 17, 50, 128, False, torch.bfloat16)])
def test_attention_mma_bwd_cu_matches_torch_in_the_emulator(bh, seq_q, seq_k, d, causal, dtype):
    """dQ, dK, dV of attention_mma_bwd.cu from attention_mma.cu's O and L, against float64 autograd:
    P and dS are rounded to the storage type before their mma, as in FlashAttention-2."""
    from scaletrain.ops.toolchain.attention_cuda_cpu import attention_bwd_mma, attention_fwd_mma
    q, k, v = _inputs(bh, seq_q, seq_k, d, dtype, seed=3)
    do = torch.randn(bh, seq_q, d, generator=torch.Generator().manual_seed(4)).to(dtype)
    o, lse = attention_fwd_mma(q, k, v, causal)
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*ref, is_causal=causal).backward(do.double())
    atol = attention_grad_atol(q, k, v, do, storage=dtype)  # where dS = P (dP - D) cancels (one key)
    for name, got, r in zip(("dQ", "dK", "dV"), attention_bwd_mma(do, q, k, v, o, lse, causal), ref):
        assert_close(got, r.grad, rtol=4 * TOLERANCE[dtype], atol=atol[name], what=name)


@pytest.mark.parametrize("dtype,d", [(torch.float32, 64), (torch.float16, 80), (torch.bfloat16, 32)])
def test_what_the_tensor_core_kernels_do_not_run_is_refused(dtype, d):
    from scaletrain.ops.toolchain.attention_cuda_cpu import attention_bwd_mma, attention_fwd_mma
    q = torch.randn(1, 4, d).to(dtype)
    with pytest.raises(ValueError, match="fp16 / bf16 at head dim 64 or 128"):
        attention_fwd_mma(q, q, q)
    with pytest.raises(ValueError, match="fp16 / bf16 at head dim 64 or 128"):
        attention_bwd_mma(q, q, q, q, q, torch.zeros(1, 4))


def _planted(folder, good: str, bad: str):
    """kernels/'s attention_mma*.cu and headers copied into `folder`, `good` replaced by `bad` in the
    one file that holds it."""
    holders = []
    for path in [*(KERNELS_DIR / s for s in MMA_SOURCES), *KERNELS_DIR.glob("*.cuh"), *KERNELS_DIR.glob("*.h")]:
        text = path.read_text()
        holders += [path.name] * text.count(good)
        (folder / path.name).write_text(text.replace(good, bad))
    assert len(holders) == 1, f"the planted line should be in one place, found in {holders or 'none'}: {good!r}"
    return folder


# (the line of attention_mma.cuh, its planted replacement): each keeps the kernel compiling and in bounds
PLANTS = {
    "V's B fragment loaded without .trans (row-major V where the mma wants it K-major)": (
        "ldmatrix_x4<true>(vb, ", "ldmatrix_x4<false>(vb, "),
    "Q's A registers 1 and 2 swapped (rows g+8 and columns 2t+8 exchanged)": (
        "const int64_t qr = row[r % 2];\n"
        "      a[s][r] = qr < n ? pair(src + qr * D + s * 16 + 2 * t + 8 * (r / 2)) : 0u;",
        "const int64_t qr = row[r / 2];\n"
        "      a[s][r] = qr < n ? pair(src + qr * D + s * 16 + 2 * t + 8 * (r % 2)) : 0u;"),
}


@pytest.mark.parametrize("plant", list(PLANTS), ids=["transposed_b", "swapped_a_registers"])
def test_a_planted_wrong_fragment_layout_gives_wrong_numbers(plant, tmp_path):
    from scaletrain.ops.toolchain.attention_cuda_cpu import attention_fwd_mma
    q, k, v = _inputs(2, 40, 64, 64, torch.float16, seed=1)
    o, _ = attention_fwd_mma(q, k, v, False, folder=_planted(tmp_path, *PLANTS[plant]))
    assert o.isfinite().all(), "the plant should run to the end and give wrong numbers, not crash"
    with pytest.raises(AssertionError, match="O"):
        assert_close(o, _reference(q, k, v, False)[0], rtol=TOLERANCE[torch.float16], what="O")


def test_a_read_before_the_async_copy_landed_is_stopped(tmp_path):
    """cp.async lands at the wait that releases it (the emulator's model): without the wait for K,
    the scores read a tile no thread has written yet."""
    from scaletrain.ops.toolchain import cuda_cpu
    from scaletrain.ops.toolchain.attention_cuda_cpu import attention_fwd_mma
    wait = "    cp_async_wait<0>();  // this thread's copies of K have landed\n"
    q, k, v = _inputs(1, 16, 16, 64, torch.float16)
    with pytest.raises(cuda_cpu.KernelError, match="k_s.* that no thread of this block has written"):
        attention_fwd_mma(q, k, v, folder=_planted(tmp_path, wait, ""))


TOY = r"""
#include "mma.cuh"
// one warp: D = A B + C with A, B (16 x 16) fp16 row-major and C, D (16 x 16) fp32: two mma, one per
// 8 columns of B.  mode 0: the fragments filled from global memory by the PTX ISA's table (mma.cuh);
// mode 1: by ldmatrix from shared memory (B with .trans); mode 2: lane 31 exits before the mma
__global__ void toy(const uint16_t* a, const uint16_t* b, const float* c, float* d, int mode) {
  __shared__ __align__(16) uint16_t a_s[16][16], b_s[16][16];
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  for (int i = lane; i < 256; i += 32) {
    a_s[i / 16][i % 16] = a[i];
    b_s[i / 16][i % 16] = b[i];
  }
  __syncwarp();
  if (mode == 2 && lane == 31) return;
  uint32_t fa[4], fb[4];  // fb: {b[0], b[1]} of columns 0-7, then of columns 8-15
  if (mode == 1) {
    st::ldmatrix_x4<false>(fa, &a_s[lane / 8 % 2 * 8 + lane % 8][lane / 16 * 8]);
    st::ldmatrix_x4<true>(fb, &b_s[lane / 8 % 2 * 8 + lane % 8][lane / 16 * 8]);
  } else {
    for (int r = 0; r < 4; ++r) {
      const int row = g + 8 * (r % 2), col = 2 * t + 8 * (r / 2);
      fa[r] = a[row * 16 + col] | static_cast<uint32_t>(a[row * 16 + col + 1]) << 16;
      const int k = 2 * t + 8 * (r % 2), n = g + 8 * (r / 2);
      fb[r] = b[k * 16 + n] | static_cast<uint32_t>(b[(k + 1) * 16 + n]) << 16;
    }
  }
  for (int half = 0; half < 2; ++half) {
    float acc[4];
    for (int e = 0; e < 4; ++e) acc[e] = c[(g + 8 * (e / 2)) * 16 + half * 8 + 2 * t + e % 2];
    const uint32_t fbh[2] = {fb[2 * half], fb[2 * half + 1]};
    st::mma_m16n8k16<__half>(acc, fa, fbh);
    for (int e = 0; e < 4; ++e) d[(g + 8 * (e / 2)) * 16 + half * 8 + 2 * t + e % 2] = acc[e];
  }
}
extern "C" int run_toy(const uint16_t* a, const uint16_t* b, const float* c, float* d, int mode) {
  toy<<<1, 32>>>(a, b, c, d, mode);
  return cudaGetLastError();
}
"""


def test_the_emulated_mma_and_ldmatrix_follow_the_ptx_fragment_tables(tmp_path):
    from scaletrain.ops.toolchain import cuda_cpu
    (tmp_path / "toy.cu").write_text(TOY)
    lib = cuda_cpu.load(tmp_path, sources=("toy.cu",))
    lib.dll.run_toy.restype, lib.dll.run_toy.argtypes = ctypes.c_int, [ctypes.c_void_p] * 4 + [ctypes.c_int]
    gen = torch.Generator().manual_seed(2)
    a, b, c = torch.randn(16, 16, generator=gen).half(), torch.randn(16, 16, generator=gen).half(), torch.randn(
        16, 16, generator=gen)
    for mode, how in ((0, "fragments by the table"), (1, "ldmatrix")):
        d = torch.full((16, 16), float("nan"))
        lib.call("toy mma", "run_toy", a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(), mode)
        assert_close(d, a.double() @ b.double() + c.double(), rtol=1e-6, what=f"D = A B + C, {how}")
    with pytest.raises(cuda_cpu.KernelError, match=r"mma\.sync\.m16n8k16 .*lane 31 .*has exited"):
        lib.call("toy mma", "run_toy", a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(), 2)
