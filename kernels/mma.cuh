// One warp-wide tensor-core multiply-add, d += a b, on 16 x 8 x 16 tiles, and the shared-memory
// load of its fragments (ldmatrix_x4, below).  The mma is PTX's
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 (sm_80+; PTX ISA, "Warp-level
// matrix multiply-accumulate instructions", mma.m16n8k16).  The fragments are registers whose
// element-to-lane mapping the ISA documents ("Matrix Fragments for mma.m16n8k16 with floating
// point type"), so a kernel can do arithmetic on them (FlashAttention-2's softmax on the score
// fragment, Dao 2023 Sec. 3.3), which WMMA's opaque fragments do not allow.  With g = lane / 4 and
// t = lane % 4:
//
//   a (A, 16 x 16 row-major, 4 x .b32 of two elements, the lower-indexed one in the low half):
//     a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   b (B, 16 x 8 "col": K-major, 2 x .b32):   b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
//   c, d (16 x 8 fp32):   d[0], d[1] = D[g][2t, 2t+1]     d[2], d[3] = D[g+8][2t, 2t+1]
//
// The CPU emulator (kernels/cuda_cpu, CUDA_EMU defined) runs the same calls as warp collectives
// that reassemble A and B from every lane's registers (and deal ldmatrix's rows out) by exactly
// these layouts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace st {

// The mma's element type: fp16 (T = __half) or bf16 (T = __nv_bfloat16); kEmu is StDtype's code;
// pack / unpack: two floats to and from one register of two elements (the lower one in the low half).
template <typename T> struct MmaType;
template <> struct MmaType<__half> {
  static constexpr int kEmu = 1;
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);  // .x (lo) in the low 16 bits, as a fragment wants
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  __device__ __forceinline__ static float2 unpack(uint32_t bits) {
    return __half22float2(*reinterpret_cast<const __half2*>(&bits));
  }
};
template <> struct MmaType<__nv_bfloat16> {
  static constexpr int kEmu = 2;
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  __device__ __forceinline__ static float2 unpack(uint32_t bits) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
  }
};

// d += a b for the whole warp (every lane must call it with its own fragments).
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(CUDA_EMU)
  ::cuda_emu::mma_sync(__FILE__, __LINE__, MmaType<T>::kEmu, d, a, b, d);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (MmaType<T>::kEmu == 1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // no tensor-core mma before sm_80: the launcher never picks a kernel using it there
#endif
}

// Four 8 x 8 matrices of 16-bit elements from shared memory as mma fragments, one instruction:
// PTX's ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (sm_75+).  Lane 8 i + r passes the
// address of row r of matrix i (16 bytes, 16-byte aligned); register i of every lane receives its
// fragment of matrix i, M_i[g][2t, 2t+1] (an A or K-major B fragment), or with TRANS of its
// transpose, M_i[2t, 2t+1][g] (a B fragment of a row-major matrix such as V).
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&d)[4], const void* row) {
#if defined(CUDA_EMU)
  ::cuda_emu::ldmatrix_x4(__FILE__, __LINE__, TRANS, d, row);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(addr));
  }
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

}  // namespace st
