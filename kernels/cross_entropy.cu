// Fused cross-entropy with label smoothing (LightSeq2's criterion), forward and backward, fp32 /
// fp16 / bf16 logits with fp32 arithmetic.  Pure CUDA: `nvcc -std=c++17 -arch=sm_80 -c kernels/cross_entropy.cu`.
//
//   kernel                   idea
//   cross_entropy_fwd_rows   one block per row streams the V logits once, 16 bytes per load: per thread
//                            the online (max, sum of exp) of module 1 (OnlineOp), merged once per
//                            loaded piece, and the sum of x, merged by row_reduce;
//                            loss = (1 - eps)(L - x_t) + eps (L - mean x), L = log-sum-exp.
//   cross_entropy_bwd_rows   dx_j = dloss (exp(x_j - L) - (1 - eps)[j == t] - eps / V): one read of
//                            x, one write of dx, from the saved L.  The probabilities are never stored.
// Derivation and traffic: kernels/cross_entropy_triton.py (the same algorithm).
#include "fused_launchers.h"
#include "kernel_utils.cuh"

namespace st {

constexpr int kCeThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kCeThreads)
cross_entropy_fwd_rows(const T* __restrict__ x, const int64_t* __restrict__ target, float* __restrict__ loss,
                       float* __restrict__ lse, int64_t vocab, float smoothing, int64_t ignore_index, bool aligned) {
  constexpr int VEC = vec_width<T>();  // 16-byte loads where `aligned`
  const int64_t row = blockIdx.x;
  const T* xr = x + row * vocab;
  F2 state = OnlineOp::identity();  // (running max, sum of exp(x - running max))
  float sum_x = 0.f;
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < vocab; col += kCeThreads * VEC) {
    float v[VEC];
    load_piece<T, VEC>(xr, col, vocab, aligned, v, -CUDART_INF_F);  // past the row: exp(-inf) = 0
    // the piece's own (max, sum of exp) first, then one online merge: VEC + 2 exponentials per
    // VEC logits instead of two per logit (the MUFU's rate is near a bf16 row's bandwidth)
    float piece_max = v[0];  // col < vocab: a logit of the row
#pragma unroll
    for (int k = 1; k < VEC; ++k) piece_max = fmaxf(piece_max, v[k]);
    float piece_sum = 0.f;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      piece_sum += piece_max == -CUDART_INF_F ? 0.f : __expf(v[k] - piece_max);  // a piece of -inf logits adds 0
      sum_x += col + k < vocab ? v[k] : 0.f;
    }
    state = OnlineOp()(state, F2{piece_max, piece_sum});
  }
  state = row_reduce<kCeThreads>(state, OnlineOp());
  sum_x = row_reduce<kCeThreads>(sum_x, SumOp());
  if (threadIdx.x != 0) return;
  const int64_t t = target[row];
  const float row_lse = state.a + __logf(state.b);
  const float x_t = t == ignore_index ? 0.f : to_float(xr[t]);
  const float value = (1.f - smoothing) * (row_lse - x_t) + smoothing * (row_lse - sum_x / vocab);
  loss[row] = t == ignore_index ? 0.f : value;
  lse[row] = row_lse;
}

template <typename T>
__global__ void __launch_bounds__(kCeThreads)
cross_entropy_bwd_rows(const T* __restrict__ x, const int64_t* __restrict__ target, const float* __restrict__ lse,
                       const float* __restrict__ dloss, T* __restrict__ dx, int64_t vocab, float smoothing,
                       int64_t ignore_index, bool aligned) {
  constexpr int VEC = vec_width<T>();
  const int64_t row = blockIdx.x;
  const int64_t t = target[row];
  const float g = t == ignore_index ? 0.f : dloss[row], row_lse = lse[row];
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < vocab; col += kCeThreads * VEC) {
    float v[VEC];
    load_piece<T, VEC>(x + row * vocab, col, vocab, aligned, v, 0.f);
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      v[k] = g * (__expf(v[k] - row_lse) - smoothing / vocab - (col + k == t ? 1.f - smoothing : 0.f));
    store_piece<T, VEC>(dx + row * vocab, col, vocab, aligned, v);
  }
}

template <typename T>
cudaError_t launch_ce_fwd(const void* x, const int64_t* target, float* loss, float* lse, int64_t rows, int64_t vocab,
                          float smoothing, int64_t ignore_index, cudaStream_t stream) {
  const bool aligned = vocab % vec_width<T>() == 0 && is_aligned16(x);  // every row starts on 16 bytes
  cross_entropy_fwd_rows<T><<<static_cast<unsigned>(rows), kCeThreads, 0, stream>>>(
      static_cast<const T*>(x), target, loss, lse, vocab, smoothing, ignore_index, aligned);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_ce_bwd(const void* x, const int64_t* target, const float* lse, const float* dloss, void* dx,
                          int64_t rows, int64_t vocab, float smoothing, int64_t ignore_index, cudaStream_t stream) {
  const bool aligned = vocab % vec_width<T>() == 0 && is_aligned16(x) && is_aligned16(dx);
  cross_entropy_bwd_rows<T><<<static_cast<unsigned>(rows), kCeThreads, 0, stream>>>(
      static_cast<const T*>(x), target, lse, dloss, static_cast<T*>(dx), vocab, smoothing, ignore_index, aligned);
  return cudaGetLastError();
}

}  // namespace st

extern "C" int st_cross_entropy_fwd(int dtype, const void* logits, const int64_t* target, float* loss, float* lse,
                                    int64_t rows, int64_t vocab, float smoothing, int64_t ignore_index,
                                    cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (vocab == 0) return cudaErrorInvalidValue;
  ST_DISPATCH_DTYPE(dtype, st::launch_ce_fwd, logits, target, loss, lse, rows, vocab, smoothing, ignore_index, stream);
}

extern "C" int st_cross_entropy_bwd(int dtype, const void* logits, const int64_t* target, const float* lse,
                                    const float* dloss, void* dlogits, int64_t rows, int64_t vocab, float smoothing,
                                    int64_t ignore_index, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (vocab == 0) return cudaErrorInvalidValue;
  ST_DISPATCH_DTYPE(dtype, st::launch_ce_bwd, logits, target, lse, dloss, dlogits, rows, vocab, smoothing,
                    ignore_index, stream);
}
