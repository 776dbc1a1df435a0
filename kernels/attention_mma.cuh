// The warp-level pieces of FlashAttention-2 on mma.sync (Dao 2023, Algorithms 1 and 2), shared by
// the forward (attention_mma.cu) and the backward (attention_mma_bwd.cu).  A warp owns 16 rows
// of its left operand (queries in the forward and for dQ, keys for dK and dV); lane (g = lane / 4,
// t = lane % 4) holds rows g and g + 8 of every fragment (mma.cuh's layout).  Tiles of the other
// operand sit in shared memory, row-major, each row padded by kPad elements.
#pragma once

#include "async_copy.cuh"
#include "kernel_utils.cuh"
#include "mma.cuh"

namespace st {

constexpr int kMmaWarps = 4;  // warps per CTA, 16 rows each
constexpr int kPad = 8;       // 16-bit elements of padding per shared row: a row starts 4 banks
                              // further on, so an ldmatrix's 8 rows hit 32 different banks

// The 32 bits of two consecutive 16-bit elements p[0], p[1] (p[0] in the low half).
__device__ __forceinline__ uint32_t pair(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Starts copying ROWS x D 16-bit elements from row `first` of a row-major (n, D) matrix into
// `dst`, one cp.async commit group (they land while the warps compute); rows past n are zeroed at
// once (0 x NaN would poison the products).  16-byte copies: the launcher checks the alignment.
template <int ROWS, int D>
__device__ __forceinline__ void load_rows_async(uint16_t (*dst)[D + kPad], const uint16_t* src, int64_t first,
                                                int64_t n) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < ROWS * kChunks; i += kWarp * kMmaWarps) {
    const int r = i / kChunks, c = i % kChunks * 8;
    if (first + r < n) cp_async_16(&dst[r][c], src + (first + r) * D + c);
    else *reinterpret_cast<int4*>(&dst[r][c]) = int4{0, 0, 0, 0};
  }
  cp_async_commit();
}

// The A fragments (one per 16 columns) of this lane's rows row[0] = base + g, row[1] = base + g + 8
// of a row-major (n, D) matrix in global memory, read once; rows past n are zero.
template <int D>
__device__ __forceinline__ void load_a_rows(uint32_t (&a)[D / 16][4], const uint16_t* src, const int64_t (&row)[2],
                                            int64_t n) {
  const int t = threadIdx.x % kWarp % 4;
#pragma unroll
  for (int s = 0; s < D / 16; ++s)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t qr = row[r % 2];
      a[s][r] = qr < n ? pair(src + qr * D + s * 16 + 2 * t + 8 * (r / 2)) : 0u;
    }
}

// s = A B^T: A the warp's 16 x D rows (fragments), B the TILE x D rows of `b_s`; s[j] is the C
// fragment of columns 8j..8j+7.  B^T is K-major (B's rows as stored): ldmatrix without .trans.
template <typename T, int D, int TILE>
__device__ __forceinline__ void scores(float (&s)[TILE / 8][4], const uint32_t (&a)[D / 16][4],
                                       const uint16_t (*b_s)[D + kPad]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int j = 0; j < TILE / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
#pragma unroll
    for (int c = 0; c < D / 16; c += 2) {  // 32 columns of B's rows per ldmatrix
      uint32_t kb[4];
      ldmatrix_x4<false>(kb, &b_s[j * 8 + lane % 8][c * 16 + lane / 8 * 8]);
      const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
      mma_m16n8k16<T>(s[j], a[c], b0);
      mma_m16n8k16<T>(s[j], a[c + 1], b1);
    }
  }
}

// acc += P V: P the warp's 16 x TILE C fragments (as `scores` returns them), rounded to T; V the
// TILE x D rows of `v_s`.  P's C fragments of columns 16c.. and 16c+8.. are the A fragment of
// columns 16c..16c+15 (FlashAttention-2 keeps P in registers); V, row-major, is transposed into
// B fragments by ldmatrix .trans.
template <typename T, int D, int TILE>
__device__ __forceinline__ void accumulate(float (&acc)[D / 8][4], const float (&p)[TILE / 8][4],
                                           const uint16_t (*v_s)[D + kPad]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int c = 0; c < TILE / 16; ++c) {
    const uint32_t pa[4] = {MmaType<T>::pack(p[2 * c][0], p[2 * c][1]), MmaType<T>::pack(p[2 * c][2], p[2 * c][3]),
                            MmaType<T>::pack(p[2 * c + 1][0], p[2 * c + 1][1]),
                            MmaType<T>::pack(p[2 * c + 1][2], p[2 * c + 1][3])};
#pragma unroll
    for (int x = 0; x < D / 8; x += 2) {  // 16 columns of V per ldmatrix
      uint32_t vb[4];
      ldmatrix_x4<true>(vb, &v_s[c * 16 + lane / 8 % 2 * 8 + lane % 8][(x + lane / 16) * 8]);
      const uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
      mma_m16n8k16<T>(acc[x], pa, b0);
      mma_m16n8k16<T>(acc[x + 1], pa, b1);
    }
  }
}

// Stores this lane's share of row g + 8h of the warp's 16 x D accumulator, times `mul`, into `dst`
// (a row of D elements of T).
template <typename T, int D>
__device__ __forceinline__ void store_row(T* dst, const float (&acc)[D / 8][4], int h, float mul) {
  const int t = threadIdx.x % kWarp % 4;
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
#pragma unroll
  for (int x = 0; x < D / 8; ++x)
    out[(x * 8 + 2 * t) / 2] = MmaType<T>::pack(acc[x][2 * h] * mul, acc[x][2 * h + 1] * mul);
}

}  // namespace st
