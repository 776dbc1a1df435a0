// CUDA on the CPU: the subset of CUDA C++ the course's kernels use, as host C++ (g++ -std=c++17).
// scaletrain/ops/toolchain/cuda_cpu.py compiles the unmodified kernels/*.cu with this header in front
// (`-include cuda_runtime.h`: every CUDA header in this folder includes only this file), after
// rewriting each `kernel<<<grid, block, smem, stream>>>(args)` into a cuda_emu::Launch and each
// `extern __shared__ T name[];` into a pointer to the launch's dynamic shared memory.
//
// Execution model (runtime.cpp): blocks run one after another; the threads of a block run as
// fibers, each until it reaches a synchronization point, warp by warp: a warp's lanes run until
// all of them wait, the warp's collectives complete, and only then does the next warp run.  So a
// missing __syncthreads lets one warp race ahead of the others: its read of shared memory that
// another thread has not written yet (or wrote with no barrier in between) stops the launch
// (runtime.cpp's race check; shared memory also starts as NaN, 0xff bytes, in every block); a
// shuffle completes only when all lanes of its mask are in it, otherwise the launch fails naming
// the threads.
//
// Supported: __global__/__device__/__host__/__forceinline__/__launch_bounds__, threadIdx,
// blockIdx, blockDim, gridDim, static and extern (dynamic) __shared__, __syncthreads,
// __syncwarp, __shfl_sync/_up/_down/_xor (width included), __ballot_sync/__any_sync/__all_sync,
// atomics (plain read-modify-write: only one thread runs at a time), __half/__nv_bfloat16 with
// round-to-nearest-even conversions, float2/float4/int4, the fast-math intrinsics (computed with
// the precise libm function), min/max, cudaGetLastError, the tensor-core mma.sync m16n8k16 (fp16 /
// bf16 in, fp32 accumulate) and ldmatrix (kernels/mma.cuh), cp.async (kernels/async_copy.cuh).  Not modelled: timing, occupancy,
// coalescing, bank conflicts, memory ordering between blocks, independent thread scheduling
// beyond synchronization points, texture/constant caches, streams (launches are synchronous).
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- qualifiers -------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __constant__ static
// Static shared memory: one copy per OS thread (blocks run one at a time), all in this library's
// thread-local block, which the runtime fills with 0xff (NaN in every float format) before each
// block and watches for races.
#define __shared__ static thread_local __attribute__((aligned(16)))

// ---- vector types and launch geometry ---------------------------------------------------------
struct uint3 { unsigned x, y, z; };
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) int2 { int x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

namespace cuda_emu {
struct Index { uint3 thread, block; dim3 block_dim, grid_dim; };
extern Index g_index;  // the running fiber's indices (runtime.cpp switches them)
}  // namespace cuda_emu
#define threadIdx (::cuda_emu::g_index.thread)
#define blockIdx (::cuda_emu::g_index.block)
#define blockDim (::cuda_emu::g_index.block_dim)
#define gridDim (::cuda_emu::g_index.grid_dim)
#define warpSize 32

// ---- runtime API -------------------------------------------------------------------------------
typedef struct CUstream_st* cudaStream_t;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9,
                   cudaErrorIllegalAddress = 700, cudaErrorLaunchTimeout = 702, cudaErrorLaunchFailure = 719 };
namespace cuda_emu {
cudaError_t take_error();   // the sticky error of the launches so far, cleared
const char* error_name(int code);
}  // namespace cuda_emu
inline cudaError_t cudaGetLastError() { return ::cuda_emu::take_error(); }
inline cudaError_t cudaPeekAtLastError() { return ::cuda_emu::take_error(); }
inline const char* cudaGetErrorString(cudaError_t e) { return ::cuda_emu::error_name(e); }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }  // launches are synchronous
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
constexpr int kEmulatedSMs = 2;  // few "SMs": a persistent grid then covers its rows in several rounds
inline cudaError_t cudaGetDevice(int* device) { *device = 0; return cudaSuccess; }
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  if (attr != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
  *value = kEmulatedSMs;
  return cudaSuccess;
}

// ---- synchronization and warp collectives (the fiber yields to the scheduler) ------------------
namespace cuda_emu {
enum Op { kSyncWarp, kShflIdx, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kMma, kLdmatrix };
void syncthreads(const char* file, int line);
// Waits until every lane of `mask` is in the same collective; `in`/`out`: this lane's bytes.
void warp_op(Op op, const char* file, int line, unsigned mask, const void* in, void* out, int size, int param,
             int width);
void* dynamic_shared();
unsigned active_mask();

template <Op OP, typename T>
T shfl(const char* file, int line, unsigned mask, T v, int param, int width = 32) {
  static_assert(sizeof(T) <= 16 && std::is_trivially_copyable<T>::value, "shuffle of a value over 16 bytes");
  T out;
  warp_op(OP, file, line, mask, &v, &out, sizeof(T), param, width);
  return out;
}
template <Op OP>
unsigned vote(const char* file, int line, unsigned mask, int predicate) {
  unsigned out, in = predicate != 0;
  warp_op(OP, file, line, mask, &in, &out, sizeof(unsigned), 0, 32);
  return out;
}
inline void syncwarp(const char* file, int line, unsigned mask = 0xffffffffu) {
  warp_op(kSyncWarp, file, line, mask, nullptr, nullptr, 0, 0, 32);
}
}  // namespace cuda_emu
#define __syncthreads() ::cuda_emu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::cuda_emu::syncwarp(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_sync(...) ::cuda_emu::shfl<::cuda_emu::kShflIdx>(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) ::cuda_emu::shfl<::cuda_emu::kShflUp>(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) ::cuda_emu::shfl<::cuda_emu::kShflDown>(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) ::cuda_emu::shfl<::cuda_emu::kShflXor>(__FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(mask, p) ::cuda_emu::vote<::cuda_emu::kBallot>(__FILE__, __LINE__, mask, p)
#define __any_sync(mask, p) ::cuda_emu::vote<::cuda_emu::kAny>(__FILE__, __LINE__, mask, p)
#define __all_sync(mask, p) ::cuda_emu::vote<::cuda_emu::kAll>(__FILE__, __LINE__, mask, p)
#define __activemask() ::cuda_emu::active_mask()
inline void __threadfence() {}
inline void __threadfence_block() {}
template <typename T> inline T __ldg(const T* p) { return *p; }

// ---- tensor cores: mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 ------------
// Kernels reach it through kernels/mma.cuh, whose inline PTX nvcc compiles and whose `#ifdef
// CUDA_EMU` branch calls this: a warp collective of all 32 lanes, each passing the registers the
// PTX ISA assigns it (a: four .b32 of two 16-bit elements, b: two, c and d: four fp32), which
// runtime.cpp reassembles into A (16 x 16), B (16 x 8), C by the ISA's documented fragment layout,
// multiplies, and scatters back: elements a kernel puts in the wrong register land in the wrong
// place of A or B, as on the GPU.  type: 1 fp16, 2 bf16 (StDtype).
//
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (mma.cuh's ldmatrix_x4): lane 8 i + r passes
// row r (16 bytes) of 8 x 8 matrix i, read here by the lane itself (a checked shared-memory read);
// the collective hands each lane its fragment of the four matrices, transposed with `trans`.
namespace cuda_emu {
void mma_sync(const char* file, int line, int type, float* d, const uint32_t* a, const uint32_t* b, const float* c);
void ldmatrix_sync(const char* file, int line, int trans, uint32_t* d, const uint32_t* row);
inline void ldmatrix_x4(const char* file, int line, int trans, uint32_t* d, const void* row) {
  const uint32_t* p = static_cast<const uint32_t*>(row);
  const uint32_t words[4] = {p[0], p[1], p[2], p[3]};
  ldmatrix_sync(file, line, trans, d, words);
}
}  // namespace cuda_emu
//
// cp.async (kernels/async_copy.cuh): a 16-byte global -> shared copy that lands only when a
// cp.async.wait_group of the issuing thread releases its commit group (runtime.cpp).
namespace cuda_emu {
void cp_async(void* dst, const void* src, size_t n);
void cp_async_commit();
void cp_async_wait(int pending);
}  // namespace cuda_emu
#define CUDA_EMU 1

// One thread runs at a time and switches only at synchronization points: plain read-modify-write,
// outside the race check (an atomic is not a race), recorded as a write for later plain reads.
namespace cuda_emu { void note_atomic(void* p, size_t n); }
#define CUDA_EMU_ATOMIC(name, update)                                                 \
  template <typename T> __attribute__((no_sanitize_thread)) inline T name(T* p, T v) { \
    T old = *p;                                                                        \
    *p = (update);                                                                     \
    ::cuda_emu::note_atomic(p, sizeof(T));                                             \
    return old;                                                                        \
  }
CUDA_EMU_ATOMIC(atomicAdd, old + v)
CUDA_EMU_ATOMIC(atomicSub, old - v)
CUDA_EMU_ATOMIC(atomicExch, v)
CUDA_EMU_ATOMIC(atomicMax, old < v ? v : old)
CUDA_EMU_ATOMIC(atomicMin, v < old ? v : old)
#undef CUDA_EMU_ATOMIC
template <typename T> __attribute__((no_sanitize_thread)) inline T atomicCAS(T* p, T cmp, T v) {
  T old = *p;
  if (old == cmp) *p = v;
  ::cuda_emu::note_atomic(p, sizeof(T));
  return old;
}

// ---- math --------------------------------------------------------------------------------------
// The fast intrinsics are approximations on a GPU (__expf: ~2 ulp); here they are libm's.
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.f / x; }
inline float __fdiv_rn(float x, float y) { return x / y; }  // IEEE, also under --use_fast_math
// rounded and never contracted into a later add (the emulator builds with -ffp-contract=fast, as
// nvcc fuses by default): an FMA with 0 is the rounded product itself
inline float __fmul_rn(float x, float y) { return fmaf(x, y, 0.f); }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
// CUDA's global min / max accept any mix of arithmetic types (host and device).
template <typename A, typename B>
using cuda_emu_arith_t = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value,
                                          std::common_type_t<A, B>>;
template <typename A, typename B> inline cuda_emu_arith_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <typename A, typename B> inline cuda_emu_arith_t<A, B> max(A a, B b) { return a < b ? b : a; }

#define CUDART_INF_F __builtin_inff()
#define CUDART_NAN_F __builtin_nanf("")
#define CUDART_INF __builtin_inf()
#define CUDART_PI_F 3.141592654f

// ---- fp16 / bf16 storage: every conversion rounds to nearest, ties to even (as the GPU does) ---
namespace cuda_emu {
inline uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
inline uint16_t float_to_half(float f) {
  const uint32_t x = bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN stays NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u)  // below 2^-14: subnormal half, a multiple of 2^-24; rint rounds to even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(rintf(from_bits(ax) * 16777216.f)));
  return static_cast<uint16_t>(sign | ((ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u) >> 13));
}
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) return from_bits(sign | bits(static_cast<float>(mant) * 5.9604644775390625e-8f));  // exact
  if (exp == 31) return from_bits(sign | 0x7f800000u | (mant << 13));
  return from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}
inline uint16_t float_to_bf16(float f) {
  const uint32_t x = bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
inline float bf16_to_float(uint16_t b) { return from_bits(static_cast<uint32_t>(b) << 16); }
}  // namespace cuda_emu

struct __half {
  uint16_t __x;
  __half() = default;
  __half(float f) : __x(::cuda_emu::float_to_half(f)) {}
  __half(double f) : __half(static_cast<float>(f)) {}
  __half(int i) : __half(static_cast<float>(i)) {}
  operator float() const { return ::cuda_emu::half_to_float(__x); }
};
struct __nv_bfloat16 {
  uint16_t __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(::cuda_emu::float_to_bf16(f)) {}
  __nv_bfloat16(double f) : __nv_bfloat16(static_cast<float>(f)) {}
  __nv_bfloat16(int i) : __nv_bfloat16(static_cast<float>(i)) {}
  operator float() const { return ::cuda_emu::bf16_to_float(__x); }
};
struct alignas(4) __half2 { __half x, y; };
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };
typedef __half half;
typedef __half2 half2;
typedef __nv_bfloat16 nv_bfloat16;

inline float __half2float(__half h) { return h; }
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return b; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float2 __half22float2(__half2 h) { return {h.x, h.y}; }
inline __half2 __float22half2_rn(float2 f) { return {__half(f.x), __half(f.y)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return {h.x, h.y}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return {__nv_bfloat16(f.x), __nv_bfloat16(f.y)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__nv_bfloat16(a), __nv_bfloat16(b)}; }

// ---- launches: `k<<<grid, block, smem, stream>>>(args)` becomes
//      ::cuda_emu::Launch("k", grid, block, smem, stream)(k, args) ------------------------------
namespace cuda_emu {
using Body = void (*)(void*);
void run_grid(const char* kernel, dim3 grid, dim3 block, size_t smem, Body body, void* arg);
// "softmax_fwd_rows<float, 32, 2>": the instantiated kernel's symbol, demangled; `text` (the
// launch's source) when the kernel has no exported symbol (static, anonymous namespace).
const char* kernel_name(void* kernel, const char* text);

struct Launch {
  const char* text;
  dim3 grid, block;
  size_t smem;
  Launch(const char* t, dim3 g, dim3 b, size_t s = 0, cudaStream_t = nullptr) : text(t), grid(g), block(b), smem(s) {}

  template <typename... P, typename... A>
  void operator()(void (*kernel)(P...), A&&... args) const {
    static_assert(sizeof...(P) == sizeof...(A), "a kernel launched with the wrong number of arguments");
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);  // converted once, as the launch does
    auto call = [&] { std::apply(kernel, params); };                  // every thread gets its own copies
    run_grid(kernel_name(reinterpret_cast<void*>(kernel), text), grid, block, smem,
             [](void* f) { (*static_cast<decltype(call)*>(f))(); }, &call);
  }
};
}  // namespace cuda_emu
