// Fused softmax over the last dimension, forward and backward, fp32 / fp16 / bf16 storage with
// fp32 arithmetic.  Pure CUDA: `nvcc -std=c++17 -arch=sm_80 -c kernels/softmax.cu`.
//
//   kernel                    idea
//   softmax_fwd_rows          row held in registers: one read of x, one write of y (2 MN elements
//                             of traffic vs 8 MN + 4 M for the naive PyTorch composition, see
//                             "Fused Kernels" in techniques-for-large-scale-training.md)
//   softmax_fwd_looped        rows too long for registers: pass 1 keeps an online (max, sum),
//                             pass 2 re-reads x and writes y (3 MN)
//   softmax_bwd_rows/_looped  dx = y * (dy - sum_j dy_j y_j): one row reduction, then elementwise
//
// Numerically stable: exp(x - max) never overflows.  Additive mask and causal mode are applied
// while loading (LightSeq's ker_attn_softmax with mask_future), so a mask costs only its own
// (usually broadcast, cache-resident) reads.  A row whose every entry is -inf gives NaN, as
// torch.softmax does.
#include "kernel_utils.cuh"

namespace st {

// One row per warp (THREADS == 32, blockDim = (32, 4)) or per block (blockDim = (THREADS, 1));
// each thread holds CHUNKS pieces of VEC elements: piece c starts at column
// (c * THREADS + threadIdx.x) * VEC.  Load with load_piece (-inf past the row), apply RowMask,
// row_reduce<THREADS> the max, exponentiate, row_reduce the sum, scale, store_piece.
template <typename T, int THREADS, int CHUNKS>
__global__ void __launch_bounds__(THREADS == kWarp ? kWarp * kWarpRowsPerBlock : THREADS)
softmax_fwd_rows(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols,
                 MaskArgs mask, int64_t causal_len, bool aligned) {
  constexpr int VEC = vec_width<T>();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // uniform per row: a whole warp (or block) leaves together
  // BEGIN SOLUTION
  const T* xr = x + row * cols;
  const RowMask<T> rmask(mask, causal_len, row, cols);
  float v[CHUNKS][VEC];
  float thread_max = -CUDART_INF_F;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t col = (static_cast<int64_t>(c) * THREADS + threadIdx.x) * VEC;
    load_piece<T, VEC>(xr, col, cols, aligned, v[c], -CUDART_INF_F);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      if (col + k < cols) v[c][k] = rmask.apply(v[c][k], col + k);
      thread_max = fmaxf(thread_max, v[c][k]);
    }
  }
  const float row_max = row_reduce<THREADS>(thread_max, MaxOp());
  float thread_sum = 0.f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      v[c][k] = __expf(v[c][k] - row_max);  // padding (-inf) becomes 0 and adds nothing
      thread_sum += v[c][k];
    }
  const float inv_sum = 1.f / row_reduce<THREADS>(thread_sum, SumOp());
  T* yr = y + row * cols;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[c][k] *= inv_sum;
    store_piece<T, VEC>(yr, (static_cast<int64_t>(c) * THREADS + threadIdx.x) * VEC, cols, aligned, v[c]);
  }
  // STUB: #error "a1 task 1.6: implement the register-resident softmax forward (see the handout)."
  // END SOLUTION
}

// One row per block of THREADS threads, any length: pass 1 strides over the row keeping the
// online (max, sum) per thread (OnlineOp merges two states), one row_reduce, pass 2 writes.
template <typename T, int THREADS>
__global__ void __launch_bounds__(THREADS)
softmax_fwd_looped(const T* __restrict__ x, T* __restrict__ y, int64_t cols, MaskArgs mask,
                   int64_t causal_len, bool aligned) {
  constexpr int VEC = vec_width<T>();
  const int64_t row = blockIdx.x;
  // BEGIN SOLUTION
  const T* xr = x + row * cols;
  const RowMask<T> rmask(mask, causal_len, row, cols);
  F2 state = OnlineOp::identity();  // (running max, sum of exp(x - running max))
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < cols; col += THREADS * VEC) {
    float v[VEC];
    load_piece<T, VEC>(xr, col, cols, aligned, v, -CUDART_INF_F);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      if (col + k < cols) v[k] = rmask.apply(v[k], col + k);
      state = OnlineOp()(state, F2{v[k], 1.f});
    }
  }
  state = row_reduce<THREADS>(state, OnlineOp());
  const float inv_sum = 1.f / state.b;
  T* yr = y + row * cols;
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < cols; col += THREADS * VEC) {
    float v[VEC];
    load_piece<T, VEC>(xr, col, cols, aligned, v, -CUDART_INF_F);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      if (col + k < cols) v[k] = rmask.apply(v[k], col + k);
      v[k] = __expf(v[k] - state.a) * inv_sum;
    }
    store_piece<T, VEC>(yr, col, cols, aligned, v);
  }
  // STUB: #error "a1 task 1.6: implement the looped softmax forward for long rows."
  // END SOLUTION
}

// dx = y * (dy - dot), dot = sum_j y_j dy_j: y and dy in registers, one row_reduce.
template <typename T, int THREADS, int CHUNKS>
__global__ void __launch_bounds__(THREADS == kWarp ? kWarp * kWarpRowsPerBlock : THREADS)
softmax_bwd_rows(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                 int64_t rows, int64_t cols, bool aligned) {
  constexpr int VEC = vec_width<T>();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  // BEGIN SOLUTION
  float yv[CHUNKS][VEC], gv[CHUNKS][VEC];
  float thread_dot = 0.f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t col = (static_cast<int64_t>(c) * THREADS + threadIdx.x) * VEC;
    load_piece<T, VEC>(y + row * cols, col, cols, aligned, yv[c], 0.f);
    load_piece<T, VEC>(dy + row * cols, col, cols, aligned, gv[c], 0.f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) thread_dot += yv[c][k] * gv[c][k];
  }
  const float dot = row_reduce<THREADS>(thread_dot, SumOp());
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) gv[c][k] = yv[c][k] * (gv[c][k] - dot);
    store_piece<T, VEC>(dx + row * cols, (static_cast<int64_t>(c) * THREADS + threadIdx.x) * VEC, cols,
                        aligned, gv[c]);
  }
  // STUB: #error "a1 task 1.7: implement the register-resident softmax backward."
  // END SOLUTION
}

// The same for rows beyond the last bucket: a pass for dot, a pass for dx.
template <typename T, int THREADS>
__global__ void __launch_bounds__(THREADS)
softmax_bwd_looped(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                   int64_t cols, bool aligned) {
  constexpr int VEC = vec_width<T>();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * cols;
  // BEGIN SOLUTION
  float thread_dot = 0.f;
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < cols; col += THREADS * VEC) {
    float yv[VEC], gv[VEC];
    load_piece<T, VEC>(y + base, col, cols, aligned, yv, 0.f);
    load_piece<T, VEC>(dy + base, col, cols, aligned, gv, 0.f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) thread_dot += yv[k] * gv[k];
  }
  const float dot = row_reduce<THREADS>(thread_dot, SumOp());
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < cols; col += THREADS * VEC) {
    float yv[VEC], gv[VEC];
    load_piece<T, VEC>(y + base, col, cols, aligned, yv, 0.f);
    load_piece<T, VEC>(dy + base, col, cols, aligned, gv, 0.f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) gv[k] = yv[k] * (gv[k] - dot);
    store_piece<T, VEC>(dx + base, col, cols, aligned, gv);
  }
  // STUB: #error "a1 task 1.7: implement the looped softmax backward for long rows."
  // END SOLUTION
}

template <typename T>
int softmax_fwd(const void* x, void* y, int64_t rows, int64_t cols, MaskArgs mask, int64_t causal_len,
                cudaStream_t stream) {
  constexpr int VEC = vec_width<T>();
  const bool aligned = cols % VEC == 0 && is_aligned16(x) && is_aligned16(y);
  const T* xt = static_cast<const T*>(x);
  T* yt = static_cast<T*>(y);
  dispatch_row_buckets(
      (cols + VEC - 1) / VEC,
      [&](auto threads, auto chunks) {
        constexpr int kThreads = decltype(threads)::value, kChunks = decltype(chunks)::value;
        softmax_fwd_rows<T, kThreads, kChunks><<<row_grid(kThreads, rows), row_block(kThreads), 0, stream>>>(
            xt, yt, rows, cols, mask, causal_len, aligned);
      },
      [&] {
        softmax_fwd_looped<T, kLoopedThreads><<<static_cast<unsigned>(rows), kLoopedThreads, 0, stream>>>(
            xt, yt, cols, mask, causal_len, aligned);
      });
  return cudaGetLastError();
}

template <typename T>
int softmax_bwd(const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, cudaStream_t stream) {
  constexpr int VEC = vec_width<T>();
  const bool aligned = cols % VEC == 0 && is_aligned16(y) && is_aligned16(dy) && is_aligned16(dx);
  const T* yt = static_cast<const T*>(y);
  const T* gt = static_cast<const T*>(dy);
  T* dxt = static_cast<T*>(dx);
  dispatch_row_buckets(
      (cols + VEC - 1) / VEC,
      [&](auto threads, auto chunks) {
        constexpr int kThreads = decltype(threads)::value, kChunks = decltype(chunks)::value;
        softmax_bwd_rows<T, kThreads, kChunks><<<row_grid(kThreads, rows), row_block(kThreads), 0, stream>>>(
            yt, gt, dxt, rows, cols, aligned);
      },
      [&] {
        softmax_bwd_looped<T, kLoopedThreads><<<static_cast<unsigned>(rows), kLoopedThreads, 0, stream>>>(
            yt, gt, dxt, cols, aligned);
      });
  return cudaGetLastError();
}

}  // namespace st

extern "C" int st_softmax_fwd(int dtype, const void* x, void* y, int64_t rows, int64_t cols,
                              MaskArgs mask, int64_t causal_len, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  ST_DISPATCH_DTYPE(dtype, st::softmax_fwd, x, y, rows, cols, mask, causal_len, stream);
}

extern "C" int st_softmax_bwd(int dtype, const void* y, const void* dy, void* dx, int64_t rows,
                              int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  ST_DISPATCH_DTYPE(dtype, st::softmax_bwd, y, dy, dx, rows, cols, stream);
}
