// FlashAttention-2's backward on tensor cores: dQ, dK, dV of O = softmax(Q K^T * scale) V from the
// forward's O and L = logsumexp (attention_mma.cu or attention.cu: the same L), for fp16 / bf16 at
// head dim 64 or 128 (sm_80+), fp32 accumulation.  attention.cu's scalar backward remains the
// fallback.  `nvcc -std=c++17 -arch=sm_80 -c kernels/attention_mma_bwd.cu`.
//
// Dao 2023, Algorithm 2, split in two kernels so that every output row has one owner (no atomics,
// as attention.cu's backward):
//   attention_bwd_dq_mma    a warp per 16 query rows walks the key tiles: S = Q K^T, P = exp(S - L),
//                           dP = dO V^T, dS = P (dP - D), dQ += dS K.  It first computes
//                           D = rowsum(dO * O) for its rows (FlashAttention-2's preprocessing) and
//                           stores it for the second kernel.
//   attention_bwd_dkdv_mma  a warp per 16 key rows walks the query tiles: S^T = K Q^T, P^T,
//                           dP^T = V dO^T, dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q.
// Both are attention_mma.cuh's pieces (scores: A B^T; accumulate: P V) with the operands' roles
// swapped: computing the transposed scores directly leaves P^T and dS^T in the warp's registers
// as the A operands of dV and dK.  Causal: key tiles after a query block's last row (dQ) and
// query tiles before a key block's first row (dK, dV) are skipped.
#include "attention_mma.cuh"
#include "fused_launchers.h"

namespace st {

constexpr int kBwdRows = 16 * kMmaWarps;  // rows a CTA owns: queries (dQ) or keys (dK, dV)
constexpr float kLog2e = 1.4426950408889634f;

// TILE: keys per shared-memory tile
template <typename T, int D, int TILE, bool CAUSAL>
__global__ void __launch_bounds__(kWarp * kMmaWarps, 2)
attention_bwd_dq_mma(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     const T* __restrict__ o, const T* __restrict__ d_o, const float* __restrict__ lse,
                     float* __restrict__ delta, T* __restrict__ dq, int64_t seq_q, int64_t seq_k, float scale_log2,
                     float scale) {
  __shared__ __align__(16) uint16_t k_s[TILE][D + kPad];
  __shared__ __align__(16) uint16_t v_s[TILE][D + kPad];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const unsigned m_block = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // longest first
  const int64_t bh = blockIdx.y, m0 = static_cast<int64_t>(m_block) * kBwdRows;
  const int64_t row[2] = {m0 + warp * 16 + g, m0 + warp * 16 + g + 8};
  const auto head = [bh](const T* p, int64_t n) { return reinterpret_cast<const uint16_t*>(p) + bh * n * D; };
  const uint16_t *qh = head(q, seq_q), *oh = head(o, seq_q), *doh = head(d_o, seq_q);
  const uint16_t *kh = head(k, seq_k), *vh = head(v, seq_k);

  uint32_t qa[D / 16][4], da[D / 16][4];  // Q and dO as A fragments
  load_a_rows<D>(qa, qh, row, seq_q);
  load_a_rows<D>(da, doh, row, seq_q);
  // D = rowsum(dO * O): this lane's elements of dO (its fragments) times the same ones of O
  float dsum[2] = {0.f, 0.f}, lse2[2];
#pragma unroll
  for (int s = 0; s < D / 16; ++s)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t qr = row[r % 2];
      if (qr >= seq_q) continue;
      const float2 ov = MmaType<T>::unpack(pair(oh + qr * D + s * 16 + 2 * t + 8 * (r / 2)));
      const float2 dv = MmaType<T>::unpack(da[s][r]);
      dsum[r % 2] += ov.x * dv.x + ov.y * dv.y;
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    dsum[h] += __shfl_xor_sync(0xffffffffu, dsum[h], 1);  // the row's sum over its 4 lanes
    dsum[h] += __shfl_xor_sync(0xffffffffu, dsum[h], 2);
    const bool ok = row[h] < seq_q;
    if (ok && t == 0) delta[bh * seq_q + row[h]] = dsum[h];
    lse2[h] = ok ? lse[bh * seq_q + row[h]] * kLog2e : 0.f;  // L in base 2, as the scores
  }
  float acc[D / 8][4] = {};  // dQ / scale

  const int64_t key_end = CAUSAL ? min(seq_k, m0 + kBwdRows) : seq_k;
  for (int64_t tile = 0; tile < key_end; tile += TILE) {
    __syncthreads();  // every warp is done with the previous tile
    load_rows_async<TILE, D>(k_s, kh, tile, seq_k);
    load_rows_async<TILE, D>(v_s, vh, tile, seq_k);
    cp_async_wait<0>();
    __syncthreads();
    float s[TILE / 8][4], dp[TILE / 8][4];
    scores<T, D, TILE>(s, qa, k_s);   // S = Q K^T
    scores<T, D, TILE>(dp, da, v_s);  // dP = dO V^T
#pragma unroll
    for (int j = 0; j < TILE / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = tile + j * 8 + 2 * t + e % 2;
        const bool hidden = key >= seq_k || (CAUSAL && key > row[e / 2]);
        const float p = hidden ? 0.f : exp2f(s[j][e] * scale_log2 - lse2[e / 2]);
        s[j][e] = p * (dp[j][e] - dsum[e / 2]);  // dS
      }
    accumulate<T, D, TILE>(acc, s, k_s);  // dQ += dS K
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
    if (row[h] < seq_q) store_row<T, D>(dq + (bh * seq_q + row[h]) * D, acc, h, scale);
}

// TILE: queries per shared-memory tile
template <typename T, int D, int TILE, bool CAUSAL>
__global__ void __launch_bounds__(kWarp * kMmaWarps)
attention_bwd_dkdv_mma(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       const T* __restrict__ d_o, const float* __restrict__ lse, const float* __restrict__ delta,
                       T* __restrict__ dk, T* __restrict__ dv, int64_t seq_q, int64_t seq_k, float scale_log2,
                       float scale) {
  __shared__ __align__(16) uint16_t q_s[TILE][D + kPad];
  __shared__ __align__(16) uint16_t do_s[TILE][D + kPad];
  __shared__ float lse2_s[TILE], delta_s[TILE];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const int64_t bh = blockIdx.y, n0 = static_cast<int64_t>(blockIdx.x) * kBwdRows;
  const int64_t key[2] = {n0 + warp * 16 + g, n0 + warp * 16 + g + 8};
  const auto head = [bh](const T* p, int64_t n) { return reinterpret_cast<const uint16_t*>(p) + bh * n * D; };
  const uint16_t *qh = head(q, seq_q), *doh = head(d_o, seq_q), *kh = head(k, seq_k), *vh = head(v, seq_k);

  uint32_t ka[D / 16][4], va[D / 16][4];  // K and V as A fragments
  load_a_rows<D>(ka, kh, key, seq_k);
  load_a_rows<D>(va, vh, key, seq_k);
  float acc_k[D / 8][4] = {}, acc_v[D / 8][4] = {};  // dK / scale, dV

  // causal: the queries before n0 see none of this block's keys
  for (int64_t tile = CAUSAL ? n0 / TILE * TILE : 0; tile < seq_q; tile += TILE) {
    __syncthreads();  // every warp is done with the previous tile
    load_rows_async<TILE, D>(q_s, qh, tile, seq_q);
    load_rows_async<TILE, D>(do_s, doh, tile, seq_q);
    for (int i = threadIdx.x; i < TILE; i += kWarp * kMmaWarps) {
      const bool ok = tile + i < seq_q;
      lse2_s[i] = ok ? lse[bh * seq_q + tile + i] * kLog2e : 0.f;
      delta_s[i] = ok ? delta[bh * seq_q + tile + i] : 0.f;
    }
    cp_async_wait<0>();
    __syncthreads();
    float s[TILE / 8][4], dp[TILE / 8][4];
    scores<T, D, TILE>(s, ka, q_s);    // S^T = K Q^T
    scores<T, D, TILE>(dp, va, do_s);  // dP^T = V dO^T
#pragma unroll
    for (int j = 0; j < TILE / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j * 8 + 2 * t + e % 2;  // the query, within the tile
        const bool hidden = tile + col >= seq_q || (CAUSAL && key[e / 2] > tile + col);
        const float p = hidden ? 0.f : exp2f(s[j][e] * scale_log2 - lse2_s[col]);
        s[j][e] = p;                                // P^T
        dp[j][e] = p * (dp[j][e] - delta_s[col]);  // dS^T
      }
    accumulate<T, D, TILE>(acc_v, s, do_s);  // dV += P^T dO
    accumulate<T, D, TILE>(acc_k, dp, q_s);  // dK += dS^T Q
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (key[h] >= seq_k) continue;
    store_row<T, D>(dk + (bh * seq_k + key[h]) * D, acc_k, h, scale);
    store_row<T, D>(dv + (bh * seq_k + key[h]) * D, acc_v, h, 1.f);
  }
}

template <typename T, int D, int DQ_TILE, int DKDV_TILE>
cudaError_t launch_bwd_mma(const void* q, const void* k, const void* v, const void* o, const void* d_o,
                           const float* lse, float* delta, void* dq, void* dk, void* dv, int64_t bh, int64_t seq_q,
                           int64_t seq_k, float scale, bool causal, cudaStream_t stream) {
  const auto blocks = [bh](int64_t rows) {
    return dim3(static_cast<unsigned>((rows + kBwdRows - 1) / kBwdRows), static_cast<unsigned>(bh));
  };
  const T *tq = static_cast<const T*>(q), *tk = static_cast<const T*>(k), *tv = static_cast<const T*>(v);
  const T *to = static_cast<const T*>(o), *tdo = static_cast<const T*>(d_o);
  const float scale_log2 = scale * kLog2e;
  auto both = [&](auto dq_kernel, auto dkdv_kernel) {  // dQ first: it stores D, which dK, dV read
    dq_kernel<<<blocks(seq_q), kWarp * kMmaWarps, 0, stream>>>(tq, tk, tv, to, tdo, lse, delta, static_cast<T*>(dq),
                                                               seq_q, seq_k, scale_log2, scale);
    dkdv_kernel<<<blocks(seq_k), kWarp * kMmaWarps, 0, stream>>>(tq, tk, tv, tdo, lse, delta, static_cast<T*>(dk),
                                                                 static_cast<T*>(dv), seq_q, seq_k, scale_log2, scale);
  };
  if (causal) both(attention_bwd_dq_mma<T, D, DQ_TILE, true>, attention_bwd_dkdv_mma<T, D, DKDV_TILE, true>);
  else both(attention_bwd_dq_mma<T, D, DQ_TILE, false>, attention_bwd_dkdv_mma<T, D, DKDV_TILE, false>);
  return cudaGetLastError();
}

// head dim 128: smaller tiles (32 keys for dQ, 16 queries for dK, dV: its two accumulators are
// 128 registers), so that fragments and accumulators stay in registers
template <typename T>
cudaError_t launch_attention_bwd_mma(const void* q, const void* k, const void* v, const void* o, const void* d_o,
                                     const float* lse, float* delta, void* dq, void* dk, void* dv, int64_t bh,
                                     int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, bool causal,
                                     cudaStream_t stream) {
  if (head_dim == 64)
    return launch_bwd_mma<T, 64, 64, 64>(q, k, v, o, d_o, lse, delta, dq, dk, dv, bh, seq_q, seq_k, scale, causal,
                                         stream);
  return launch_bwd_mma<T, 128, 32, 16>(q, k, v, o, d_o, lse, delta, dq, dk, dv, bh, seq_q, seq_k, scale, causal,
                                        stream);
}

}  // namespace st

extern "C" int st_attention_bwd_mma_supported(int dtype, int64_t head_dim, const void* q, const void* k,
                                              const void* v, const void* o, const void* d_o) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return st_attention_fwd_mma_supported(dtype, head_dim, q, k, v, o) && aligned(q) && aligned(d_o);
}

extern "C" int st_attention_bwd_mma(int dtype, const void* q, const void* k, const void* v, const void* o,
                                    const void* d_o, const float* lse, float* delta, void* dq, void* dk, void* dv,
                                    int64_t bh, int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale,
                                    int causal, cudaStream_t stream) {
  if (!st_attention_bwd_mma_supported(dtype, head_dim, q, k, v, o, d_o)) return cudaErrorInvalidValue;
  if (bh == 0 || seq_q == 0) return cudaSuccess;
  if (seq_k == 0 || bh > 65535) return cudaErrorInvalidValue;  // gridDim.y limit
  if (dtype == ST_FLOAT16)
    return st::launch_attention_bwd_mma<__half>(q, k, v, o, d_o, lse, delta, dq, dk, dv, bh, seq_q, seq_k, head_dim,
                                                scale, causal != 0, stream);
  return st::launch_attention_bwd_mma<__nv_bfloat16>(q, k, v, o, d_o, lse, delta, dq, dk, dv, bh, seq_q, seq_k,
                                                     head_dim, scale, causal != 0, stream);
}
