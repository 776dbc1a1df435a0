// The CUDA-on-CPU scheduler (see cuda_cpu.h for the model) and the C API that
// scaletrain/ops/toolchain/cuda_cpu.py calls through ctypes: guarded buffers, the launch trace, errors.
//
// Checks, each reported as "<kernel> <<<grid, block>>>: block (..), thread (..): what":
//  * global memory: every buffer the Python side passes ends flush against a PROT_NONE page and
//    inputs are read-only, so a read or write past the end (or a write to an input) faults at
//    once; the fault handler names the buffer and the byte offset.
//  * dynamic shared memory ends against a guard page as well; static __shared__ and local arrays
//    are bounds-checked by -fsanitize=bounds (a trap, reported the same way).
//  * shared-memory races: the kernels are compiled with -fsanitize=thread, whose load/store hooks
//    (defined at the end of this file) keep, per shared byte, the thread that wrote it last and
//    the barrier / warp-collective counts at that time.  A read of a byte no thread has written
//    in this block, or written by another thread with no __syncthreads (another warp) or no warp
//    collective (the same warp) in between, stops the launch naming both threads and the variable.
//  * __syncthreads reached by some threads while others exited or wait at another barrier,
//    a warp collective whose mask names a lane that exited or is missing, a shuffle reading a
//    lane outside its mask, a deadlock: reported with the threads and source lines involved.
//  * a launch running longer than the time limit is stopped (an infinite loop).
#include <ctype.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_cpu.h"

// Static __shared__ variables are this library's thread-locals (cuda_cpu.h): one contiguous block
// per OS thread, found through the loader. Touching the anchor allocates the calling thread's block.
thread_local char g_tls_anchor;

namespace cuda_emu {
Index g_index;

namespace {
constexpr size_t kStackBytes = 64 << 10;
constexpr int kMaxThreads = 1024;

enum class State { Ready, Barrier, Warp, Done };
struct AsyncCopy { char* dst; const char* src; size_t n; int group; };  // group -1: not committed yet
struct Fiber {
  void* sp;        // saved stack pointer (assembly switch)
#if !defined(__x86_64__) && !defined(__aarch64__)
  ucontext_t ctx;  // fallback switch
#endif
  uint3 tid;
  State state;
  const char* file;  // where it waits
  int line;
  Op op;
  unsigned mask;
  int param, width, size;
  unsigned char in[40], out[16];  // in: a shuffle's value, or an mma's a, b, c registers
  std::vector<AsyncCopy> copies;  // its cp.async copies not landed yet
  int groups;                     // its cp.async groups committed so far
};

struct Region { char* map; size_t map_len; char* p; size_t n; std::string name; bool writable; };

struct Fault { int sig; char* addr; bool write, known_write; };
struct SharedName { long offset, size; std::string name; };

struct Runtime {
  std::mutex mutex;  // one launch at a time per library
  std::vector<Fiber> fibers;
  std::vector<char*> stacks;  // each kStackBytes above a guard page
  std::vector<Region> regions;
  std::vector<std::string> trace;
  ucontext_t scheduler;
  void* scheduler_sp = nullptr;
  sigjmp_buf escape;
  volatile sig_atomic_t in_launch = 0;
  Fault fault{};
  int current = -1;
  const char* kernel = "";
  dim3 grid, block;
  Body body = nullptr;
  void* arg = nullptr;
  char* static_smem = nullptr;  // this thread's block of static __shared__ variables
  size_t static_bytes = 0;
  std::vector<SharedName> shared_names;
  char* dyn_smem = nullptr;  // current launch's dynamic shared memory, flush against a guard page
  size_t dyn_bytes = 0;
  Region dyn_region{};
  // shared-memory race check: per byte, the thread (linear id + 1) that wrote it last in this block,
  // and the block's barrier count and the writer warp's collective count at that write
  std::vector<uint32_t> writer, barrier_at, warp_at;
  std::vector<uint32_t> warp_epoch;  // completed collectives per warp
  uint32_t barrier_epoch = 0;
  volatile int tracking = 0;  // a fiber is running: the kernels' memory accesses are checked
  int error = cudaSuccess;
  std::string message;
  double time_limit_s = 120.0;
} rt;

std::string format(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

std::string where(int fiber) {
  const uint3 b = rt.fibers.empty() ? uint3{0, 0, 0} : g_index.block;
  std::string s = format("%s <<<(%u,%u,%u), (%u,%u,%u)>>>: block (%u,%u,%u)", rt.kernel, rt.grid.x, rt.grid.y,
                         rt.grid.z, rt.block.x, rt.block.y, rt.block.z, b.x, b.y, b.z);
  if (fiber >= 0) {
    const uint3 t = rt.fibers[fiber].tid;
    s += format(", thread (%u,%u,%u)", t.x, t.y, t.z);
  }
  return s;
}

void fail(int code, const std::string& what) {
  if (rt.error == cudaSuccess) {
    rt.error = code;
    rt.message = what;
  }
}

const char* op_name(Op op) {
  static const char* names[] = {"__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                "__shfl_xor_sync", "__ballot_sync", "__any_sync", "__all_sync",
                                "mma.sync.m16n8k16", "ldmatrix.x4"};
  return names[op];
}

std::string site(const Fiber& f) {
  const char* slash = strrchr(f.file, '/');
  return format("%s:%d", slash ? slash + 1 : f.file, f.line);
}

std::string waiting(const Fiber& f) {
  switch (f.state) {
    case State::Done: return "has exited";
    case State::Barrier: return "waits at __syncthreads (" + site(f) + ")";
    case State::Warp: return format("waits in %s (%s) with mask 0x%08x", op_name(f.op), site(f).c_str(), f.mask);
    default: return "is running";
  }
}

// ---- fibers: a context switch saves the callee-saved registers on the old stack ---------------
// x86-64 and aarch64 switch with a few instructions (ucontext's swapcontext makes a system call
// per switch, 10x slower); other systems fall back to ucontext.  Only x86-64 has been run so far.
#if defined(__x86_64__)
#define CUDA_EMU_ASM_SWITCH 1
extern "C" void cuda_emu_switch(void** save_sp, void* next_sp);
asm(R"(.text
.p2align 4
.type cuda_emu_switch,@function
cuda_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr (%rsp)
  fnstcw 8(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size cuda_emu_switch,.-cuda_emu_switch
)");
#elif defined(__aarch64__)
#define CUDA_EMU_ASM_SWITCH 1
extern "C" void cuda_emu_switch(void** save_sp, void* next_sp);
asm(R"(.text
.p2align 4
.type cuda_emu_switch,%function
cuda_emu_switch:
  sub sp, sp, #176
  stp x19, x20, [sp, #0]
  stp x21, x22, [sp, #16]
  stp x23, x24, [sp, #32]
  stp x25, x26, [sp, #48]
  stp x27, x28, [sp, #64]
  stp x29, x30, [sp, #80]
  stp d8, d9, [sp, #96]
  stp d10, d11, [sp, #112]
  stp d12, d13, [sp, #128]
  stp d14, d15, [sp, #144]
  mrs x9, fpcr
  str x9, [sp, #160]
  mov x9, sp
  str x9, [x0]
  mov sp, x1
  ldr x9, [sp, #160]
  msr fpcr, x9
  ldp x19, x20, [sp, #0]
  ldp x21, x22, [sp, #16]
  ldp x23, x24, [sp, #32]
  ldp x25, x26, [sp, #48]
  ldp x27, x28, [sp, #64]
  ldp x29, x30, [sp, #80]
  ldp d8, d9, [sp, #96]
  ldp d10, d11, [sp, #112]
  ldp d12, d13, [sp, #128]
  ldp d14, d15, [sp, #144]
  add sp, sp, #176
  ret
.size cuda_emu_switch,.-cuda_emu_switch
)");
#endif

void fiber_main() {
  rt.body(rt.arg);
  Fiber& f = rt.fibers[rt.current];
  f.state = State::Done;
#ifdef CUDA_EMU_ASM_SWITCH
  cuda_emu_switch(&f.sp, rt.scheduler_sp);  // never resumed
#endif  // (ucontext: uc_link returns to the scheduler)
}

void yield_to_scheduler() {
#ifdef CUDA_EMU_ASM_SWITCH
  cuda_emu_switch(&rt.fibers[rt.current].sp, rt.scheduler_sp);
#else
  swapcontext(&rt.fibers[rt.current].ctx, &rt.scheduler);
#endif
}

char* stack(int i) {
  while (static_cast<int>(rt.stacks.size()) <= i) {
    const size_t page = sysconf(_SC_PAGESIZE);
    char* m = static_cast<char*>(mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (m == MAP_FAILED) return nullptr;
    mprotect(m, page, PROT_NONE);  // overflow faults instead of corrupting the next stack
    rt.stacks.push_back(m + page);
  }
  return rt.stacks[i];
}

// A fresh fiber on stack i whose first switch enters fiber_main.
void start_fiber(Fiber& f, int i) {
#ifdef CUDA_EMU_ASM_SWITCH
  uintptr_t top = reinterpret_cast<uintptr_t>(stack(i) + kStackBytes) & ~uintptr_t{15};
  void** sp = reinterpret_cast<void**>(top);
#if defined(__x86_64__)
  *--sp = nullptr;                                    // fiber_main's (never used) return address
  *--sp = reinterpret_cast<void*>(&fiber_main);       // popped by `ret`: rsp = 8 mod 16 at entry
  for (int r = 0; r < 6; ++r) *--sp = nullptr;        // rbp rbx r12-r15
  sp -= 2;
  unsigned csr[4] = {};
  asm volatile("stmxcsr %0" : "=m"(csr[0]));
  asm volatile("fnstcw %0" : "=m"(csr[2]));
  memcpy(sp, csr, 16);
#else
  sp -= 22;  // 176 bytes: x19-x28, fp, lr, d8-d15, fpcr (one slot of padding)
  memset(sp, 0, 176);
  sp[11] = reinterpret_cast<void*>(&fiber_main);  // x30, the link register `ret` jumps to
  uint64_t fpcr;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  memcpy(&sp[20], &fpcr, 8);
#endif
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = stack(i);
  f.ctx.uc_stack.ss_size = kStackBytes;
  f.ctx.uc_link = &rt.scheduler;
  makecontext(&f.ctx, fiber_main, 0);
#endif
}

void run(int i) {
  rt.current = i;
  g_index.thread = rt.fibers[i].tid;
  rt.tracking = 1;
#ifdef CUDA_EMU_ASM_SWITCH
  cuda_emu_switch(&rt.scheduler_sp, rt.fibers[i].sp);
#else
  swapcontext(&rt.scheduler, &rt.fibers[i].ctx);
#endif
  rt.tracking = 0;
  rt.current = -1;
}

// ---- warp collectives ---------------------------------------------------------------------------
int lanes_in(int warp, int threads) { return threads - warp * 32 < 32 ? threads - warp * 32 : 32; }

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16} for the 32 lanes from `base` (PTX ISA,
// "Matrix Fragments for mma.m16n8k16 with floating point type"): with g = lane / 4 (groupID) and
// t = lane % 4 (threadID_in_group), a lane holds A[g + 8 ((i / 2) % 2)][2 t + i % 2 + 8 (i / 4)] as
// 16-bit element i < 8 of its a registers (element 2 r in the low half of register r), B[2 t + i % 2
// + 8 (i / 2)][g] as element i < 4 of b, and C, D[g + 8 (i / 2)][2 t + i % 2] as c[i], d[i].  The
// products are exact in fp32 and summed in double, then rounded once: the GPU's own order and
// rounding of the sum are unspecified (a few fp32 ulps apart).
void mma_m16n8k16(int base, int type) {
  float A[16][16], B[16][8], C[16][8];
  const auto element = [type](uint32_t reg, int i) {
    const uint16_t h = static_cast<uint16_t>(reg >> (16 * (i % 2)));
    return type == 2 ? bf16_to_float(h) : half_to_float(h);
  };
  for (int lane = 0; lane < 32; ++lane) {
    uint32_t a[4], b[2];
    float c[4];
    const unsigned char* in = rt.fibers[base + lane].in;
    memcpy(a, in, 16);
    memcpy(b, in + 16, 8);
    memcpy(c, in + 24, 16);
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 8; ++i) A[g + 8 * ((i / 2) % 2)][2 * t + i % 2 + 8 * (i / 4)] = element(a[i / 2], i);
    for (int i = 0; i < 4; ++i) B[2 * t + i % 2 + 8 * (i / 2)][g] = element(b[i / 2], i);
    for (int i = 0; i < 4; ++i) C[g + 8 * (i / 2)][2 * t + i % 2] = c[i];
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    float d[4];
    for (int i = 0; i < 4; ++i) {
      const int r = g + 8 * (i / 2), n = 2 * t + i % 2;
      double sum = C[r][n];
      for (int k = 0; k < 16; ++k) sum += static_cast<double>(A[r][k]) * B[k][n];
      d[i] = static_cast<float>(sum);
    }
    memcpy(rt.fibers[base + lane].out, d, sizeof d);
  }
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 for the 32 lanes from `base` (PTX ISA,
// "ldmatrix"): lane 8 i + r passed row r of matrix i; lane (g = lane / 4, t = lane % 4) receives
// in register i the elements M_i[g][2 t], M_i[g][2 t + 1] (low half first), or with .trans
// M_i[2 t][g], M_i[2 t + 1][g]: an mma fragment of the matrix, or of its transpose.
void ldmatrix_x4(int base, bool trans) {
  uint16_t m[4][8][8];
  for (int lane = 0; lane < 32; ++lane) memcpy(m[lane / 8][lane % 8], rt.fibers[base + lane].in, 16);
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    uint32_t d[4];
    for (int i = 0; i < 4; ++i) {
      const uint16_t lo = trans ? m[i][2 * t][g] : m[i][g][2 * t], hi = trans ? m[i][2 * t + 1][g] : m[i][g][2 * t + 1];
      d[i] = lo | static_cast<uint32_t>(hi) << 16;
    }
    memcpy(rt.fibers[base + lane].out, d, sizeof d);
  }
}

// Completes the collectives of `warp` whose every lane has arrived; false if none could.
bool resolve_warp(int warp, int threads) {
  const int base = warp * 32, lanes = lanes_in(warp, threads);
  bool any = false;
  for (int l = 0; l < lanes; ++l) {
    Fiber& f = rt.fibers[base + l];
    if (f.state != State::Warp) continue;
    const unsigned mask = f.mask, existing = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    if (!(mask & (1u << l))) {
      fail(cudaErrorLaunchFailure, where(base + l) + format(": %s (%s) with mask 0x%08x, which does not "
                                                            "include the calling lane %d",
                                                            op_name(f.op), site(f).c_str(), mask, l));
      return false;
    }
    if (mask & ~existing) {
      fail(cudaErrorLaunchFailure, where(base + l) + format(": %s (%s) with mask 0x%08x names lanes that do "
                                                            "not exist (this warp has %d threads)",
                                                            op_name(f.op), site(f).c_str(), mask, lanes));
      return false;
    }
    bool complete = true;
    for (int k = 0; k < lanes && complete; ++k) {
      if (!(mask & (1u << k))) continue;
      const Fiber& g = rt.fibers[base + k];
      if (g.state == State::Done) {
        fail(cudaErrorLaunchFailure, where(base + l) + format(": %s (%s) with mask 0x%08x, but lane %d (thread (%u,%u,%u)) "
                                                              "has exited: the lanes of a warp collective must all reach it",
                                                              op_name(f.op), site(f).c_str(), mask, k, g.tid.x, g.tid.y, g.tid.z));
        return false;
      }
      complete = g.state == State::Warp && g.mask == mask && g.op == f.op;
    }
    if (!complete) continue;
    if (f.op == kMma) mma_m16n8k16(base, f.param);  // their mask is the whole warp (mma_sync, ldmatrix_sync)
    if (f.op == kLdmatrix) ldmatrix_x4(base, f.param != 0);
    unsigned ballot = 0;
    for (int k = 0; k < lanes; ++k)
      if ((mask & (1u << k)) && *reinterpret_cast<const unsigned*>(rt.fibers[base + k].in)) ballot |= 1u << k;
    for (int k = 0; k < lanes; ++k) {
      if (!(mask & (1u << k))) continue;
      Fiber& g = rt.fibers[base + k];
      if (g.op == kBallot || g.op == kAny || g.op == kAll) {
        const unsigned r = g.op == kBallot ? ballot : g.op == kAny ? ballot != 0 : ballot == (mask & existing);
        memcpy(g.out, &r, sizeof r);
      } else if (g.op != kSyncWarp && g.op != kMma && g.op != kLdmatrix) {
        const int w = g.width, seg = k / w, idx = k % w;
        int src = k;
        if (g.op == kShflIdx) src = seg * w + (g.param & (w - 1));
        else if (g.op == kShflUp) src = idx - g.param >= 0 ? k - g.param : k;
        else if (g.op == kShflDown) src = idx + g.param < w ? k + g.param : k;
        else if (g.op == kShflXor) src = ((k ^ g.param) < 32 && (k ^ g.param) / w <= seg) ? (k ^ g.param) : k;
        if (!(mask & (1u << src))) {
          fail(cudaErrorLaunchFailure, where(base + k) + format(": %s (%s) reads lane %d, which is not in the mask 0x%08x "
                                                                "(its value is undefined)", op_name(g.op), site(g).c_str(), src, mask));
          return false;
        }
        memcpy(g.out, rt.fibers[base + src].in, g.size);
      }
      g.state = State::Ready;
    }
    ++rt.warp_epoch[warp];
    any = true;
  }
  return any;
}

// ---- one block ------------------------------------------------------------------------------------
void run_block(uint3 block_idx) {
  const int threads = static_cast<int>(rt.block.x * rt.block.y * rt.block.z);
  g_index.block = block_idx;
  if (rt.static_bytes) memset(rt.static_smem, 0xff, rt.static_bytes);  // fresh shared memory is garbage: NaN
  if (rt.dyn_bytes) memset(rt.dyn_smem, 0xff, rt.dyn_bytes);
  const size_t shared_bytes = rt.static_bytes + rt.dyn_bytes;
  rt.writer.assign(shared_bytes, 0);  // nothing written yet in this block
  rt.barrier_at.assign(shared_bytes, 0);
  rt.warp_at.assign(shared_bytes, 0);
  rt.warp_epoch.assign((threads + 31) / 32, 0);
  rt.barrier_epoch = 0;
  rt.fibers.assign(threads, Fiber{});
  for (int i = 0; i < threads; ++i) {
    Fiber& f = rt.fibers[i];
    f.tid = {i % rt.block.x, (i / rt.block.x) % rt.block.y, i / (rt.block.x * rt.block.y)};
    f.state = State::Ready;
    start_fiber(f, i);
  }
  const int warps = (threads + 31) / 32;
  for (;;) {
    bool progress = false;
    for (int w = 0; w < warps && rt.error == cudaSuccess; ++w) {  // each warp runs until all its lanes wait
      for (bool ran = true; ran && rt.error == cudaSuccess;) {
        ran = false;
        for (int l = 0; l < lanes_in(w, threads); ++l)
          if (rt.fibers[w * 32 + l].state == State::Ready) {
            run(w * 32 + l);
            ran = true;
          }
        ran = resolve_warp(w, threads) || ran;
        progress = progress || ran;
      }
    }
    if (rt.error != cudaSuccess) return;
    int done = 0, barrier = -1, other = -1;
    for (int i = 0; i < threads; ++i) {
      const Fiber& f = rt.fibers[i];
      if (f.state == State::Done) ++done;
      else if (f.state == State::Barrier) barrier = barrier < 0 ? i : barrier;
      else other = i;
    }
    if (done == threads) return;
    if (other < 0) {  // everyone still running waits at a __syncthreads
      const Fiber& b = rt.fibers[barrier];
      for (int i = 0; i < threads; ++i) {
        const Fiber& f = rt.fibers[i];
        if (f.state == State::Done || f.line != b.line || f.file != b.file)
          return fail(cudaErrorLaunchFailure, where(i) + " " + waiting(f) + format(" while thread (%u,%u,%u) ",
                      b.tid.x, b.tid.y, b.tid.z) + waiting(b) + ": __syncthreads must be reached by every thread "
                      "of the block (a barrier in divergent code is undefined behaviour)");
      }
      for (Fiber& f : rt.fibers) f.state = State::Ready;
      ++rt.barrier_epoch;
      continue;
    }
    if (!progress) {  // a warp collective that cannot complete
      const Fiber& f = rt.fibers[other];
      std::string why = where(other) + " " + waiting(f) + ", which can never complete: ";
      const int warp = other / 32;
      for (int k = 0; k < lanes_in(warp, threads); ++k)
        if ((f.mask & (1u << k)) && rt.fibers[warp * 32 + k].state != State::Warp) {
          const Fiber& g = rt.fibers[warp * 32 + k];
          why += format("lane %d (thread (%u,%u,%u)) ", k, g.tid.x, g.tid.y, g.tid.z) + waiting(g);
          break;
        } else if ((f.mask & (1u << k)) && (rt.fibers[warp * 32 + k].op != f.op ||
                                              rt.fibers[warp * 32 + k].mask != f.mask)) {
          const Fiber& g = rt.fibers[warp * 32 + k];
          why += format("lane %d (thread (%u,%u,%u)) ", k, g.tid.x, g.tid.y, g.tid.z) + waiting(g);
          break;
        }
      return fail(cudaErrorLaunchFailure, why);
    }
  }
}

// ---- faults and the time limit -----------------------------------------------------------------
const int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
struct sigaction g_old[4], g_old_timer;
stack_t g_old_altstack;
char g_altstack[1 << 16];
timer_t g_timer;
bool g_timer_ok = false;
const int kTimerSignal = SIGRTMIN + 4;

void on_fault(int sig, siginfo_t* info, void* context) {
  if (!rt.in_launch) {  // not ours: let the previous handler see it
    for (int i = 0; i < 4; ++i)
      if (kSignals[i] == sig) sigaction(sig, &g_old[i], nullptr);
    return;
  }
  rt.fault.sig = sig;
  rt.fault.addr = static_cast<char*>(info->si_addr);
  rt.fault.known_write = false;
#if defined(__x86_64__)
  const ucontext_t* uc = static_cast<const ucontext_t*>(context);
  rt.fault.write = (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;
  rt.fault.known_write = sig == SIGSEGV;
#else
  (void)context;
#endif
  siglongjmp(rt.escape, 1);
}

void on_timer(int, siginfo_t*, void*) {
  if (!rt.in_launch) return;
  rt.fault.sig = kTimerSignal;
  siglongjmp(rt.escape, 1);
}

std::string describe_fault(int fiber) {
  const Fault& f = rt.fault;
  const std::string who = where(fiber);
  if (f.sig == kTimerSignal)
    return who + format(": the launch ran longer than %g s (an infinite loop, or a wait that never ends)",
                        rt.time_limit_s);
  if (f.sig == SIGILL)
    return who + ": an index out of the bounds of a fixed-size array (a __shared__ or a local array)";
  if (f.sig == SIGFPE) return who + ": integer division by zero";
  const char* access = !f.known_write ? "accessed" : f.write ? "wrote" : "read";
  std::vector<Region> all = rt.regions;
  if (rt.dyn_bytes) all.push_back(rt.dyn_region);
  for (const Region& r : all) {
    if (f.addr < r.map || f.addr >= r.map + r.map_len) continue;
    if (f.addr >= r.p + r.n)
      return who + format(": %s byte %zu past the end of %s (%zu bytes)", access,
                               static_cast<size_t>(f.addr - (r.p + r.n)), r.name.c_str(), r.n);
    if (f.addr < r.p)
      return who + format(": %s %zu bytes before the start of %s", access, static_cast<size_t>(r.p - f.addr),
                               r.name.c_str());
    return who + format(": %s the read-only input %s at byte %zu", access, r.name.c_str(),
                             static_cast<size_t>(f.addr - r.p));
  }
  for (char* s : rt.stacks)
    if (f.addr >= s - sysconf(_SC_PAGESIZE) && f.addr < s)
      return who + format(": stack overflow (more than %zu KiB of local variables)", kStackBytes >> 10);
  return who + format(": %s address %p, outside every buffer of the launch", access, static_cast<void*>(f.addr));
}

void install_handlers() {
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 4; ++i) sigaction(kSignals[i], &sa, &g_old[i]);
  stack_t ss{};
  ss.ss_sp = g_altstack;
  ss.ss_size = sizeof g_altstack;
  sigaltstack(&ss, &g_old_altstack);
  struct sigaction st {};
  st.sa_sigaction = on_timer;
  st.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&st.sa_mask);
  sigaction(kTimerSignal, &st, &g_old_timer);
  sigevent ev{};
  ev.sigev_notify = SIGEV_THREAD_ID;
  ev.sigev_signo = kTimerSignal;
  ev._sigev_un._tid = gettid();
  g_timer_ok = timer_create(CLOCK_MONOTONIC, &ev, &g_timer) == 0;
  if (g_timer_ok) {
    itimerspec when{};
    when.it_value.tv_sec = static_cast<time_t>(rt.time_limit_s);
    when.it_value.tv_nsec = static_cast<long>((rt.time_limit_s - static_cast<double>(when.it_value.tv_sec)) * 1e9);
    timer_settime(g_timer, 0, &when, nullptr);
  }
}

void restore_handlers() {
  if (g_timer_ok) timer_delete(g_timer);
  sigaction(kTimerSignal, &g_old_timer, nullptr);
  for (int i = 0; i < 4; ++i) sigaction(kSignals[i], &g_old[i], nullptr);
  sigaltstack(&g_old_altstack, nullptr);
}

void find_static_shared() {
  *static_cast<volatile char*>(&g_tls_anchor) = 0;
  rt.static_smem = nullptr;
  rt.static_bytes = 0;
  dl_iterate_phdr([](dl_phdr_info* info, size_t, void*) -> int {
    char* block = static_cast<char*>(info->dlpi_tls_data);
    for (int i = 0; i < info->dlpi_phnum && block != nullptr; ++i)
      if (info->dlpi_phdr[i].p_type == PT_TLS && &g_tls_anchor >= block && &g_tls_anchor < block + info->dlpi_phdr[i].p_memsz) {
        rt.static_smem = block;
        rt.static_bytes = info->dlpi_phdr[i].p_memsz;
        return 1;
      }
    return 0;
  }, nullptr);
}

Region guarded(size_t n, const char* name) {
  const size_t page = sysconf(_SC_PAGESIZE), data = (n + page - 1) / page * page;
  Region r{};
  r.map_len = data + 2 * page;
  r.map = static_cast<char*>(mmap(nullptr, r.map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (r.map == MAP_FAILED) return Region{};
  mprotect(r.map + page, data, PROT_READ | PROT_WRITE);
  r.p = r.map + page + data - n;  // flush against the guard page after it
  r.n = n;
  r.name = name;
  r.writable = true;
  return r;
}
// The shadow index of a shared-memory address (static section, then dynamic), or -1.
long shared_offset(const char* p) {
  const long stat = static_cast<long>(rt.static_bytes);
  if (stat && p >= rt.static_smem && p < rt.static_smem + stat) return p - rt.static_smem;
  if (rt.dyn_bytes && p >= rt.dyn_smem && p < rt.dyn_smem + rt.dyn_bytes) return stat + (p - rt.dyn_smem);
  return -1;
}

// "st::row_reduce<...>(float, MaxOp)::partial + 4": the shared variable holding p, when it has a symbol.
std::string shared_name(const char* p) {
  if (rt.dyn_bytes && p >= rt.dyn_smem && p < rt.dyn_smem + rt.dyn_bytes)
    return format("dynamic shared memory + %ld", static_cast<long>(p - rt.dyn_smem));
  Dl_info info;
  if (dladdr(p, &info) && info.dli_sname != nullptr && info.dli_saddr != nullptr) {
    int status = -1;
    char* name = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    std::string s = status == 0 ? name : info.dli_sname;
    free(name);
    return s + format(" + %ld", static_cast<long>(p - static_cast<const char*>(info.dli_saddr)));
  }
  const long offset = static_cast<long>(p - rt.static_smem);
  for (const SharedName& v : rt.shared_names)  // offsets within the thread-local block (cuda_cpu.py reads them)
    if (offset >= v.offset && offset < v.offset + v.size) return v.name + format(" + %ld", offset - v.offset);
  return format("static shared memory + %ld", offset);
}

[[noreturn]] void stop(const std::string& what) {
  fail(cudaErrorLaunchFailure, what);
  siglongjmp(rt.escape, 2);
}

void shared_write(const char* p, size_t n) {
  const long at = shared_offset(p);
  if (at < 0) return;
  const uint32_t me = static_cast<uint32_t>(rt.current) + 1, warp = static_cast<uint32_t>(rt.current) / 32;
  for (size_t k = 0; k < n && at + static_cast<long>(k) < static_cast<long>(rt.writer.size()); ++k) {
    rt.writer[at + k] = me;
    rt.barrier_at[at + k] = rt.barrier_epoch;
    rt.warp_at[at + k] = rt.warp_epoch[warp];
  }
}

// A read of shared memory must see a write ordered before it: by the same thread, by its warp
// before a collective since, or by the block before a __syncthreads since.
void shared_read(const char* p, size_t n) {
  const long at = shared_offset(p);
  if (at < 0) return;
  const int me = rt.current, warp = me / 32;
  for (size_t k = 0; k < n && at + static_cast<long>(k) < static_cast<long>(rt.writer.size()); ++k) {
    const uint32_t w = rt.writer[at + k];
    if (w == static_cast<uint32_t>(me) + 1) continue;
    if (w == 0)
      stop(where(me) + format(": reads %zu bytes of shared memory (%s) that no thread of this block has written: "
                              "a missing __syncthreads, or an index past what was written", n, shared_name(p).c_str()));
    const int writer = static_cast<int>(w) - 1;
    const bool same_warp = writer / 32 == warp;
    if (rt.barrier_at[at + k] == rt.barrier_epoch && (!same_warp || rt.warp_at[at + k] == rt.warp_epoch[warp])) {
      const uint3 t = rt.fibers[writer].tid;
      stop(where(me) + format(": reads shared memory (%s) that thread (%u,%u,%u) wrote with no %s in between: "
                              "a race", shared_name(p).c_str(), t.x, t.y, t.z,
                              same_warp ? "__syncwarp or warp collective" : "__syncthreads"));
    }
  }
}
}  // namespace

void note_atomic(void* p, size_t n) {
  if (rt.tracking) shared_write(static_cast<const char*>(p), n);
}

// ---- called from the kernels -------------------------------------------------------------------
void syncthreads(const char* file, int line) {
  Fiber& f = rt.fibers[rt.current];
  f.state = State::Barrier;
  f.file = file;
  f.line = line;
  yield_to_scheduler();
}

// What every warp-wide op records before its lanes meet in resolve_warp: which op, where, which
// lanes, its parameter, and the bytes of `in` it carries (0: the op's own layout, as mma's).
static Fiber& enter_warp(Op op, const char* file, int line, unsigned mask, int param, int width, int size) {
  Fiber& f = rt.fibers[rt.current];
  f.state = State::Warp;
  f.op = op;
  f.file = file;
  f.line = line;
  f.mask = mask;
  f.param = param;
  f.width = width;
  f.size = size;
  return f;
}

void warp_op(Op op, const char* file, int line, unsigned mask, const void* in, void* out, int size, int param,
             int width) {
  Fiber& f = rt.fibers[rt.current];
  if (width <= 0 || width > 32 || (width & (width - 1))) {
    fail(cudaErrorInvalidValue, where(rt.current) + format(": %s width %d is not a power of two <= 32", op_name(op), width));
    siglongjmp(rt.escape, 2);
  }
  enter_warp(op, file, line, mask, param, width, size);
  if (size) memcpy(f.in, in, size);
  yield_to_scheduler();
  Fiber& g = rt.fibers[rt.current];  // the same fiber, resumed
  if (out && g.size) memcpy(out, g.out, g.size);
}

// .aligned: all 32 lanes execute the same mma (ldmatrix), so its mask is the whole warp; a lane
// that exited first, or a warp of fewer than 32 threads, is reported by resolve_warp.
void mma_sync(const char* file, int line, int type, float* d, const uint32_t* a, const uint32_t* b, const float* c) {
  Fiber& f = enter_warp(kMma, file, line, 0xffffffffu, type, 32, 0);
  memcpy(f.in, a, 16);
  memcpy(f.in + 16, b, 8);
  memcpy(f.in + 24, c, 16);
  yield_to_scheduler();
  memcpy(d, rt.fibers[rt.current].out, 16);
}

void ldmatrix_sync(const char* file, int line, int trans, uint32_t* d, const uint32_t* row) {
  Fiber& f = enter_warp(kLdmatrix, file, line, 0xffffffffu, trans, 32, 0);
  memcpy(f.in, row, 16);
  yield_to_scheduler();
  memcpy(d, rt.fibers[rt.current].out, 16);
}

// cp.async (PTX ISA, "cp.async", "cp.async.wait_group"): a copy lands only when a wait of its own
// thread releases its group, so a kernel that reads the destination before waiting (or before
// the barrier after the wait, from another thread) reads what was there, NaN in a fresh block, or
// is stopped by the race check: the landing is a write by the waiting thread at that moment.
void cp_async(void* dst, const void* src, size_t n) {
  rt.fibers[rt.current].copies.push_back({static_cast<char*>(dst), static_cast<const char*>(src), n, -1});
}

void cp_async_commit() {
  Fiber& f = rt.fibers[rt.current];
  for (AsyncCopy& c : f.copies)
    if (c.group < 0) c.group = f.groups;
  ++f.groups;
}

void cp_async_wait(int pending) {
  Fiber& f = rt.fibers[rt.current];
  std::vector<AsyncCopy> later;
  for (const AsyncCopy& c : f.copies) {
    if (c.group < 0 || c.group >= f.groups - pending) {
      later.push_back(c);
      continue;
    }
    memcpy(c.dst, c.src, c.n);
    shared_write(c.dst, c.n);
  }
  f.copies.swap(later);
}

void* dynamic_shared() { return rt.dyn_smem; }

unsigned active_mask() {
  const int threads = static_cast<int>(rt.block.x * rt.block.y * rt.block.z), warp = rt.current / 32;
  unsigned m = 0;
  for (int k = 0; k < lanes_in(warp, threads); ++k)
    if (rt.fibers[warp * 32 + k].state != State::Done) m |= 1u << k;
  return m;
}

cudaError_t take_error() {
  const int e = rt.error;
  rt.error = cudaSuccess;
  return static_cast<cudaError_t>(e);
}

const char* error_name(int code) {
  switch (code) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchTimeout: return "the launch timed out and was terminated";
    default: return "unspecified launch failure";
  }
}

const char* kernel_name(void* kernel, const char* text) {
  static std::map<void*, std::string> names;  // one dladdr and demangling per kernel
  auto found = names.find(kernel);
  if (found != names.end()) return found->second.c_str();
  std::string name = text;
  Dl_info info;
  int status = -1;
  char* demangled = nullptr;
  if (dladdr(kernel, &info) && info.dli_sname != nullptr && info.dli_saddr == kernel)
    demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
  if (status == 0) {  // "void st::softmax_fwd_rows<float, 32, 2>(float const*, ...)": the name alone
    name = demangled;
    int depth = 0;
    size_t open = std::string::npos;
    for (size_t i = name.size(); i-- > 0;) {  // the parameter list is the last top-level (...)
      depth += name[i] == ')';
      depth -= name[i] == '(';
      if (depth == 0 && name[i] == '(') { open = i; break; }
    }
    name = name.substr(0, open);
    if (name.compare(0, 5, "void ") == 0) name.erase(0, 5);  // templates carry their return type
    for (size_t p = 0; (p = name.find("st::", p)) != std::string::npos;)  // the course's namespace
      if (p == 0 || !(isalnum(static_cast<unsigned char>(name[p - 1])) || name[p - 1] == '_')) name.erase(p, 4);
      else p += 4;
  }
  free(demangled);
  return names.emplace(kernel, name).first->second.c_str();
}

void run_grid(const char* kernel, dim3 grid, dim3 block, size_t smem, Body body, void* arg) {
  if (rt.error != cudaSuccess) return;  // errors are sticky, as on a device
  rt.kernel = kernel;
  rt.grid = grid;
  rt.block = block;
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  rt.trace.push_back(format("%s <<<(%u,%u,%u), (%u,%u,%u), %zu>>>", kernel, grid.x, grid.y, grid.z, block.x, block.y,
                            block.z, smem));
  if (threads == 0 || threads > kMaxThreads || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535 || smem > (227u << 10))
    return fail(cudaErrorInvalidConfiguration, where(-1) + format(": invalid launch configuration (%llu threads per "
                                                                  "block, at most %d; %zu bytes of dynamic shared memory)",
                                                                  threads, kMaxThreads, smem));
  if (!stack(static_cast<int>(threads) - 1)) return fail(cudaErrorLaunchFailure, "cannot allocate fiber stacks");
  rt.body = body;
  rt.arg = arg;
  find_static_shared();
  g_index.block_dim = block;
  g_index.grid_dim = grid;
  rt.dyn_bytes = smem;
  if (smem) {
    rt.dyn_region = guarded(smem, "dynamic shared memory");
    rt.dyn_smem = rt.dyn_region.p;
  }
  install_handlers();
  rt.in_launch = 1;
  const int jumped = sigsetjmp(rt.escape, 1);
  if (jumped == 0) {
    for (unsigned z = 0; z < grid.z && rt.error == cudaSuccess; ++z)
      for (unsigned y = 0; y < grid.y && rt.error == cudaSuccess; ++y)
        for (unsigned x = 0; x < grid.x && rt.error == cudaSuccess; ++x) run_block({x, y, z});
  } else if (jumped == 1) {
    fail(rt.fault.sig == kTimerSignal ? cudaErrorLaunchTimeout : cudaErrorIllegalAddress, describe_fault(rt.current));
  }
  rt.in_launch = 0;
  rt.current = -1;
  restore_handlers();
  if (smem) munmap(rt.dyn_region.map, rt.dyn_region.map_len);
  rt.dyn_bytes = 0;
  rt.dyn_smem = nullptr;
}
}  // namespace cuda_emu

// ---- the C API for scaletrain/ops/toolchain/cuda_cpu.py ------------------------------------------------------
using cuda_emu::rt;

extern "C" {
// A buffer of n bytes ending flush against an inaccessible page; `name` appears in fault reports.
void* cuda_emu_alloc(size_t n, const char* name) {
  cuda_emu::Region r = cuda_emu::guarded(n, name);
  if (r.map == nullptr) return nullptr;
  rt.regions.push_back(r);
  return r.p;
}

// Inputs are made read-only for the launch: a kernel that writes to one faults.
int cuda_emu_set_writable(void* p, int writable) {
  for (cuda_emu::Region& r : rt.regions)
    if (r.p == p) {
      const size_t page = sysconf(_SC_PAGESIZE);
      r.writable = writable != 0;
      return mprotect(r.map + page, r.map_len - 2 * page, writable ? PROT_READ | PROT_WRITE : PROT_READ);
    }
  return -1;
}

void cuda_emu_free(void* p) {
  for (size_t i = 0; i < rt.regions.size(); ++i)
    if (rt.regions[i].p == p) {
      munmap(rt.regions[i].map, rt.regions[i].map_len);
      rt.regions.erase(rt.regions.begin() + static_cast<long>(i));
      return;
    }
}

// Serializes the launches of one library (ctypes releases the GIL).
void cuda_emu_lock() { rt.mutex.lock(); }
void cuda_emu_unlock() { rt.mutex.unlock(); }

void cuda_emu_set_time_limit(double seconds) { rt.time_limit_s = seconds; }

// The static __shared__ variables' names, by offset in the thread-local block (for race reports).
void cuda_emu_name_shared(long offset, long size, const char* name) { rt.shared_names.push_back({offset, size, name}); }

// The kernels launched since the last call, one per line, and the message of the last error.
const char* cuda_emu_take_trace() {
  static std::string out;
  out.clear();
  for (const std::string& t : rt.trace) out += t + "\n";
  rt.trace.clear();
  return out.c_str();
}
const char* cuda_emu_error_message() { return rt.message.c_str(); }

// For the tests: the header's conversions, element by element. kind 0: f32 -> f16 bits,
// 1: f16 bits -> f32, 2: f32 -> bf16 bits, 3: bf16 bits -> f32.
void cuda_emu_convert(int kind, const void* in, void* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (kind == 0) static_cast<uint16_t*>(out)[i] = cuda_emu::float_to_half(static_cast<const float*>(in)[i]);
    if (kind == 1) static_cast<float*>(out)[i] = cuda_emu::half_to_float(static_cast<const uint16_t*>(in)[i]);
    if (kind == 2) static_cast<uint16_t*>(out)[i] = cuda_emu::float_to_bf16(static_cast<const float*>(in)[i]);
    if (kind == 3) static_cast<float*>(out)[i] = cuda_emu::bf16_to_float(static_cast<const uint16_t*>(in)[i]);
  }
}
}

// ---- the memory-access hooks of g++ -fsanitize=thread (the kernels are compiled with it, this
// file is not): shared-memory accesses feed the race check above, everything else passes ----------
extern "C" {
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
#define CUDA_EMU_HOOKS(N)                                                                                  \
  void __tsan_read##N(void* p) { if (cuda_emu::rt.tracking) cuda_emu::shared_read(static_cast<char*>(p), N); }  \
  void __tsan_write##N(void* p) { if (cuda_emu::rt.tracking) cuda_emu::shared_write(static_cast<char*>(p), N); } \
  void __tsan_unaligned_read##N(void* p) { __tsan_read##N(p); }                                           \
  void __tsan_unaligned_write##N(void* p) { __tsan_write##N(p); }
CUDA_EMU_HOOKS(1)
CUDA_EMU_HOOKS(2)
CUDA_EMU_HOOKS(4)
CUDA_EMU_HOOKS(8)
CUDA_EMU_HOOKS(16)
void __tsan_read_range(void* p, unsigned long n) { if (cuda_emu::rt.tracking) cuda_emu::shared_read(static_cast<char*>(p), n); }
void __tsan_write_range(void* p, unsigned long n) { if (cuda_emu::rt.tracking) cuda_emu::shared_write(static_cast<char*>(p), n); }
}
