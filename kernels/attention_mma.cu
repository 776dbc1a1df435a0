// FlashAttention-2's forward on tensor cores: O = softmax(Q K^T * scale) V for fp16 / bf16 storage
// at head dim 64 or 128 (sm_80+), fp32 accumulation and softmax.  attention.cu's scalar kernel
// remains the fallback (fp32, other head dims, older GPUs) and the backward.
// `nvcc -std=c++17 -arch=sm_80 -c kernels/attention_mma.cu`.
//
// The work split of Dao 2023 (FlashAttention-2, Algorithm 1 and Sec. 3.3): a CTA of kMmaWarps
// warps owns kBlockM = 16 kMmaWarps query rows, each warp 16 of them, and walks the key tiles of
// kBlockN keys staged in shared memory; no warp shares its rows, so the softmax never crosses
// warps.  Per tile a warp computes its 16 x kBlockN scores S = Q K^T with mma.sync m16n8k16
// (kernels/mma.cuh; K and V reach the fragments through ldmatrix, V transposed on the way), keeps
// the running row max m and sum l (Milakov & Gimelshein's online softmax), rescales its output
// accumulator by exp(m_old - m_new) and adds P V, P being the score fragment itself re-packed as
// the next mma's A operand (a C fragment of two adjacent 8-key blocks is an A fragment of 16 keys).
// The division by l happens once, at the end (FlashAttention-2's first tweak).  K and V come in by
// cp.async (kernels/async_copy.cuh) one tile ahead of their use, V while S is computed and the
// next K while P V is, in one buffer each, as FlashAttention-2's kernels do.  Causal: key tiles
// past the CTA's last query are never loaded; only the tiles that cross the diagonal or the end of
// the keys are masked.  exp2 with log2(e) folded into the scale, as FlashAttention-2's kernels do.
#include "attention_mma.cuh"
#include "fused_launchers.h"

namespace st {

constexpr int kBlockM = 16 * kMmaWarps;  // query rows per CTA
constexpr int kBlockN = 64;              // keys per shared-memory tile

template <typename T, int D, bool CAUSAL>
__global__ void __launch_bounds__(kWarp * kMmaWarps)
attention_fwd_mma(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                  float* __restrict__ lse, int64_t seq_q, int64_t seq_k, float scale_log2) {
  __shared__ __align__(16) uint16_t k_s[kBlockN][D + kPad];
  __shared__ __align__(16) uint16_t v_s[kBlockN][D + kPad];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int g = lane / 4, t = lane % 4;  // the PTX fragment layout's groupID, threadID_in_group
  // causal: the CTAs with the most key tiles (the last query rows) start first, so that the short
  // ones fill the tail of the grid instead of the long ones (FlashAttention-2's scheduling)
  const unsigned m_block = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int64_t bh = blockIdx.y, m0 = static_cast<int64_t>(m_block) * kBlockM;
  const int64_t row[2] = {m0 + warp * 16 + g, m0 + warp * 16 + g + 8};  // this lane's two query rows
  const uint16_t* qh = reinterpret_cast<const uint16_t*>(q) + bh * seq_q * D;
  const uint16_t* kh = reinterpret_cast<const uint16_t*>(k) + bh * seq_k * D;
  const uint16_t* vh = reinterpret_cast<const uint16_t*>(v) + bh * seq_k * D;

  uint32_t qa[D / 16][4];  // Q as A fragments, from global memory once
  load_a_rows<D>(qa, qh, row, seq_q);
  float acc[D / 8][4];  // O (16 x D): one C fragment per 8 columns
#pragma unroll
  for (int x = 0; x < D / 8; ++x)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[x][e] = 0.f;
  float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f};  // per row; l: this lane's share

  // FlashAttention-2's pipeline, one buffer each: V of a tile lands while S = Q K^T is computed,
  // K of the next tile while O += P V is
  const int64_t key_end = CAUSAL ? min(seq_k, m0 + kBlockM) : seq_k;
  load_rows_async<kBlockN, D>(k_s, kh, 0, seq_k);
  for (int64_t tile = 0; tile < key_end; tile += kBlockN) {
    cp_async_wait<0>();  // this thread's copies of K have landed
    __syncthreads();     // everyone's; and every warp is done with the previous V
    load_rows_async<kBlockN, D>(v_s, vh, tile, seq_k);
    float s[kBlockN / 8][4];  // S = Q K^T (16 x kBlockN): one C fragment per 8 keys
    scores<T, D, kBlockN>(s, qa, k_s);
    const bool edge = tile + kBlockN > seq_k || (CAUSAL && tile + kBlockN - 1 > m0 + warp * 16);
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = tile + j * 8 + 2 * t + e % 2;
        const bool hidden = edge && (key >= seq_k || (CAUSAL && key > row[e / 2]));
        s[j][e] = hidden ? -CUDART_INF_F : s[j][e] * scale_log2;
      }
    // online softmax: a row's kBlockN scores sit in the 4 lanes of its group (2 per 8-key block)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m[h];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // a row that has seen only hidden keys keeps m = -inf: subtract 0 instead (exp2(-inf) = 0)
      const float base = mx == -CUDART_INF_F ? 0.f : mx;
      const float alpha = exp2f(m[h] - base);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          s[j][e] = exp2f(s[j][e] - base);
          sum += s[j][e];
        }
      l[h] = l[h] * alpha + sum;
      m[h] = mx;
#pragma unroll
      for (int x = 0; x < D / 8; ++x) {
        acc[x][2 * h] *= alpha;
        acc[x][2 * h + 1] *= alpha;
      }
    }
    cp_async_wait<0>();  // V has landed
    __syncthreads();     // for every thread; and every warp is done with K
    if (tile + kBlockN < key_end) load_rows_async<kBlockN, D>(k_s, kh, tile + kBlockN, seq_k);
    accumulate<T, D, kBlockN>(acc, s, v_s);  // O += P V, P rounded to T
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);  // the row's sum over its 4 lanes
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (row[h] >= seq_q) continue;
    store_row<T, D>(o + (bh * seq_q + row[h]) * D, acc, h, 1.f / l[h]);
    if (t == 0) lse[bh * seq_q + row[h]] = (m[h] + log2f(l[h])) * 0.6931471805599453f;  // back to base e
  }
}

template <typename T, int D>
cudaError_t launch_fwd_mma(const void* q, const void* k, const void* v, void* o, float* lse, int64_t bh,
                           int64_t seq_q, int64_t seq_k, float scale, bool causal, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((seq_q + kBlockM - 1) / kBlockM), static_cast<unsigned>(bh));
  const float scale_log2 = scale * 1.4426950408889634f;  // exp(x s) = exp2(x s log2(e))
  auto args = [&](auto kernel) {
    kernel<<<grid, kWarp * kMmaWarps, 0, stream>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                    static_cast<const T*>(v), static_cast<T*>(o), lse, seq_q, seq_k,
                                                    scale_log2);
  };
  if (causal) args(attention_fwd_mma<T, D, true>);
  else args(attention_fwd_mma<T, D, false>);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_attention_fwd_mma(const void* q, const void* k, const void* v, void* o, float* lse, int64_t bh,
                                     int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, bool causal,
                                     cudaStream_t stream) {
  if (head_dim == 64) return launch_fwd_mma<T, 64>(q, k, v, o, lse, bh, seq_q, seq_k, scale, causal, stream);
  return launch_fwd_mma<T, 128>(q, k, v, o, lse, bh, seq_q, seq_k, scale, causal, stream);
}

}  // namespace st

extern "C" int st_attention_fwd_mma_supported(int dtype, int64_t head_dim, const void* q, const void* k,
                                              const void* v, const void* o) {
  const auto aligned = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  return (dtype == ST_FLOAT16 || dtype == ST_BFLOAT16) && (head_dim == 64 || head_dim == 128) &&
         aligned(k, 16) && aligned(v, 16) && aligned(q, 4) && aligned(o, 4);
}

extern "C" int st_attention_fwd_mma(int dtype, const void* q, const void* k, const void* v, void* o, float* lse,
                                    int64_t bh, int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale,
                                    int causal, cudaStream_t stream) {
  if (!st_attention_fwd_mma_supported(dtype, head_dim, q, k, v, o)) return cudaErrorInvalidValue;
  if (bh == 0 || seq_q == 0) return cudaSuccess;
  if (seq_k == 0 || bh > 65535) return cudaErrorInvalidValue;  // gridDim.y limit
  if (dtype == ST_FLOAT16)
    return st::launch_attention_fwd_mma<__half>(q, k, v, o, lse, bh, seq_q, seq_k, head_dim, scale, causal != 0,
                                                stream);
  return st::launch_attention_fwd_mma<__nv_bfloat16>(q, k, v, o, lse, bh, seq_q, seq_k, head_dim, scale,
                                                     causal != 0, stream);
}
