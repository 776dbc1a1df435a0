// Asynchronous global -> shared copies (sm_80+; PTX ISA, "cp.async"): a thread issues 16-byte
// copies, closes them into a commit group, and later waits for its groups; meanwhile it computes.
// FlashAttention-2's forward (Dao 2023, Sec. 3) loads the next K / V tile this way while the
// tensor cores work on the current one.  A wait covers only the calling thread's copies: other
// threads see the data after the __syncthreads that follows every thread's wait.
// The CPU emulator (kernels/cuda_cpu, CUDA_EMU defined) lands each copy only at the wait that
// releases its group, so a read before the wait sees stale data, and one before the barrier a race.
#pragma once

#include <stdint.h>

namespace st {

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
#if defined(CUDA_EMU)
  ::cuda_emu::cp_async(smem, gmem, 16);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(gmem));
#elif defined(__CUDA_ARCH__)
  __trap();  // no cp.async before sm_80: the launcher never picks a kernel using it there
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(CUDA_EMU)
  ::cuda_emu::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most PENDING of this thread's committed groups (the newest) are still in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
#if defined(CUDA_EMU)
  ::cuda_emu::cp_async_wait(PENDING);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
#endif
}

}  // namespace st
