// C signatures of the kernel launchers in softmax.cu and layer_norm.cu.  The torch binding
// (torch_binding.cpp) includes only this header, so the .cu files compile without torch and the
// binding compiles without CUDA device code.
//
// All tensors are row-major (rows, cols) and contiguous; every launcher returns the CUDA error
// of its launch (cudaSuccess == 0).  dtype: the storage type of x, y, dy, dx, mask, weight and
// bias; mean and rstd are always fp32 (rows,).
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum StDtype { ST_FLOAT32 = 0, ST_FLOAT16 = 1, ST_BFLOAT16 = 2 };

// An additive mask broadcast to (rows, cols) without copying: see `RowMask` in kernel_utils.cuh.
// ptr == NULL means no mask.
typedef struct MaskArgs {
  const void* ptr;
  int64_t size1, size2;               // rows run over a (*, size1, size2) grid in C order
  int64_t stride0, stride1, stride2;  // element strides of those three row indices
  int64_t col_stride;                 // element stride along the softmax dim (0 if broadcast)
} MaskArgs;

// y = softmax(x + mask) over each row; causal_len > 0 also hides columns c > r % causal_len.
int st_softmax_fwd(int dtype, const void* x, void* y, int64_t rows, int64_t cols, MaskArgs mask,
                   int64_t causal_len, cudaStream_t stream);

// dx = y * (dy - sum(dy * y)) over each row.
int st_softmax_bwd(int dtype, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols,
                   cudaStream_t stream);

// y = (x - mean) * rstd * weight + bias; weight/bias may be NULL (1 and 0).
int st_layer_norm_fwd(int dtype, const void* x, const void* weight, const void* bias, void* y,
                      float* mean, float* rstd, int64_t rows, int64_t cols, float eps,
                      cudaStream_t stream);

// dx for every row (weight may be NULL); then dweight and dbias (either may be NULL) reduced
// across rows through `workspace` (fp32, st_layer_norm_bwd_workspace(rows, cols) elements).
int st_layer_norm_bwd(int dtype, const void* dy, const void* x, const void* weight,
                      const float* mean, const float* rstd, void* dx, void* dweight, void* dbias,
                      float* workspace, int64_t rows, int64_t cols, cudaStream_t stream);

int64_t st_layer_norm_bwd_workspace(int64_t rows, int64_t cols);

#ifdef __cplusplus
}
#endif
