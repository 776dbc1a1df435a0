// Fused LayerNorm over the last dimension, forward and backward, fp32 / fp16 / bf16 storage with
// fp32 arithmetic.  Pure CUDA: `nvcc -std=c++17 -arch=sm_80 -c kernels/layer_norm.cu`.
//
//   kernel                     idea
//   layer_norm_fwd_rows        row in registers; mean and variance from ONE reduction of the pair
//                              (sum d, sum d^2), d = x - x[0] ("Rewrite Reduction: LayerNorm
//                              Forward", accelerating-transformer-training-lecture.md: sigma^2 =
//                              mu(x^2) - mu(x)^2; the shift by x[0] keeps it exact when |mu| >> sigma)
//   layer_norm_fwd_looped      rows too long for registers: sums pass, then normalize pass
//   layer_norm_bwd_rows/_looped  dx by the LightSeq rewrite (same lecture, "LayerNorm Backward"):
//                              with g = w * dy, one reduction of the pair (sum g, sum g x) and
//                                dx_i = rstd g_i + alpha_i sum_j g_j + beta_i sum_j g_j x_j,
//                                alpha_i = ((x_i - mu) mu rstd^2 - 1) rstd / N,
//                                beta_i  = (mu - x_i) rstd^3 / N
//                              (the slide prints sigma where sigma^2 belongs in alpha's numerator),
//                              evaluated regrouped so that it is exactly 0 at N = 1 (layer_norm_dx)
//                              The rows kernel's persistent row lanes also sum dweight_j =
//                              sum_r dy_rj xhat_rj and dbias_j = sum_r dy_rj over their rows: one
//                              fp32 partial row per lane, x and dy read once for all three gradients
//   layer_norm_dwdb_partial    the same cross-row sums for looped rows, in a second pass over x and
//   layer_norm_dwdb_final      dy (row groups -> fp32 partials); the final sum of either's partials
#include "kernel_utils.cuh"

namespace st {

// Loads weight/bias pieces, or 1 / 0 when the pointer is null (elementwise_affine=False).
template <typename T, int VEC>
__device__ __forceinline__ void load_affine(const T* p, int64_t col, int64_t cols, bool aligned,
                                            float (&out)[VEC], float absent) {
  if (p != nullptr) {
    load_piece<T, VEC>(p, col, cols, aligned, out, 0.f);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = absent;
  }
}

// (mean, rstd) from the shifted sums s = (sum d, sum d^2), d = x - shift.
__device__ __forceinline__ F2 moments(F2 s, float shift, int64_t cols, float eps) {
  // BEGIN SOLUTION
  const float mean_d = s.a / cols;
  const float var = fmaxf(s.b / cols - mean_d * mean_d, 0.f);
  return {shift + mean_d, rsqrtf(var + eps)};
  // STUB: #error "a1 task 1.8: implement moments(): the mean and rstd of a row from its shifted sums."
  // END SOLUTION
}

// Row layout as in softmax.cu.  Sums of d = x - x[0] and d^2 in one F2, one row_reduce
// (Sum2Op), moments(), thread 0 stores mean and rstd, then normalize from registers.
template <typename T, int THREADS, int CHUNKS>
__global__ void __launch_bounds__(THREADS == kWarp ? kWarp * kWarpRowsPerBlock : THREADS)
layer_norm_fwd_rows(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                    T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
                    int64_t rows, int64_t cols, float eps, bool aligned) {
  constexpr int VEC = vec_width<T>();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  // BEGIN SOLUTION
  const T* xr = x + row * cols;
  const float shift = to_float(xr[0]);
  float v[CHUNKS][VEC];
  F2 s = Sum2Op::identity();
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t col = (static_cast<int64_t>(c) * THREADS + threadIdx.x) * VEC;
    load_piece<T, VEC>(xr, col, cols, aligned, v[c], shift);  // padding: d = 0 adds nothing
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float d = v[c][k] - shift;
      s.a += d;
      s.b += d * d;
    }
  }
  const F2 m = moments(row_reduce<THREADS>(s, Sum2Op()), shift, cols, eps);
  if (threadIdx.x == 0) {
    mean[row] = m.a;
    rstd[row] = m.b;
  }
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int64_t col = (static_cast<int64_t>(c) * THREADS + threadIdx.x) * VEC;
    float wv[VEC], bv[VEC];
    load_affine<T, VEC>(w, col, cols, aligned, wv, 1.f);
    load_affine<T, VEC>(b, col, cols, aligned, bv, 0.f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[c][k] = (v[c][k] - m.a) * m.b * wv[k] + bv[k];
    store_piece<T, VEC>(y + row * cols, col, cols, aligned, v[c]);
  }
  // STUB: #error "a1 task 1.8: implement the register-resident LayerNorm forward."
  // END SOLUTION
}

// Rows beyond the last bucket: a sums pass, then a normalize pass over global memory.
template <typename T, int THREADS>
__global__ void __launch_bounds__(THREADS)
layer_norm_fwd_looped(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                      T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
                      int64_t cols, float eps, bool aligned) {
  constexpr int VEC = vec_width<T>();
  const int64_t row = blockIdx.x;
  // BEGIN SOLUTION
  const T* xr = x + row * cols;
  const float shift = to_float(xr[0]);
  F2 s = Sum2Op::identity();
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < cols; col += THREADS * VEC) {
    float v[VEC];
    load_piece<T, VEC>(xr, col, cols, aligned, v, shift);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float d = v[k] - shift;
      s.a += d;
      s.b += d * d;
    }
  }
  const F2 m = moments(row_reduce<THREADS>(s, Sum2Op()), shift, cols, eps);
  if (threadIdx.x == 0) {
    mean[row] = m.a;
    rstd[row] = m.b;
  }
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < cols; col += THREADS * VEC) {
    float v[VEC], wv[VEC], bv[VEC];
    load_piece<T, VEC>(xr, col, cols, aligned, v, 0.f);
    load_affine<T, VEC>(w, col, cols, aligned, wv, 1.f);
    load_affine<T, VEC>(b, col, cols, aligned, bv, 0.f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = (v[k] - m.a) * m.b * wv[k] + bv[k];
    store_piece<T, VEC>(y + row * cols, col, cols, aligned, v);
  }
  // STUB: #error "a1 task 1.8: implement the looped LayerNorm forward for long rows."
  // END SOLUTION
}

// dx_i from x_i, g_i = w_i dy_i, the row's (sum g, sum g x) and its saved mean / rstd: the
// alpha/beta form regrouped as r (g_i - sum g / N - xhat_i c), c = r (sum g x - mu sum g) / N, so
// that the terms that cancel (exactly, at N = 1) meet before r ~ 1/sqrt(eps) multiplies them:
// nvcc fuses r * g_i + alpha * sum g into an FMA, which left r g_i's rounding error (an H200 left dx at 1e-5..6e-5 for N = 1).
__device__ __forceinline__ float layer_norm_dx(float xi, float gi, F2 sums, float mu, float r, int64_t cols) {
  // BEGIN SOLUTION
  const float n = static_cast<float>(cols);
  const float mean_g = __fdiv_rn(sums.a, n);  // IEEE even under --use_fast_math: g itself at N = 1
  const float c = r * (sums.b - mu * sums.a) / n;
  return r * (gi - mean_g - (xi - mu) * r * c);
  // STUB: #error "a1 task 1.9: implement layer_norm_dx(): the single-pass dx of the handout's step 3."
  // END SOLUTION
}

// The one-pass backward keeps four arrays of CHUNKS x VEC floats a thread (x, dy and the two
// partial sums): at most 8192 values a block, so the four take half an SM's 65,536 registers and
// nothing spills (16-bit rows of more than 4096 columns take the second pass instead).
template <typename T, int THREADS, int CHUNKS>
__host__ __device__ constexpr bool one_pass_fits() { return THREADS * CHUNKS * vec_width<T>() <= 8192; }

// x and dy in registers, g = w * dy; (sum g, sum g x) in one F2 row_reduce; layer_norm_dx per
// element.  Persistent rows: row lane (blockIdx.x, threadIdx.y) takes rows lane, lane + lanes, ...
// (lanes = gridDim.x * blockDim.y).  With part_w non-null (only where one_pass_fits: elsewhere the
// sums' arrays would spill, and nvcc's spill report costs the compile check, so they must not
// exist in those instantiations), each lane also sums dy * xhat and dy of its columns over its
// rows, in fp32, and stores them once at
// part_w[lane * cols + col], part_b[lane * cols + col]; layer_norm_dwdb_final adds the lanes'
// rows: x and dy are read once for dx, dw and db.  g must be one rounded value wherever it is
// read (the row sums and dx): `s.a += dy * w` may become an FMA that keeps the product unrounded
// (__fmul_rn never does).
template <typename T, int THREADS, int CHUNKS>
__global__ void __launch_bounds__(THREADS == kWarp ? kWarp * kWarpRowsPerBlock : THREADS)
layer_norm_bwd_rows(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                    const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                    float* __restrict__ part_w, float* __restrict__ part_b, int64_t rows, int64_t cols,
                    bool aligned) {
  constexpr int VEC = vec_width<T>();
  const int64_t lane = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const int64_t lanes = static_cast<int64_t>(gridDim.x) * blockDim.y;
  // BEGIN SOLUTION
  float acc_w[CHUNKS][VEC] = {}, acc_b[CHUNKS][VEC] = {};
  for (int64_t row = lane; row < rows; row += lanes) {  // uniform per row lane: row_reduce stays legal
    float xv[CHUNKS][VEC], dv[CHUNKS][VEC];
    F2 s = Sum2Op::identity();  // (sum g, sum g x): both reductions in one synchronization
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int64_t col = (static_cast<int64_t>(c) * THREADS + threadIdx.x) * VEC;
      float wv[VEC];
      load_piece<T, VEC>(x + row * cols, col, cols, aligned, xv[c], 0.f);
      load_piece<T, VEC>(dy + row * cols, col, cols, aligned, dv[c], 0.f);
      load_affine<T, VEC>(w, col, cols, aligned, wv, 1.f);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float g = __fmul_rn(dv[c][k], wv[k]);
        s.a += g;
        s.b += g * xv[c][k];
      }
    }
    s = row_reduce<THREADS>(s, Sum2Op());
    const float mu = mean[row], r = rstd[row];
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int64_t col = (static_cast<int64_t>(c) * THREADS + threadIdx.x) * VEC;
      float wv[VEC], out[VEC];
      load_affine<T, VEC>(w, col, cols, aligned, wv, 1.f);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        out[k] = layer_norm_dx(xv[c][k], __fmul_rn(dv[c][k], wv[k]), s, mu, r, cols);
        if constexpr (one_pass_fits<T, THREADS, CHUNKS>()) {  // else the arrays would spill
          acc_w[c][k] += dv[c][k] * ((xv[c][k] - mu) * r);  // outside the row: dy = 0, nothing added
          acc_b[c][k] += dv[c][k];
        }
      }
      store_piece<T, VEC>(dx + row * cols, col, cols, aligned, out);
    }
  }
  if constexpr (one_pass_fits<T, THREADS, CHUNKS>()) {
    if (part_w == nullptr || lane >= rows) return;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int64_t col = (static_cast<int64_t>(c) * THREADS + threadIdx.x) * VEC;
      store_piece<float, VEC>(part_w + lane * cols, col, cols, false, acc_w[c]);  // once per lane: scalar is fine
      store_piece<float, VEC>(part_b + lane * cols, col, cols, false, acc_b[c]);
    }
  }
  // STUB: #error "a1 task 1.9: implement the register-resident LayerNorm backward for x (and the dw, db partials)."
  // END SOLUTION
}

// Rows beyond the last bucket: a sums pass, then a dx pass (x, dy, w re-read).
template <typename T, int THREADS>
__global__ void __launch_bounds__(THREADS)
layer_norm_bwd_looped(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                      const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                      int64_t cols, bool aligned) {
  constexpr int VEC = vec_width<T>();
  const int64_t row = blockIdx.x, base = row * cols;
  // BEGIN SOLUTION
  F2 s = Sum2Op::identity();
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < cols; col += THREADS * VEC) {
    float xv[VEC], gv[VEC], wv[VEC];
    load_piece<T, VEC>(x + base, col, cols, aligned, xv, 0.f);
    load_piece<T, VEC>(dy + base, col, cols, aligned, gv, 0.f);
    load_affine<T, VEC>(w, col, cols, aligned, wv, 1.f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      s.a += gv[k] * wv[k];
      s.b += gv[k] * wv[k] * xv[k];
    }
  }
  s = row_reduce<THREADS>(s, Sum2Op());
  const float mu = mean[row], r = rstd[row];
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < cols; col += THREADS * VEC) {
    float xv[VEC], gv[VEC], wv[VEC];
    load_piece<T, VEC>(x + base, col, cols, aligned, xv, 0.f);
    load_piece<T, VEC>(dy + base, col, cols, aligned, gv, 0.f);
    load_affine<T, VEC>(w, col, cols, aligned, wv, 1.f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) gv[k] = layer_norm_dx(xv[k], gv[k] * wv[k], s, mu, r, cols);
    store_piece<T, VEC>(dx + base, col, cols, aligned, gv);
  }
  // STUB: #error "a1 task 1.9: implement the looped LayerNorm backward for x."
  // END SOLUTION
}

// ---- dweight, dbias: reduce over rows --------------------------------------------------------
// Stage 1: block (32, 8) owns 32 columns (coalesced 32-element row segments) and one group of
// rows; its 8 row lanes accumulate in registers, then a shared-memory column sum writes one
// fp32 partial per (group, column).  Stage 2 sums the groups' partials per column.
constexpr int kDwdbCols = 32, kDwdbLanes = 8;
constexpr int64_t kDwdbMinRowsPerGroup = 64, kDwdbMaxGroups = 256;  // workspace <= 2 KiB per column

template <typename T>
__global__ void __launch_bounds__(kDwdbCols * kDwdbLanes)
layer_norm_dwdb_partial(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                        const float* __restrict__ rstd, float* __restrict__ part_w, float* __restrict__ part_b,
                        int64_t rows, int64_t cols, int64_t rows_per_group) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kDwdbCols + threadIdx.x;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_group;
  const int64_t last = min(first + rows_per_group, rows);
  float acc_w = 0.f, acc_b = 0.f;
  if (col < cols) {
    for (int64_t r = first + threadIdx.y; r < last; r += kDwdbLanes) {
      const float g = to_float(dy[r * cols + col]);
      acc_w += g * (to_float(x[r * cols + col]) - mean[r]) * rstd[r];
      acc_b += g;
    }
  }
  __shared__ float sw[kDwdbLanes][kDwdbCols + 1], sb[kDwdbLanes][kDwdbCols + 1];  // +1: no bank conflicts
  sw[threadIdx.y][threadIdx.x] = acc_w;
  sb[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
#pragma unroll
    for (int l = 1; l < kDwdbLanes; ++l) {
      acc_w += sw[l][threadIdx.x];
      acc_b += sb[l][threadIdx.x];
    }
    part_w[blockIdx.y * cols + col] = acc_w;
    part_b[blockIdx.y * cols + col] = acc_b;
  }
}

template <typename T>
__global__ void layer_norm_dwdb_final(const float* __restrict__ part_w, const float* __restrict__ part_b,
                                      T* __restrict__ dw, T* __restrict__ db, int64_t groups, int64_t cols) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float acc_w = 0.f, acc_b = 0.f;
  for (int64_t g = 0; g < groups; ++g) {  // consecutive threads read consecutive columns
    acc_w += part_w[g * cols + col];
    acc_b += part_b[g * cols + col];
  }
  if (dw != nullptr) dw[col] = from_float<T>(acc_w);
  if (db != nullptr) db[col] = from_float<T>(acc_b);
}

inline int64_t dwdb_rows_per_group(int64_t rows) {
  return max(kDwdbMinRowsPerGroup, (rows + kDwdbMaxGroups - 1) / kDwdbMaxGroups);
}
inline int64_t dwdb_groups(int64_t rows) { return (rows + dwdb_rows_per_group(rows) - 1) / dwdb_rows_per_group(rows); }

// Blocks of the one-pass backward: two per SM, so every block is resident at once and its lanes'
// partial rows (8 bytes per column, written and read again) stay a small share of the traffic.
inline int64_t persistent_blocks() {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return 2 * static_cast<int64_t>(max(sms, 1));
}
// Row lanes of the one-pass backward on `rows` rows: each writes one partial row of dw and db.
inline int64_t partial_lanes(int64_t rows) {
  return min(rows, persistent_blocks() * kWarpRowsPerBlock);
}

template <typename T>
int layer_norm_fwd(const void* x, const void* w, const void* b, void* y, float* mean, float* rstd,
                   int64_t rows, int64_t cols, float eps, cudaStream_t stream) {
  constexpr int VEC = vec_width<T>();
  const bool aligned = cols % VEC == 0 && is_aligned16(x) && is_aligned16(w) && is_aligned16(b) && is_aligned16(y);
  const T *xt = static_cast<const T*>(x), *wt = static_cast<const T*>(w), *bt = static_cast<const T*>(b);
  T* yt = static_cast<T*>(y);
  dispatch_row_buckets(
      (cols + VEC - 1) / VEC,
      [&](auto threads, auto chunks) {
        constexpr int kThreads = decltype(threads)::value, kChunks = decltype(chunks)::value;
        layer_norm_fwd_rows<T, kThreads, kChunks><<<row_grid(kThreads, rows), row_block(kThreads), 0, stream>>>(
            xt, wt, bt, yt, mean, rstd, rows, cols, eps, aligned);
      },
      [&] {
        layer_norm_fwd_looped<T, kLoopedThreads><<<static_cast<unsigned>(rows), kLoopedThreads, 0, stream>>>(
            xt, wt, bt, yt, mean, rstd, cols, eps, aligned);
      });
  return cudaGetLastError();
}

template <typename T>
int layer_norm_bwd(const void* dy, const void* x, const void* w, const float* mean, const float* rstd, void* dx,
                   void* dw, void* db, float* workspace, int64_t rows, int64_t cols, cudaStream_t stream) {
  constexpr int VEC = vec_width<T>();
  const bool aligned = cols % VEC == 0 && is_aligned16(dy) && is_aligned16(x) && is_aligned16(w) && is_aligned16(dx);
  const bool need = dw != nullptr || db != nullptr;
  const T *gt = static_cast<const T*>(dy), *xt = static_cast<const T*>(x), *wt = static_cast<const T*>(w);
  T* dxt = static_cast<T*>(dx);
  int64_t groups = 0;  // partial rows of dw and db, whichever kernel wrote them
  const auto second_pass = [&] {  // dw and db from a second pass over x and dy
    groups = dwdb_groups(rows);
    const dim3 grid(static_cast<unsigned>((cols + kDwdbCols - 1) / kDwdbCols), static_cast<unsigned>(groups));
    layer_norm_dwdb_partial<T><<<grid, dim3(kDwdbCols, kDwdbLanes), 0, stream>>>(
        gt, xt, mean, rstd, workspace, workspace + groups * cols, rows, cols, dwdb_rows_per_group(rows));
  };
  dispatch_row_buckets(
      (cols + VEC - 1) / VEC,
      [&](auto threads, auto chunks) {  // one pass where it fits: the rows kernel writes the partials
        constexpr int kThreads = decltype(threads)::value, kChunks = decltype(chunks)::value;
        const bool one_pass = need && one_pass_fits<T, kThreads, kChunks>();
        const dim3 all = row_grid(kThreads, rows), block = row_block(kThreads);
        const unsigned blocks = one_pass ? static_cast<unsigned>(min(static_cast<int64_t>(all.x), persistent_blocks()))
                                         : all.x;
        groups = one_pass ? min(rows, static_cast<int64_t>(blocks) * block.y) : 0;
        layer_norm_bwd_rows<T, kThreads, kChunks><<<blocks, block, 0, stream>>>(
            gt, xt, wt, mean, rstd, dxt, one_pass ? workspace : nullptr, one_pass ? workspace + groups * cols : nullptr,
            rows, cols, aligned);
        if (need && !one_pass) second_pass();
      },
      [&] {  // rows too long for registers
        layer_norm_bwd_looped<T, kLoopedThreads><<<static_cast<unsigned>(rows), kLoopedThreads, 0, stream>>>(
            gt, xt, wt, mean, rstd, dxt, cols, aligned);
        if (need) second_pass();
      });
  if (need)
    layer_norm_dwdb_final<T><<<static_cast<unsigned>((cols + 255) / 256), 256, 0, stream>>>(
        workspace, workspace + groups * cols, static_cast<T*>(dw), static_cast<T*>(db), groups, cols);
  return cudaGetLastError();
}

}  // namespace st

extern "C" int64_t st_layer_norm_bwd_workspace(int64_t rows, int64_t cols) {
  return 2 * max(st::dwdb_groups(rows), st::partial_lanes(rows)) * cols;  // either kernel's partial rows
}

extern "C" int st_layer_norm_fwd(int dtype, const void* x, const void* weight, const void* bias, void* y,
                                 float* mean, float* rstd, int64_t rows, int64_t cols, float eps,
                                 cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  ST_DISPATCH_DTYPE(dtype, st::layer_norm_fwd, x, weight, bias, y, mean, rstd, rows, cols, eps, stream);
}

extern "C" int st_layer_norm_bwd(int dtype, const void* dy, const void* x, const void* weight,
                                 const float* mean, const float* rstd, void* dx, void* dweight, void* dbias,
                                 float* workspace, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  ST_DISPATCH_DTYPE(dtype, st::layer_norm_bwd, dy, x, weight, mean, rstd, dx, dweight, dbias, workspace, rows,
                    cols, stream);
}
