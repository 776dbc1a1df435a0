// Device helpers shared by softmax.cu and layer_norm.cu: storage <-> fp32 conversion, 16-byte
// vector loads, warp-shuffle and shared-memory row reductions, the mask view, the launcher's
// row-length buckets.  Pure CUDA (no torch): `nvcc -std=c++17 -arch=sm_80 -c` compiles it.
//
// Layout every row kernel uses: a row is split into VEC-element pieces (VEC = 16 bytes /
// sizeof(T): 4 fp32 or 8 fp16/bf16), piece p of a row belongs to thread p % THREADS, so one
// warp reads 32 consecutive 16-byte pieces = 512 contiguous bytes per instruction (coalesced).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include <type_traits>

#include "launchers.h"

namespace st {

constexpr int kWarp = 32;
constexpr int kWarpRowsPerBlock = 4;  // warp-per-row kernels: 4 rows (4 warps) per block

// ---- storage type <-> fp32: all arithmetic is fp32 whatever the storage --------------------
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T> __host__ __device__ constexpr int vec_width() { return 16 / static_cast<int>(sizeof(T)); }

template <typename T, int VEC> struct alignas(sizeof(T) * VEC) Pack { T v[VEC]; };

// Load the VEC elements at [col, col + VEC) of `row` as fp32; elements past `cols` read `fill`.
// `aligned` (decided once by the launcher: cols % VEC == 0 and 16-byte-aligned base pointers)
// selects one 16-byte load instead of VEC scalar loads; it is uniform, so no divergence.
template <typename T, int VEC>
__device__ __forceinline__ void load_piece(const T* row, int64_t col, int64_t cols, bool aligned,
                                           float (&out)[VEC], float fill) {
  if (aligned && col + VEC <= cols) {
    const Pack<T, VEC> p = *reinterpret_cast<const Pack<T, VEC>*>(row + col);
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = to_float(p.v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = col + k < cols ? to_float(row[col + k]) : fill;
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_piece(T* row, int64_t col, int64_t cols, bool aligned,
                                            const float (&in)[VEC]) {
  if (aligned && col + VEC <= cols) {
    Pack<T, VEC> p;
#pragma unroll
    for (int k = 0; k < VEC; ++k) p.v[k] = from_float<T>(in[k]);
    *reinterpret_cast<Pack<T, VEC>*>(row + col) = p;
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      if (col + k < cols) row[col + k] = from_float<T>(in[k]);
  }
}

// ---- reductions ----------------------------------------------------------------------------
struct F2 { float a, b; };  // two sums reduced together: one synchronization instead of two

__device__ __forceinline__ float shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ F2 shfl_xor(F2 v, int m) { return {shfl_xor(v.a, m), shfl_xor(v.b, m)}; }

struct SumOp {
  __device__ static float identity() { return 0.f; }
  __device__ float operator()(float x, float y) const { return x + y; }
};
struct MaxOp {
  __device__ static float identity() { return -CUDART_INF_F; }
  __device__ float operator()(float x, float y) const { return fmaxf(x, y); }
};
struct Sum2Op {
  __device__ static F2 identity() { return {0.f, 0.f}; }
  __device__ F2 operator()(F2 x, F2 y) const { return {x.a + y.a, x.b + y.b}; }
};
// Online softmax (Milakov & Gimelshein, 2018): a = running max m, b = sum of exp(x - m).
// Merging two partial states rescales each sum to the common max; an empty state (m = -inf)
// contributes nothing, which avoids exp(-inf - -inf) = NaN.
struct OnlineOp {
  __device__ static F2 identity() { return {-CUDART_INF_F, 0.f}; }
  __device__ F2 operator()(F2 x, F2 y) const {
    const float m = fmaxf(x.a, y.a);
    const float dx = x.a == -CUDART_INF_F ? 0.f : x.b * __expf(x.a - m);
    const float dy = y.a == -CUDART_INF_F ? 0.f : y.b * __expf(y.a - m);
    return {m, dx + dy};
  }
};

// Butterfly reduction over the 32 lanes of a warp: every lane ends with the full result.
template <typename V, typename Op> __device__ __forceinline__ V warp_reduce(V v, Op op) {
#pragma unroll
  for (int m = kWarp / 2; m > 0; m >>= 1) v = op(v, shfl_xor(v, m));
  return v;
}

// Reduce over the THREADS threads that share one row; every thread gets the result.
// THREADS == 32: warp shuffles only.  THREADS > 32: each warp reduces, its lane 0 writes one
// partial to shared memory (THREADS / 32 values), then every warp reduces the partials.
template <int THREADS, typename V, typename Op> __device__ __forceinline__ V row_reduce(V v, Op op) {
  v = warp_reduce(v, op);
  if constexpr (THREADS > kWarp) {
    constexpr int kWarps = THREADS / kWarp;
    static_assert(kWarps <= kWarp, "a row uses at most 32 warps");
    __shared__ V partial[kWarps];
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = warp_reduce(lane < kWarps ? partial[lane] : Op::identity(), op);
    __syncthreads();  // `partial` may be rewritten by the next call
  }
  return v;
}

// ---- additive mask and causal mode (both read on the fly, never materialized) --------------
// Row r of the (rows, cols) view splits into (i0, i1, i2) over sizes (*, size1, size2); the mask
// element for (r, c) is at i0*stride0 + i1*stride1 + i2*stride2 + c*col_stride (0 strides where
// the mask broadcasts).  Causal: with query length causal_len, row r is query r % causal_len
// and sees columns c <= r % causal_len.  The divisions happen once per row, not per element.
template <typename T> struct RowMask {
  const T* ptr;        // this row's mask base, or nullptr
  int64_t col_stride;
  int64_t last_col;    // columns after it are hidden (causal), else cols - 1

  __device__ RowMask(const MaskArgs& mask, int64_t causal_len, int64_t row, int64_t cols)
      : ptr(nullptr), col_stride(mask.col_stride), last_col(causal_len > 0 ? row % causal_len : cols - 1) {
    if (mask.ptr != nullptr) {
      const int64_t i2 = row % mask.size2, i1 = (row / mask.size2) % mask.size1;
      const int64_t i0 = row / (mask.size2 * mask.size1);
      ptr = static_cast<const T*>(mask.ptr) + i0 * mask.stride0 + i1 * mask.stride1 + i2 * mask.stride2;
    }
  }
  // x (already fp32) of column col < cols, after the mask.
  __device__ __forceinline__ float apply(float v, int64_t col) const {
    if (ptr != nullptr) v += to_float(ptr[col * col_stride]);
    return col > last_col ? -CUDART_INF_F : v;
  }
};

inline bool is_aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace st

// ---- launcher: one template instance per row-length bucket (LightSeq's launch_attn_softmax) ----
// A row of `cols` elements is ceil(cols / VEC) pieces; the first bucket whose THREADS * CHUNKS
// pieces cover it holds the row in registers (CHUNKS pieces of VEC floats per thread).  Short
// rows get one warp each (4 rows per block, shuffles only); longer rows get a block each.
// Rows beyond the last bucket (8192 fp32 / 16384 fp16 elements) take the looped kernel, which
// streams the row from global memory twice instead of holding it.
namespace st {

template <int N> using Int = std::integral_constant<int, N>;
constexpr int kLoopedThreads = 512;
constexpr int64_t kMaxRegisterPieces = 2048;  // = 512 threads x 4 chunks, the last bucket

template <typename Rows, typename Looped>
void dispatch_row_buckets(int64_t pieces, Rows&& launch_rows, Looped&& launch_looped) {
  if (pieces <= 32) launch_rows(Int<32>{}, Int<1>{});
  else if (pieces <= 64) launch_rows(Int<32>{}, Int<2>{});
  else if (pieces <= 128) launch_rows(Int<32>{}, Int<4>{});
  else if (pieces <= 512) launch_rows(Int<128>{}, Int<4>{});
  else if (pieces <= kMaxRegisterPieces) launch_rows(Int<512>{}, Int<4>{});
  else launch_looped();
}

// Grid and block of the register kernels: 4 rows per block of warps, else one row per block.
inline dim3 row_grid(int threads, int64_t rows) {
  return dim3(static_cast<unsigned>(threads == kWarp ? (rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock : rows));
}
inline dim3 row_block(int threads) { return threads == kWarp ? dim3(kWarp, kWarpRowsPerBlock) : dim3(threads); }

}  // namespace st

// Call FN<storage type>(args...) for a StDtype; unknown dtypes are a launch error.
// -DST_QUICK_CHECK (the test suite's compile check) instantiates every template for fp32 only,
// a third of the ptxas time; the full build and the before-commit check compile all three.
#ifdef ST_QUICK_CHECK
#define ST_DISPATCH_DTYPE(DTYPE, FN, ...)                             \
  switch (DTYPE) {                                                    \
    case ST_FLOAT32: return FN<float>(__VA_ARGS__);                   \
    default: return cudaErrorInvalidValue;                            \
  }
#else
#define ST_DISPATCH_DTYPE(DTYPE, FN, ...)                             \
  switch (DTYPE) {                                                    \
    case ST_FLOAT32: return FN<float>(__VA_ARGS__);                   \
    case ST_FLOAT16: return FN<__half>(__VA_ARGS__);                  \
    case ST_BFLOAT16: return FN<__nv_bfloat16>(__VA_ARGS__);          \
    default: return cudaErrorInvalidValue;                            \
  }
#endif
