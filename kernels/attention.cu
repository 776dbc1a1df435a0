// FlashAttention in CUDA C++: O = softmax(Q K^T * scale) V, tiled, without the n x n matrix, and its
// backward.  fp32 / fp16 / bf16 storage, fp32 arithmetic.  Pure CUDA:
// `nvcc -std=c++17 -arch=sm_80 -c kernels/attention.cu`.
//
//   kernel                  idea
//   attention_fwd_rows      a block of kRows query rows (one warp each) walks the key tiles of
//                           kKeyTile = 32 keys staged in shared memory; lane j scores key j of the
//                           tile, the warp keeps the online (max m, sum l) of Milakov & Gimelshein
//                           and rescales its output accumulator by exp(m_old - m_new) (Dao et al.
//                           2022, Algorithm 1).  Each K, V tile is read once per block of queries:
//                           DRAM traffic O(n d * n / kRows) instead of the O(n^2) of materialized
//                           scores, memory O(n d).  Causal: the key loop ends at the block's last
//                           query, so tiles entirely in the future are never loaded.
//   attention_bwd_delta     D = rowsum(dO * O), one warp per query row (FlashAttention-2's
//                           preprocessing: dS = P * (dP - D)).
//   attention_bwd_dq        the forward's layout: a warp per query row walks the key tiles,
//                           recomputes P = exp(S - L) from the saved L, dS = P (dO V^T - D), and
//                           accumulates dQ = dS K * scale.
//   attention_bwd_dkdv      the transpose: a warp per key row walks the query tiles (Q, dO, L, D
//                           staged in shared memory; causal: from the diagonal on), accumulating
//                           dV = P^T dO and dK = dS^T Q * scale.  No atomics: each output row has
//                           one owner.
//
// A teaching kernel, not a tensor-core one: scores are fp32 FMAs (no mma), so it is far from
// FlashAttention's speed on long sequences; the Triton kernel (attention_triton.py) uses tl.dot.
#include "fused_launchers.h"
#include "kernel_utils.cuh"

namespace st {

constexpr int kRows = 8;       // query rows per block (one warp each)
constexpr int kKeyTile = 32;   // keys per shared-memory tile: one per lane

// HEAD_DIM: the head-dim bucket (32, 64, 128); lane `lane` owns output elements
// d = e * 32 + lane, e < HEAD_DIM / 32 (consecutive lanes, consecutive addresses).
template <typename T, int HEAD_DIM, bool CAUSAL>
__global__ void __launch_bounds__(kWarp * kRows)
attention_fwd_rows(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                   float* __restrict__ lse, int64_t seq_q, int64_t seq_k, int head_dim, float scale) {
  constexpr int kPerLane = HEAD_DIM / kWarp;
  __shared__ float q_s[kRows][HEAD_DIM];
  __shared__ float k_s[kKeyTile][HEAD_DIM + 1];  // +1: lane j reads row j, column d: no bank conflicts
  __shared__ float v_s[kKeyTile][HEAD_DIM];
  const int lane = threadIdx.x, warp = threadIdx.y, tid = warp * kWarp + lane;
  const int64_t bh = blockIdx.y, first_row = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t row = first_row + warp;
  const bool row_ok = row < seq_q;  // a row past the end still joins every __syncthreads
  const T* kh = k + bh * seq_k * head_dim;
  const T* vh = v + bh * seq_k * head_dim;
  for (int d = lane; d < HEAD_DIM; d += kWarp)
    q_s[warp][d] = row_ok && d < head_dim ? to_float(q[(bh * seq_q + row) * head_dim + d]) : 0.f;
  float acc[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) acc[e] = 0.f;
  float m = -CUDART_INF_F, l = 0.f;
  const int64_t key_end = CAUSAL ? min(seq_k, first_row + kRows) : seq_k;
  for (int64_t tile = 0; tile < key_end; tile += kKeyTile) {
    __syncthreads();  // the previous tile is consumed (and q_s written, on the first pass)
    for (int i = tid; i < kKeyTile * HEAD_DIM; i += kWarp * kRows) {
      const int j = i / HEAD_DIM, d = i % HEAD_DIM;
      const bool ok = tile + j < seq_k && d < head_dim;
      k_s[j][d] = ok ? to_float(kh[(tile + j) * head_dim + d]) : 0.f;
      v_s[j][d] = ok ? to_float(vh[(tile + j) * head_dim + d]) : 0.f;
    }
    __syncthreads();
    const int64_t key = tile + lane;
    float s = 0.f;
#pragma unroll 8
    for (int d = 0; d < HEAD_DIM; ++d) s += q_s[warp][d] * k_s[lane][d];
    const bool hidden = key >= seq_k || (CAUSAL && key > row);
    s = hidden ? -CUDART_INF_F : s * scale;
    const float m_new = fmaxf(m, warp_reduce(s, MaxOp()));
    // a tile wholly in this row's future leaves m = -inf only if no earlier tile was seen,
    // which cannot happen (key 0 is visible to every row): guard anyway, as OnlineOp does
    const float alpha = m_new == -CUDART_INF_F ? 1.f : __expf(m - m_new);
    const float p = hidden ? 0.f : __expf(s - m_new);
    l = l * alpha + warp_reduce(p, SumOp());
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) acc[e] *= alpha;
#pragma unroll 4
    for (int j = 0; j < kKeyTile; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);  // lane j's probability, broadcast
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc[e] += pj * v_s[j][e * kWarp + lane];
    }
    m = m_new;
  }
  if (!row_ok) return;
  const float inv_l = 1.f / l;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = e * kWarp + lane;
    if (d < head_dim) o[(bh * seq_q + row) * head_dim + d] = from_float<T>(acc[e] * inv_l);
  }
  if (lane == 0) lse[bh * seq_q + row] = m + __logf(l);
}

// D_i = dO_i . O_i for every query row (one warp each, kRows rows per block).
template <typename T>
__global__ void __launch_bounds__(kWarp * kRows)
attention_bwd_delta(const T* __restrict__ o, const T* __restrict__ d_o, float* __restrict__ delta, int64_t rows,
                    int head_dim) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRows + threadIdx.y;
  if (row >= rows) return;  // uniform per warp
  float acc = 0.f;
  for (int d = threadIdx.x; d < head_dim; d += kWarp)
    acc += to_float(o[row * head_dim + d]) * to_float(d_o[row * head_dim + d]);
  acc = warp_reduce(acc, SumOp());
  if (threadIdx.x == 0) delta[row] = acc;
}

// dQ for kRows query rows (a warp each): lane j scores key j of each 32-key tile, as the forward.
template <typename T, int HEAD_DIM, bool CAUSAL>
__global__ void __launch_bounds__(kWarp * kRows)
attention_bwd_dq(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ d_o,
                 const float* __restrict__ lse, const float* __restrict__ delta, T* __restrict__ dq, int64_t seq_q,
                 int64_t seq_k, int head_dim, float scale) {
  constexpr int kPerLane = HEAD_DIM / kWarp;
  __shared__ float q_s[kRows][HEAD_DIM], do_s[kRows][HEAD_DIM];
  __shared__ float k_s[kKeyTile][HEAD_DIM + 1], v_s[kKeyTile][HEAD_DIM + 1];
  const int lane = threadIdx.x, warp = threadIdx.y, tid = warp * kWarp + lane;
  const int64_t bh = blockIdx.y, first_row = static_cast<int64_t>(blockIdx.x) * kRows, row = first_row + warp;
  const bool row_ok = row < seq_q;
  for (int d = lane; d < HEAD_DIM; d += kWarp) {
    const bool ok = row_ok && d < head_dim;
    q_s[warp][d] = ok ? to_float(q[(bh * seq_q + row) * head_dim + d]) : 0.f;
    do_s[warp][d] = ok ? to_float(d_o[(bh * seq_q + row) * head_dim + d]) : 0.f;
  }
  const float row_lse = row_ok ? lse[bh * seq_q + row] : 0.f, row_delta = row_ok ? delta[bh * seq_q + row] : 0.f;
  float acc[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) acc[e] = 0.f;
  const int64_t key_end = CAUSAL ? min(seq_k, first_row + kRows) : seq_k;
  for (int64_t tile = 0; tile < key_end; tile += kKeyTile) {
    __syncthreads();
    for (int i = tid; i < kKeyTile * HEAD_DIM; i += kWarp * kRows) {
      const int j = i / HEAD_DIM, d = i % HEAD_DIM;
      const bool ok = tile + j < seq_k && d < head_dim;
      k_s[j][d] = ok ? to_float(k[(bh * seq_k + tile + j) * head_dim + d]) : 0.f;
      v_s[j][d] = ok ? to_float(v[(bh * seq_k + tile + j) * head_dim + d]) : 0.f;
    }
    __syncthreads();
    const int64_t key = tile + lane;
    float s = 0.f, dp = 0.f;
#pragma unroll 8
    for (int d = 0; d < HEAD_DIM; ++d) {
      s += q_s[warp][d] * k_s[lane][d];
      dp += do_s[warp][d] * v_s[lane][d];
    }
    const bool hidden = !row_ok || key >= seq_k || (CAUSAL && key > row);
    const float ds = hidden ? 0.f : __expf(s * scale - row_lse) * (dp - row_delta);
#pragma unroll 4
    for (int j = 0; j < kKeyTile; ++j) {
      const float ds_j = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc[e] += ds_j * k_s[j][e * kWarp + lane];
    }
  }
  if (!row_ok) return;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = e * kWarp + lane;
    if (d < head_dim) dq[(bh * seq_q + row) * head_dim + d] = from_float<T>(acc[e] * scale);
  }
}

// dK, dV for kRows key rows (a warp each): lane i takes query i of each 32-query tile.
template <typename T, int HEAD_DIM, bool CAUSAL>
__global__ void __launch_bounds__(kWarp * kRows)
attention_bwd_dkdv(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   const T* __restrict__ d_o, const float* __restrict__ lse, const float* __restrict__ delta,
                   T* __restrict__ dk, T* __restrict__ dv, int64_t seq_q, int64_t seq_k, int head_dim, float scale) {
  constexpr int kPerLane = HEAD_DIM / kWarp;
  __shared__ float k_s[kRows][HEAD_DIM], v_s[kRows][HEAD_DIM];
  __shared__ float q_s[kKeyTile][HEAD_DIM + 1], do_s[kKeyTile][HEAD_DIM + 1];
  __shared__ float lse_s[kKeyTile], delta_s[kKeyTile];
  const int lane = threadIdx.x, warp = threadIdx.y, tid = warp * kWarp + lane;
  const int64_t bh = blockIdx.y, first_key = static_cast<int64_t>(blockIdx.x) * kRows, key = first_key + warp;
  const bool key_ok = key < seq_k;
  for (int d = lane; d < HEAD_DIM; d += kWarp) {
    const bool ok = key_ok && d < head_dim;
    k_s[warp][d] = ok ? to_float(k[(bh * seq_k + key) * head_dim + d]) : 0.f;
    v_s[warp][d] = ok ? to_float(v[(bh * seq_k + key) * head_dim + d]) : 0.f;
  }
  float acc_k[kPerLane], acc_v[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) acc_k[e] = acc_v[e] = 0.f;
  // causal: queries before first_key see none of this block's keys
  const int64_t query_start = CAUSAL ? first_key / kKeyTile * kKeyTile : 0;
  for (int64_t tile = query_start; tile < seq_q; tile += kKeyTile) {
    __syncthreads();
    for (int i = tid; i < kKeyTile * HEAD_DIM; i += kWarp * kRows) {
      const int r = i / HEAD_DIM, d = i % HEAD_DIM;
      const bool ok = tile + r < seq_q && d < head_dim;
      q_s[r][d] = ok ? to_float(q[(bh * seq_q + tile + r) * head_dim + d]) : 0.f;
      do_s[r][d] = ok ? to_float(d_o[(bh * seq_q + tile + r) * head_dim + d]) : 0.f;
    }
    if (tid < kKeyTile) {
      const bool ok = tile + tid < seq_q;
      lse_s[tid] = ok ? lse[bh * seq_q + tile + tid] : 0.f;
      delta_s[tid] = ok ? delta[bh * seq_q + tile + tid] : 0.f;
    }
    __syncthreads();
    const int64_t query = tile + lane;
    float s = 0.f, dp = 0.f;
#pragma unroll 8
    for (int d = 0; d < HEAD_DIM; ++d) {
      s += q_s[lane][d] * k_s[warp][d];
      dp += do_s[lane][d] * v_s[warp][d];
    }
    const bool hidden = !key_ok || query >= seq_q || (CAUSAL && key > query);
    const float p = hidden ? 0.f : __expf(s * scale - lse_s[lane]);
    const float ds = p * (dp - delta_s[lane]);
#pragma unroll 4
    for (int i = 0; i < kKeyTile; ++i) {
      const float p_i = __shfl_sync(0xffffffffu, p, i), ds_i = __shfl_sync(0xffffffffu, ds, i);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        acc_v[e] += p_i * do_s[i][e * kWarp + lane];
        acc_k[e] += ds_i * q_s[i][e * kWarp + lane];
      }
    }
  }
  if (!key_ok) return;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = e * kWarp + lane;
    if (d < head_dim) {
      dk[(bh * seq_k + key) * head_dim + d] = from_float<T>(acc_k[e] * scale);
      dv[(bh * seq_k + key) * head_dim + d] = from_float<T>(acc_v[e]);
    }
  }
}

template <typename T, int HEAD_DIM>
cudaError_t launch_fwd_bucket(const void* q, const void* k, const void* v, void* o, float* lse, int64_t bh,
                              int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, bool causal,
                              cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((seq_q + kRows - 1) / kRows), static_cast<unsigned>(bh));
  const dim3 block(kWarp, kRows);
  auto args = [&](auto kernel) {
    kernel<<<grid, block, 0, stream>>>(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                                       static_cast<T*>(o), lse, seq_q, seq_k, static_cast<int>(head_dim), scale);
  };
  if (causal) args(attention_fwd_rows<T, HEAD_DIM, true>);
  else args(attention_fwd_rows<T, HEAD_DIM, false>);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_attention_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int64_t bh,
                                 int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, bool causal,
                                 cudaStream_t stream) {
  if (head_dim <= 32) return launch_fwd_bucket<T, 32>(q, k, v, o, lse, bh, seq_q, seq_k, head_dim, scale, causal, stream);
  if (head_dim <= 64) return launch_fwd_bucket<T, 64>(q, k, v, o, lse, bh, seq_q, seq_k, head_dim, scale, causal, stream);
  if (head_dim <= 128) return launch_fwd_bucket<T, 128>(q, k, v, o, lse, bh, seq_q, seq_k, head_dim, scale, causal, stream);
  return cudaErrorInvalidValue;
}

template <typename T, int HEAD_DIM>
cudaError_t launch_bwd_bucket(const void* q, const void* k, const void* v, const void* d_o, const float* lse,
                              float* delta, void* dq, void* dk, void* dv, int64_t bh, int64_t seq_q, int64_t seq_k,
                              int64_t head_dim, float scale, bool causal, cudaStream_t stream) {
  const dim3 block(kWarp, kRows);
  const auto blocks = [](int64_t rows) { return static_cast<unsigned>((rows + kRows - 1) / kRows); };
  const T *tq = static_cast<const T*>(q), *tk = static_cast<const T*>(k), *tv = static_cast<const T*>(v);
  const T* tdo = static_cast<const T*>(d_o);
  const int hd = static_cast<int>(head_dim);
  auto both = [&](auto dq_kernel, auto dkdv_kernel) {
    dq_kernel<<<dim3(blocks(seq_q), static_cast<unsigned>(bh)), block, 0, stream>>>(
        tq, tk, tv, tdo, lse, delta, static_cast<T*>(dq), seq_q, seq_k, hd, scale);
    dkdv_kernel<<<dim3(blocks(seq_k), static_cast<unsigned>(bh)), block, 0, stream>>>(
        tq, tk, tv, tdo, lse, delta, static_cast<T*>(dk), static_cast<T*>(dv), seq_q, seq_k, hd, scale);
  };
  if (causal) both(attention_bwd_dq<T, HEAD_DIM, true>, attention_bwd_dkdv<T, HEAD_DIM, true>);
  else both(attention_bwd_dq<T, HEAD_DIM, false>, attention_bwd_dkdv<T, HEAD_DIM, false>);
  return cudaGetLastError();
}

// delta: fp32 workspace of bh * seq_q elements (D = rowsum(dO * O)).
template <typename T>
cudaError_t launch_attention_bwd(const void* q, const void* k, const void* v, const void* o, const void* d_o,
                                 const float* lse, float* delta, void* dq, void* dk, void* dv, int64_t bh,
                                 int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, bool causal,
                                 cudaStream_t stream) {
  const int64_t rows = bh * seq_q;
  attention_bwd_delta<T><<<static_cast<unsigned>((rows + kRows - 1) / kRows), dim3(kWarp, kRows), 0, stream>>>(
      static_cast<const T*>(o), static_cast<const T*>(d_o), delta, rows, static_cast<int>(head_dim));
#define ST_BWD_BUCKET(D) \
  launch_bwd_bucket<T, D>(q, k, v, d_o, lse, delta, dq, dk, dv, bh, seq_q, seq_k, head_dim, scale, causal, stream)
  if (head_dim <= 32) return ST_BWD_BUCKET(32);
  if (head_dim <= 64) return ST_BWD_BUCKET(64);
  if (head_dim <= 128) return ST_BWD_BUCKET(128);
#undef ST_BWD_BUCKET
  return cudaErrorInvalidValue;
}

}  // namespace st

extern "C" int st_attention_fwd(int dtype, const void* q, const void* k, const void* v, void* o, float* lse,
                                int64_t bh, int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, int causal,
                                cudaStream_t stream) {
  if (bh == 0 || seq_q == 0) return cudaSuccess;
  if (seq_k == 0 || bh > 65535) return cudaErrorInvalidValue;  // gridDim.y limit
  ST_DISPATCH_DTYPE(dtype, st::launch_attention_fwd, q, k, v, o, lse, bh, seq_q, seq_k, head_dim, scale,
                    causal != 0, stream);
}

extern "C" int st_attention_bwd(int dtype, const void* q, const void* k, const void* v, const void* o,
                                const void* d_o, const float* lse, float* delta, void* dq, void* dk, void* dv,
                                int64_t bh, int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, int causal,
                                cudaStream_t stream) {
  if (bh == 0 || seq_q == 0) return cudaSuccess;
  if (seq_k == 0 || bh > 65535) return cudaErrorInvalidValue;
  ST_DISPATCH_DTYPE(dtype, st::launch_attention_bwd, q, k, v, o, d_o, lse, delta, dq, dk, dv, bh, seq_q, seq_k,
                    head_dim, scale, causal != 0, stream);
}
