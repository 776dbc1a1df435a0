// C signatures of the launchers in attention.cu, attention_mma*.cu and cross_entropy.cu (module 1b), beside
// launchers.h's softmax and LayerNorm.  attention_binding.cpp includes only this header, so the
// .cu files compile without torch.  Every launcher returns the CUDA error of its launch
// (cudaSuccess == 0); dtype is a StDtype (launchers.h) naming the storage of the float tensors.
#pragma once

#include "launchers.h"

#ifdef __cplusplus
extern "C" {
#endif

// FlashAttention forward: q (bh, seq_q, head_dim), k and v (bh, seq_k, head_dim), contiguous;
// o like q; lse fp32 (bh, seq_q) = logsumexp of each scaled score row.  causal != 0 hides key j
// from query i when j > i.  head_dim <= 128.
int st_attention_fwd(int dtype, const void* q, const void* k, const void* v, void* o, float* lse,
                     int64_t bh, int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, int causal,
                     cudaStream_t stream);

// The same forward on tensor cores (attention_mma.cu: mma.sync, sm_80+), for fp16 / bf16 at
// head_dim 64 or 128 with k, v 16-byte and q, o 4-byte aligned: st_attention_fwd_mma_supported
// says whether it applies (else st_attention_fwd_mma returns cudaErrorInvalidValue).
int st_attention_fwd_mma_supported(int dtype, int64_t head_dim, const void* q, const void* k, const void* v,
                                   const void* o);
int st_attention_fwd_mma(int dtype, const void* q, const void* k, const void* v, void* o, float* lse,
                         int64_t bh, int64_t seq_q, int64_t seq_k, int64_t head_dim, float scale, int causal,
                         cudaStream_t stream);

// FlashAttention backward: dq like q, dk and dv like k, from o, d_o and the forward's lse; delta is
// an fp32 workspace of bh * seq_q elements (it receives D = rowsum(d_o * o)).
int st_attention_bwd(int dtype, const void* q, const void* k, const void* v, const void* o, const void* d_o,
                     const float* lse, float* delta, void* dq, void* dk, void* dv, int64_t bh, int64_t seq_q,
                     int64_t seq_k, int64_t head_dim, float scale, int causal, cudaStream_t stream);

// The same backward on tensor cores (attention_mma_bwd.cu), where st_attention_fwd_mma applies and q,
// d_o are 16-byte aligned too (st_attention_bwd_mma_supported); dq, dk, dv 4-byte aligned.
int st_attention_bwd_mma_supported(int dtype, int64_t head_dim, const void* q, const void* k, const void* v,
                                   const void* o, const void* d_o);
int st_attention_bwd_mma(int dtype, const void* q, const void* k, const void* v, const void* o, const void* d_o,
                         const float* lse, float* delta, void* dq, void* dk, void* dv, int64_t bh, int64_t seq_q,
                         int64_t seq_k, int64_t head_dim, float scale, int causal, cudaStream_t stream);

// Fused cross-entropy over (rows, vocab) logits with int64 targets (ignore_index rows give 0):
// loss[r] = (1 - eps) * (lse - x[t]) + eps * (lse - mean_j x[j]); lse fp32 (rows,) is saved.
int st_cross_entropy_fwd(int dtype, const void* logits, const int64_t* target, float* loss, float* lse,
                         int64_t rows, int64_t vocab, float smoothing, int64_t ignore_index, cudaStream_t stream);

// dlogits[r, j] = dloss[r] * (softmax(x)[j] - (1 - eps) [j == t] - eps / vocab), 0 for ignored rows.
int st_cross_entropy_bwd(int dtype, const void* logits, const int64_t* target, const float* lse,
                         const float* dloss, void* dlogits, int64_t rows, int64_t vocab, float smoothing,
                         int64_t ignore_index, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
