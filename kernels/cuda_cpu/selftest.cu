// Toy kernels for tests/test_cuda_cpu.py: each scenario exercises one CUDA feature or
// one error of the CPU emulator (kernels/cuda_cpu).  Built as the emulator's "softmax.cu", so
// st_softmax_fwd's causal_len picks the scenario; y is (rows, cols) fp32.
#include <cuda_runtime.h>

#include "launchers.h"

// One warp: lane l holds v = x[l]; row k of y gets the k-th collective's result for every lane.
__global__ void shuffles(const float* x, float* y) {
  const int lane = threadIdx.x;
  const float v = x[lane];
  y[0 * 32 + lane] = __shfl_xor_sync(0xffffffffu, v, 5);
  y[1 * 32 + lane] = __shfl_down_sync(0xffffffffu, v, 3);
  y[2 * 32 + lane] = __shfl_up_sync(0xffffffffu, v, 3);
  y[3 * 32 + lane] = __shfl_sync(0xffffffffu, v, 7);
  y[4 * 32 + lane] = __shfl_down_sync(0xffffffffu, v, 3, 8);
  y[5 * 32 + lane] = __shfl_sync(0xffffffffu, v, 9, 16);
  const unsigned ballot = __ballot_sync(0xffffffffu, v > 0.f);
  y[6 * 32 + lane] = static_cast<float>(ballot & 0xffffu) + 65536.f * static_cast<float>(ballot >> 16);
  __syncwarp();
  y[7 * 32 + lane] = static_cast<float>(__any_sync(0xffffffffu, lane == 3) + 2 * __all_sync(0xffffffffu, lane < 40));
}

// Row sums through dynamic shared memory: one block of `cols` threads per row.
template <bool SYNC>
__global__ void row_sum(const float* x, float* y, int cols) {
  extern __shared__ float partial[];
  partial[threadIdx.x] = x[blockIdx.x * cols + threadIdx.x];
  if (SYNC) __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int i = 0; i < cols; ++i) s += partial[i];
    y[blockIdx.x * cols] = s;
  }
}

__global__ void divergent_barrier(float* y) {
  if (threadIdx.x < 16) __syncthreads();
  y[threadIdx.x] = 1.f;
}

__global__ void shuffle_after_exit(const float* x, float* y) {
  if (threadIdx.x == 31) return;
  y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1);
}

__global__ void shuffle_outside_mask(const float* x, float* y) {
  if (threadIdx.x < 16) y[threadIdx.x] = __shfl_sync(0x0000ffffu, x[threadIdx.x], 20, 32);
}

__global__ void static_shared_overflow(float* y) {
  __shared__ float buf[32];
  volatile int i = threadIdx.x + 1;
  buf[i] = 1.f;
  __syncthreads();
  y[threadIdx.x] = buf[threadIdx.x];
}

__global__ void dynamic_shared_overflow(float* y) {
  extern __shared__ float buf[];
  buf[threadIdx.x + 1] = 1.f;
  y[threadIdx.x] = 0.f;
}

__global__ void spin(float* y) {
  volatile int forever = 1;
  while (forever) {
  }
  y[0] = 0.f;
}

// Thread 0 writes, another thread reads, ordered by `SYNC` (0: nothing, 1: __syncwarp, 2: __syncthreads).
template <int SYNC>
__global__ void handoff(float* y, int reader) {
  __shared__ float cell[1];
  if (threadIdx.x == 0) cell[0] = 7.f;
  if (SYNC == 1) __syncwarp();
  if (SYNC == 2) __syncthreads();
  if (threadIdx.x == reader) y[0] = cell[0];
}

__global__ void write_input(const float* x) { const_cast<float*>(x)[threadIdx.x] = 0.f; }

extern "C" int st_softmax_fwd(int, const void* xv, void* yv, int64_t rows, int64_t cols, MaskArgs, int64_t scenario,
                              cudaStream_t) {
  const float* x = static_cast<const float*>(xv);
  float* y = static_cast<float*>(yv);
  const int n = static_cast<int>(cols);
  switch (scenario) {
    case 0: shuffles<<<1, 32>>>(x, y); break;
    case 1: row_sum<true><<<static_cast<unsigned>(rows), n, n * sizeof(float)>>>(x, y, n); break;
    case 2: row_sum<false><<<static_cast<unsigned>(rows), n, n * sizeof(float)>>>(x, y, n); break;
    case 3: divergent_barrier<<<1, 32>>>(y); break;
    case 4: shuffle_after_exit<<<1, 32>>>(x, y); break;
    case 5: shuffle_outside_mask<<<1, 32>>>(x, y); break;
    case 6: static_shared_overflow<<<1, 32>>>(y); break;
    case 7: dynamic_shared_overflow<<<1, 32, 32 * sizeof(float)>>>(y); break;
    case 8: spin<<<1, 1>>>(y); break;
    case 9: write_input<<<1, 32>>>(x); break;
    case 10: spin<<<1, 2048>>>(y); break;
    case 11: handoff<0><<<1, 64>>>(y, 33); break;  // another warp, no barrier
    case 12: handoff<0><<<1, 64>>>(y, 1); break;   // the same warp, no __syncwarp
    case 13: handoff<1><<<1, 64>>>(y, 1); break;
    case 14: handoff<2><<<1, 64>>>(y, 33); break;
  }
  return cudaGetLastError();
}

extern "C" int st_softmax_bwd(int, const void*, const void*, void*, int64_t, int64_t, cudaStream_t) { return 0; }
extern "C" int st_layer_norm_fwd(int, const void*, const void*, const void*, void*, float*, float*, int64_t, int64_t,
                                 float, cudaStream_t) { return 0; }
extern "C" int st_layer_norm_bwd(int, const void*, const void*, const void*, const float*, const float*, void*, void*,
                                 void*, float*, int64_t, int64_t, cudaStream_t) { return 0; }
extern "C" int64_t st_layer_norm_bwd_workspace(int64_t, int64_t) { return 0; }
