// Host emulation of the CUDA runtime surface that ktune's kernels use, so that the real .cu source
// (after rewrite.py) compiles as host C++ and runs on the CPU: no GPU and no CUDA toolkit needed.
//
// Threads. Each CUDA thread of a block is a ucontext fiber; one runs at a time. The switch points are
// __syncthreads, __syncwarp, the shuffles, wmma::mma_sync (fake/mma.h), ldmatrix and mma.sync
// (fake/mma_m16n8k16_emulated.h) — a thread runs from one to
// the next without interruption, so code that relies on an ordering no barrier enforces gets a
// different ordering under another schedule. The scheduler runs the runnable fibers of a block in
// order, in reverse or shuffled (seeded) — each runnable fiber one stretch a round, so the warps stay
// within a switch point of each other — or warp by warp (the first warp with a runnable fiber runs
// alone until a block barrier or its end stops it, so a warp reading another warp's writes with only
// warp-level switch points between them reads them early); by default block i of the n-th launch uses
// schedule (i + n) % 4, so every launch sees all four and a block index sees each over successive
// launches of a test; KTUNE_EMU_SCHEDULE=order|reverse|shuffle|warps fixes one. A missing barrier shows
// as wrong results under some schedule; a barrier not reached by every thread is a deadlock, which
// aborts. Blocks run one after another (a kernel that waits for another block would deadlock here),
// in grid order, reversed or shuffled (launch n uses n % 3), so a block that reads what another block
// of the same launch writes gets a different answer under some launch.
//
// Checks, each an abort with a message: block size a multiple of 32 and <= 1024, 1-D blocks, 2-D
// grids within the device's limits, dynamic shared memory <= 48 KiB unless cudaFuncSetAttribute
// raised that kernel's limit (to <= 227 KiB, sm_90), blocks within the kernel's __launch_bounds__,
// float2 atomics 8-byte aligned and on global memory, cudaMemcpy's ranges apart, a launch's pointer
// arguments, and the pointer fields of its struct arguments, into device or pinned memory
// (check_kernel_pointers).
// fake/mma.h adds wmma's alignment, ldm and bound checks; fake/mma_m16n8k16_emulated.h those of
// ldmatrix and cp.async (shared-memory rows and targets, 16-byte alignment); cp.async's copies land
// at the earliest (when issued: schedules reverse and warps) or the latest a GPU may land them (at the
// wait that covers them: order and shuffle), so that both a read before the wait and a refill of a
// buffer other warps still read show.
//
// Memory. "Device" memory is host memory (cudaMalloc: 256-byte aligned, at most 141 GiB, an H200's;
// cudaMallocHost: plain host memory); outside device operations it is inaccessible (PROT_NONE, see
// DeviceAccess), so a host read or write of device memory crashes here as it would on a GPU.
// Streams. Kernels, and every copy or memset on the default stream, run when called. A stream created
// with cudaStreamNonBlocking holds its copies and memsets back under the late schedule
// (KTUNE_EMU_STREAMS=late when the stream is created; eager, the default, runs them when called):
// they run, in order, only when something waits for them — cudaStreamWaitEvent on an event recorded
// after them (the wait itself is where they run), cudaEventSynchronize, cudaStreamSynchronize,
// cudaDeviceSynchronize or the stream's destruction. That is the latest a GPU may run them, so a
// missing wait shows: a copy read before anyone waited for it has not landed, and a buffer
// overwritten before its outgoing copy was waited for is copied late, with the new contents. Kernels
// launched on such a stream still run when called (ktune launches none there); a host function
// (cudaLaunchHostFunc) is held like a copy. Event times are host
// clocks. An operation that waits for other processes (fake/nccl.h's collectives) is held on any
// stream until it completes: it makes progress only when the stream is queried (cudaStreamQuery:
// cudaErrorNotReady while it waits) or waited for (which blocks until it completes, as on a GPU),
// and what is enqueued behind it waits too, even on an eager stream.
// cudaMalloc'd buffers and each launch's dynamic shared memory end where an inaccessible page begins
// (past the 256- / 128-byte alignment slack), so reading or writing beyond them crashes the test, and
// cudaFree checks that the slack was not written. Fresh device and shared memory hold all-ones bytes
// (NaN as f32 and as bf16), so a result computed from memory nobody wrote shows as NaN.
// Fiber stacks are separated by inaccessible pages too (an overflow crashes, never corrupts).
//
// It deliberately does not emulate: timing, occupancy, register pressure or spills, warp divergence,
// memory coalescing, asynchronous execution, __expf's and __logf's approximations (exact here),
// tensor-core rounding (mma_sync sums in f32, in order), or any CUDA call ktune does not make. Nor
// can it see a race inside a statement: threads switch only at the switch points, so two threads'
// unsynchronised `x += v` never loses an update here, and blocks never overlap.
#pragma once
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#define KTUNE_CUDA_EMULATOR 1  // this fake, not a CUDA toolkit's runtime: its emu:: hooks exist
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n)

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorNotReady = 600,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost,
  cudaMemcpyHostToDevice,
  cudaMemcpyDeviceToHost,
  cudaMemcpyDeviceToDevice,
  cudaMemcpyDefault
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
constexpr unsigned cudaStreamDefault = 0x0, cudaStreamNonBlocking = 0x1;
constexpr unsigned cudaEventDefault = 0x0, cudaEventDisableTiming = 0x2;
struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major, minor, multiProcessorCount;
};

namespace emu {

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "emu: %s\n", what);
  std::fflush(stdout);
  std::abort();
}

constexpr size_t kDefaultSharedBytes = 48 * 1024;   // dynamic shared memory without the attribute
constexpr size_t kMaxSharedBytes = 227 * 1024;      // sm_90's opt-in maximum per block
constexpr size_t kDeviceBytes = size_t(141) << 30;  // an H200
constexpr size_t kStackBytes = 128 * 1024;          // per thread; kernels keep fragments on it

struct Fiber {
  jmp_buf jb;
  bool started = false;
  bool done = false;
  int wait = 0;  // 0 none, 1 block barrier, 2 warp barrier
  uint64_t gen = 0;
  uint3 tid;
  // cp.async (fake/mma_m16n8k16_emulated.h): 16-byte copies issued and not yet waited for, which
  // land only at the cp.async.wait_group that covers them (the latest a GPU may complete them)
  struct AsyncCopy {
    unsigned char* dst;
    const unsigned char* src;
  };
  std::vector<std::vector<AsyncCopy>> async_groups;  // committed groups, oldest first
  std::vector<AsyncCopy> async_open;                 // issued since the last commit
};

// One block being run: its fibers, barrier generations, shared memory and the exchange slots that
// shuffles and mma_sync use to pass values between the lanes of a warp.
struct Block {
  std::vector<Fiber> fibers;
  int current = -1;
  int nthreads = 0;
  uint64_t block_gen = 0;
  int block_arrived = 0;
  std::vector<uint64_t> warp_gen;
  std::vector<int> warp_arrived;
  std::vector<float> slots;         // (warps, 32) shuffle slots
  std::vector<float> mma;           // (warps, 3, 256) mma operand exchange
  std::vector<const unsigned char*> rows;  // (warps, 32) ldmatrix row addresses
  bool eager_copies = false;  // cp.async lands when issued (schedules reverse, warps), else at its wait
  unsigned char* shared = nullptr;  // the launch's guarded dynamic shared memory, refilled per block
  size_t shared_bytes = 0;
  std::map<int, std::unique_ptr<unsigned char[]>> static_shared;  // `__shared__ T x[n]` by declaration id
};

inline Block* g_block = nullptr;
inline ucontext_t g_sched;
inline jmp_buf g_sched_jb;
inline uint3 g_tid, g_bid;
inline dim3 g_bdim, g_gdim;
inline std::function<void()> g_body;
inline std::mt19937 g_rng(7);
inline cudaError_t g_last_error = cudaSuccess;
inline uint64_t g_launches = 0;
// Host waits: for each cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize and
// synchronous cudaMemcpy / cudaMemset (each makes a GPU's host wait), how many kernels had been
// launched before it; tests read it to see where a step waits (KTUNE_CUDA_EMULATOR marks this fake).
// g_on_host_wait, when set, is called at each such wait with the stream waited for (nullptr: the
// default stream, the whole device or a synchronous copy).
inline std::vector<uint64_t> g_host_waits;
inline std::function<void(CUstream_st*)> g_on_host_wait;
inline void note_host_wait(CUstream_st* stream = nullptr) {
  g_host_waits.push_back(g_launches);
  if (g_on_host_wait) g_on_host_wait(stream);
}

constexpr unsigned char kGarbage = 0xff;  // fresh device / shared memory: NaN in f32 and bf16

inline size_t page_bytes() {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return page;
}
inline size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// `bytes` (rounded up to `align`) that end where an inaccessible page begins, filled with kGarbage.
struct GuardedBytes {
  unsigned char* data = nullptr;
  size_t bytes = 0, body = 0;
  void* map = nullptr;
  size_t map_bytes = 0;
};
inline bool allocate_guarded(GuardedBytes& g, size_t bytes, size_t align) {
  const size_t page = page_bytes();
  g.bytes = bytes;
  g.body = round_up(std::max<size_t>(bytes, 1), align);
  g.map_bytes = round_up(g.body, page) + page;
  g.map = mmap(nullptr, g.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (g.map == MAP_FAILED) return false;
  unsigned char* guard = static_cast<unsigned char*>(g.map) + g.map_bytes - page;
  mprotect(guard, page, PROT_NONE);
  g.data = guard - g.body;
  std::memset(g.data, kGarbage, g.body);
  return true;
}
// Whether the alignment slack past `bytes` still holds kGarbage (nothing wrote past the end).
inline bool slack_untouched(const GuardedBytes& g) {
  for (size_t i = g.bytes; i < g.body; ++i)
    if (g.data[i] != kGarbage) return false;
  return true;
}
inline void release_guarded(GuardedBytes& g) {
  if (g.map) munmap(g.map, g.map_bytes);
  g = GuardedBytes{};
}

// One stack a thread, reused by every block, each with an inaccessible page below it (stacks grow
// down: an overflow faults instead of running into the next thread's stack).
inline char* stack_pool(size_t threads) {
  static char* pool = nullptr;
  static size_t capacity = 0;
  if (capacity < threads) {
    const size_t stride = kStackBytes + page_bytes();
    void* m = mmap(nullptr, threads * stride, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fail("cannot map the fiber stacks");
    for (size_t t = 0; t < threads; ++t) mprotect(static_cast<char*>(m) + t * stride, page_bytes(), PROT_NONE);
    if (pool) munmap(pool, capacity * stride);
    pool = static_cast<char*>(m);
    capacity = threads;
  }
  return pool;
}
inline char* stack_of(char* pool, unsigned thread) {
  return pool + thread * (kStackBytes + page_bytes()) + page_bytes();
}

// -1: rotate (block i of launch n runs schedule (i + n) % 4); else 0 in order, 1 reverse, 2 shuffled,
// 3 warps (one warp at a time, as far as it gets).
inline int fixed_schedule() {
  static const int s = [] {
    const char* e = std::getenv("KTUNE_EMU_SCHEDULE");
    if (!e || !*e) return -1;
    if (!std::strcmp(e, "order")) return 0;
    if (!std::strcmp(e, "reverse")) return 1;
    if (!std::strcmp(e, "shuffle")) return 2;
    if (!std::strcmp(e, "warps")) return 3;
    fail("KTUNE_EMU_SCHEDULE must be order, reverse, shuffle or warps");
  }();
  return s;
}

// Switches without a signal-mask syscall: a fiber is resumed and left with _setjmp/_longjmp
// (swapcontext's sigprocmask made the emulation syscall-bound); only making one (below) swaps contexts.
inline void yield() {
  if (!_setjmp(g_block->fibers[g_block->current].jb)) _longjmp(g_sched_jb, 1);
}

inline void block_barrier() {
  Block& b = *g_block;
  Fiber& f = b.fibers[b.current];
  if (++b.block_arrived == b.nthreads) {
    b.block_arrived = 0;
    ++b.block_gen;
    return;
  }
  f.wait = 1;
  f.gen = b.block_gen;
  yield();
}

inline void warp_barrier() {
  Block& b = *g_block;
  Fiber& f = b.fibers[b.current];
  const int w = b.current / 32;
  if (++b.warp_arrived[w] == 32) {
    b.warp_arrived[w] = 0;
    ++b.warp_gen[w];
    return;
  }
  f.wait = 2;
  f.gen = b.warp_gen[w];
  yield();
}

// The parked fibers: one a stack of stack_pool, each in trampoline's loop, waiting at its park point
// for the block that next gives it a thread. Made once a stack (getcontext, makecontext and
// swapcontext cost system calls) and reused by every block after, as long as the pool keeps its stacks.
struct ParkedFiber {
  jmp_buf park;
};
inline std::unique_ptr<ParkedFiber[]> g_parked;
inline char* g_parked_pool = nullptr;  // the stack pool they run on
inline unsigned g_parked_count = 0, g_starting = 0;

inline void trampoline() {
  const unsigned stack = g_starting;
  for (;;) {
    if (!_setjmp(g_parked[stack].park)) _longjmp(g_sched_jb, 1);  // parked until a block starts it
    g_body();
    g_block->fibers[g_block->current].done = true;
  }
}

// Parked fibers on stacks 0 .. threads-1 of `pool` (all made anew when the pool was remapped).
inline void park_fibers(char* pool, unsigned threads) {
  if (pool != g_parked_pool) {
    g_parked.reset(new ParkedFiber[threads]);
    g_parked_pool = pool, g_parked_count = 0;
  }
  for (; g_parked_count < threads; ++g_parked_count) {
    ucontext_t ctx;
    getcontext(&ctx);
    ctx.uc_stack.ss_sp = stack_of(pool, g_parked_count);
    ctx.uc_stack.ss_size = kStackBytes;
    ctx.uc_link = nullptr;
    makecontext(&ctx, trampoline, 0);
    g_starting = g_parked_count;
    if (!_setjmp(g_sched_jb)) swapcontext(&g_sched, &ctx);  // runs to its park point and comes back
  }
}

inline void run_block(unsigned bx, unsigned by, unsigned nthreads, GuardedBytes& shared, int schedule) {
  Block b;
  b.nthreads = int(nthreads);
  b.fibers.resize(nthreads);
  b.warp_gen.assign(nthreads / 32, 0);
  b.warp_arrived.assign(nthreads / 32, 0);
  b.slots.assign(nthreads, 0.0f);
  b.mma.assign(size_t(nthreads / 32) * 3 * 256, 0.0f);
  b.rows.assign(nthreads, nullptr);
  b.eager_copies = schedule == 1 || schedule == 3;
  b.shared_bytes = shared.bytes;
  b.shared = shared.data;
  std::memset(b.shared, kGarbage, shared.body);  // what the previous block left is not this one's
  g_block = &b;
  g_bid.x = bx, g_bid.y = by;
  park_fibers(stack_pool(nthreads), nthreads);
  for (unsigned t = 0; t < nthreads; ++t) b.fibers[t].tid.x = t;
  std::vector<int> order(nthreads);
  for (unsigned t = 0; t < nthreads; ++t) order[t] = int(t);
  if (schedule == 1) std::reverse(order.begin(), order.end());
  auto runnable = [&b](int t) {
    const Fiber& f = b.fibers[t];
    return !f.done && !(f.wait == 1 && f.gen == b.block_gen) && !(f.wait == 2 && f.gen == b.warp_gen[t / 32]);
  };
  for (;;) {
    if (schedule == 2) std::shuffle(order.begin(), order.end(), g_rng);
    // warps: only the first warp with a runnable fiber runs this round, so it runs ahead of the others
    // until a block barrier (or its end) stops it; its lanes only are visited
    int first = 0, last = int(nthreads);
    if (schedule == 3) {
      int lead = 0;
      while (lead < int(nthreads) && !runnable(lead)) ++lead;
      if (lead < int(nthreads)) first = lead / 32 * 32, last = first + 32;
    }
    bool any = false, all_done = true;
    for (int i = first; i < last; ++i) {
      const int t = order[i];
      Fiber& f = b.fibers[t];
      if (f.done) continue;
      all_done = false;
      if (!runnable(t)) continue;
      f.wait = 0;
      b.current = t;
      g_tid = f.tid;
      if (!_setjmp(g_sched_jb)) {
        if (!f.started) {
          f.started = true;
          _longjmp(g_parked[t].park, 1);  // thread t runs on stack t
        } else {
          _longjmp(f.jb, 1);
        }
      }
      any = true;
    }
    if (all_done) break;
    if (!any) {
      std::fprintf(stderr, "emu: deadlock in block (%u, %u): a barrier not reached by every thread\n", bx, by);
      std::abort();
    }
  }
  if (!slack_untouched(shared)) {
    std::fprintf(stderr, "emu: block (%u, %u) wrote past its %zu bytes of dynamic shared memory\n", bx, by,
                 shared.bytes);
    std::abort();
  }
  g_block = nullptr;
}

inline unsigned char* shared_memory() { return g_block->shared; }
// A kernel's __launch_bounds__(threads) (rewrite.py calls this first thing in its body).
inline void check_launch_bounds(int threads) {
  if (int(g_bdim.x) > threads) {
    std::fprintf(stderr, "emu: launch with %u threads a block > the kernel's __launch_bounds__(%d)\n", g_bdim.x,
                 threads);
    std::abort();
  }
}
inline int lane() { return g_block->current % 32; }
inline int warp() { return g_block->current / 32; }

// A statically sized `__shared__ T name[..];` (rewrite.py turns it into a reference to this): one
// object per block and declaration, shared by the block's threads, starting as kGarbage.
template <typename T>
T& static_shared(int id) {
  auto& slot = g_block->static_shared[id];
  if (!slot) {
    slot.reset(new unsigned char[sizeof(T) + alignof(T)]);
    std::memset(slot.get(), kGarbage, sizeof(T) + alignof(T));
  }
  void* p = slot.get();
  size_t space = sizeof(T) + alignof(T);
  return *reinterpret_cast<T*>(std::align(alignof(T), sizeof(T), p, space));
}

// Dynamic shared memory limits per kernel, raised by cudaFuncSetAttribute.
inline std::map<const void*, size_t>& shared_limits() {
  static std::map<const void*, size_t> limits;
  return limits;
}
template <typename K>
const void* kernel_key(K kernel) {
  return reinterpret_cast<const void*>(kernel);
}
inline const void* kernel_key(std::nullptr_t) { return nullptr; }  // a deduced template kernel (rewrite.py)

// Host allocations made by cudaMalloc (so cudaFree can refuse what it did not hand out).
inline std::map<void*, GuardedBytes>& allocations() {
  static std::map<void*, GuardedBytes> a;
  return a;
}

// Pinned host allocations made by cudaMallocHost (mapped into the device's address space, as under
// UVA on a GPU: a kernel may read them), by address, with their sizes.
inline std::map<void*, size_t>& pinned_allocations() {
  static std::map<void*, size_t> a;
  return a;
}

// The record of the buffer in `all` (first byte -> record) that holds address a, or nullptr: a buffer
// holds [first, first + bytes_of(record)), and, when one_past, its one-past-the-end address too.
template <typename Map, typename BytesOf>
auto buffer_holding(Map& all, const void* a, BytesOf bytes_of, bool one_past) -> decltype(&all.begin()->second) {
  auto it = all.upper_bound(const_cast<void*>(a));
  if (it == all.begin()) return nullptr;
  --it;
  const auto* first = static_cast<const unsigned char*>(it->first);
  const auto* p = static_cast<const unsigned char*>(a);
  const auto* end = first + bytes_of(it->second);
  return p < end || (one_past && p == end) ? &it->second : nullptr;
}

// The number of fields of an aggregate T: the most initialisers T{...} takes (C++20 aggregates; a
// field that is itself an array would be miscounted, and no kernel argument has one).
struct AnyField {
  template <typename U>
  operator U() const;  // unevaluated only
};
template <typename T, typename... F>
constexpr size_t field_count() {
  if constexpr (requires { T{F{}..., AnyField{}}; })
    return field_count<T, F..., AnyField>();
  else
    return sizeof...(F);
}
// f(field) for every field of the aggregate t, through a structured binding.
#define KTUNE_EMU_FIELDS_CASE(n, ...)      \
  else if constexpr (count == n) {         \
    const auto& [__VA_ARGS__] = t;         \
    for_each_of(f, __VA_ARGS__);           \
  }
template <typename F, typename... A>
void for_each_of(F& f, const A&... a) {
  (f(a), ...);
}
template <typename T, typename F>
void for_each_field(const T& t, F f) {
  constexpr size_t count = field_count<T>();
  if constexpr (count == 0) {
  }
  KTUNE_EMU_FIELDS_CASE(1, a)
  KTUNE_EMU_FIELDS_CASE(2, a, b)
  KTUNE_EMU_FIELDS_CASE(3, a, b, c)
  KTUNE_EMU_FIELDS_CASE(4, a, b, c, d)
  KTUNE_EMU_FIELDS_CASE(5, a, b, c, d, e)
  KTUNE_EMU_FIELDS_CASE(6, a, b, c, d, e, g)
  KTUNE_EMU_FIELDS_CASE(7, a, b, c, d, e, g, h)
  KTUNE_EMU_FIELDS_CASE(8, a, b, c, d, e, g, h, i)
  KTUNE_EMU_FIELDS_CASE(9, a, b, c, d, e, g, h, i, j)
  KTUNE_EMU_FIELDS_CASE(10, a, b, c, d, e, g, h, i, j, k)
  KTUNE_EMU_FIELDS_CASE(11, a, b, c, d, e, g, h, i, j, k, l)
  KTUNE_EMU_FIELDS_CASE(12, a, b, c, d, e, g, h, i, j, k, l, m)
  KTUNE_EMU_FIELDS_CASE(13, a, b, c, d, e, g, h, i, j, k, l, m, n_)
  KTUNE_EMU_FIELDS_CASE(14, a, b, c, d, e, g, h, i, j, k, l, m, n_, o)
  KTUNE_EMU_FIELDS_CASE(15, a, b, c, d, e, g, h, i, j, k, l, m, n_, o, q)
  KTUNE_EMU_FIELDS_CASE(16, a, b, c, d, e, g, h, i, j, k, l, m, n_, o, q, r)
  else static_assert(count <= 16, "a kernel's struct argument with more than 16 fields: extend for_each_field");
}
#undef KTUNE_EMU_FIELDS_CASE

// A kernel's pointer argument must be null or point into (or one past) a cudaMalloc'd or a
// cudaMallocHost'd buffer: any other host pointer — a std::vector's data, a stack array, malloc'd
// memory — is an illegal address on a GPU, though here it reads fine. rewrite.py calls this with every
// launch's arguments; a struct argument (an aggregate, as the attention kernels' Params) has each of
// its fields checked the same way, nested structs included. `index` names the argument in the message.
template <typename T>
void check_kernel_pointer(const T& arg, int index) {  // T as a kernel parameter takes it: arrays decayed
  if constexpr (std::is_pointer_v<T>) {
    if (arg == nullptr) return;
    const void* p = static_cast<const void*>(arg);
    if (buffer_holding(allocations(), p, [](const GuardedBytes& g) { return g.bytes; }, true) != nullptr ||
        buffer_holding(pinned_allocations(), p, [](size_t bytes) { return bytes; }, true) != nullptr)
      return;
    std::fprintf(stderr, "emu: kernel argument %d is or holds a host pointer %p (neither cudaMalloc'd nor "
                 "cudaMallocHost'd): an illegal address on a GPU\n", index, p);
    std::abort();
  } else if constexpr (std::is_class_v<T> && std::is_aggregate_v<T>) {
    for_each_field(arg, [index](const auto& field) { check_kernel_pointer(field, index); });
  }
}
template <typename... A>
void check_kernel_pointers(A... args) {  // by value, as a launch passes them
  int index = 0;
  (check_kernel_pointer(args, index++), ...);
}

// Device memory is the host's here, but a GPU's host cannot dereference it: every cudaMalloc'd
// buffer is inaccessible (PROT_NONE) except to device operations, so host code that reads or writes
// one crashes the test at that line, as it would crash on a GPU. A device operation — a launch, a copy
// or memset when it runs, cudaFree's check of its slack, the fake cuBLASLt's matmul, a fake NCCL
// collective's step — holds a DeviceAccess for its duration (nested on its thread). What it touches
// opens on first touch, 64 KiB at a time (the SIGSEGV handler below, which opens a buffer's pages only
// for a thread inside a device operation), and closes again when the thread's outermost DeviceAccess
// ends: the cost follows the memory an operation touches, not all that is allocated. A host function
// (cudaLaunchHostFunc) holds none: it is host code. A fault anywhere else (past a buffer's end, a
// fiber's stack guard, a host access) keeps its default action: the process dies of SIGSEGV.
constexpr size_t kOpenChunkBytes = size_t(64) << 10;
// Read by the SIGSEGV handler: volatile, with signal fences around the operation's accesses, so that
// the compiler neither drops the count nor moves an access across it.
inline thread_local volatile int t_device_access_depth = 0;
inline thread_local std::vector<std::pair<void*, size_t>> t_opened;  // ranges this thread opened
inline std::mutex& device_access_mutex() {  // guards allocations() against concurrent cudaMalloc / cudaFree
  static std::mutex m;
  return m;
}
// The buffer whose bytes [data, data + body) hold address a, or nullptr.
inline const GuardedBytes* device_buffer_at(const void* a) {
  return buffer_holding(allocations(), a, [](const GuardedBytes& g) { return g.body; }, false);
}
inline void close_device_buffer(const GuardedBytes& g) {  // the mapping but its guard page (always closed)
  if (mprotect(g.map, g.map_bytes - page_bytes(), PROT_NONE) != 0) fail("mprotect of a device buffer failed");
}
inline void device_fault(int, siginfo_t* info, void*) {
  const GuardedBytes* g = device_buffer_at(info->si_addr);
  if (g != nullptr && t_device_access_depth > 0) {  // a device operation's first touch: open its chunk
    const auto a = reinterpret_cast<uintptr_t>(info->si_addr), first = reinterpret_cast<uintptr_t>(g->map),
               end = first + g->map_bytes - page_bytes();
    const uintptr_t from = std::max(first, a / kOpenChunkBytes * kOpenChunkBytes);
    const uintptr_t to = std::min(end, from + kOpenChunkBytes);
    if (mprotect(reinterpret_cast<void*>(from), to - from, PROT_READ | PROT_WRITE) == 0) {
      t_opened.emplace_back(reinterpret_cast<void*>(from), to - from);
      return;  // the access runs again, now allowed
    }
  }
  if (g != nullptr) {
    static const char msg[] = "emu: the host read or wrote device memory (a cudaMalloc buffer) outside any device "
                              "operation: on a GPU this faults too\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
  }
  signal(SIGSEGV, SIG_DFL);  // returning re-runs the access, which now ends the process
}
inline void install_device_fault_handler() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = device_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
    return true;
  }();
  (void)installed;
}
class DeviceAccess {
 public:
  DeviceAccess() {
    t_device_access_depth = t_device_access_depth + 1;
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
  ~DeviceAccess() {
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t_device_access_depth = t_device_access_depth - 1;
    if (t_device_access_depth > 0) return;
    // Ranges of buffers freed meanwhile may be unmapped (mprotect fails) or mapped anew (closing
    // them is right: a fresh buffer starts closed).
    for (const auto& [at, bytes] : t_opened) mprotect(at, bytes, PROT_NONE);
    t_opened.clear();
  }
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

}  // namespace emu

#define threadIdx (::emu::g_tid)
#define blockIdx (::emu::g_bid)
#define blockDim (::emu::g_bdim)
#define gridDim (::emu::g_gdim)

inline void __syncthreads() { emu::block_barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_barrier(); }
inline float __shfl_xor_sync(unsigned, float v, int mask) {
  float* s = emu::g_block->slots.data() + emu::warp() * 32;
  s[emu::lane()] = v;
  emu::warp_barrier();
  const float r = s[emu::lane() ^ mask];
  emu::warp_barrier();
  return r;
}
inline float __shfl_sync(unsigned, float v, int src) {
  float* s = emu::g_block->slots.data() + emu::warp() * 32;
  s[emu::lane()] = v;
  emu::warp_barrier();
  const float r = s[src & 31];
  emu::warp_barrier();
  return r;
}
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Atomics: one fiber runs at a time, so a plain read-modify-write is atomic here.
inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}
inline float2 atomicAdd(float2* p, float2 v) {  // sm_90: 8-byte aligned global memory only
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0) emu::fail("float2 atomicAdd on an address not 8-byte aligned");
  const auto* x = reinterpret_cast<const unsigned char*>(p);
  if (emu::g_block && x >= emu::g_block->shared && x < emu::g_block->shared + emu::g_block->shared_bytes)
    emu::fail("float2 atomicAdd on shared memory (sm_90's vector atomics are for global memory)");
  const float2 old = *p;
  p->x += v.x, p->y += v.y;
  return old;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
  const unsigned old = *p;
  if (v > old) *p = v;
  return old;
}
inline int atomicMin(int32_t* p, int32_t v) {
  const int old = *p;
  *p = std::min(old, v);
  return old;
}
// CUDA's device min/max overloads (an integer-only pair would truncate a float argument silently).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// ---- runtime API ----
inline cudaError_t emu_error(cudaError_t e) {
  if (e != cudaSuccess) emu::g_last_error = e;
  return e;
}
inline cudaError_t cudaGetLastError() { return std::exchange(emu::g_last_error, cudaSuccess); }
inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
  }
  return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : e == cudaErrorMemoryAllocation ? "out of memory" : "emulated error";
}
// Devices: env KTUNE_EMU_DEVICES of them (1 by default), each this process's host memory, so that a
// distributed run's workers (one process and one device each) can select devices 0, 1, ...
inline int emu_device_count() {
  const char* v = std::getenv("KTUNE_EMU_DEVICES");
  const int n = v && *v ? std::atoi(v) : 1;
  return n > 0 ? n : 1;
}
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = emu_device_count();
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) {
  return emu_error(device >= 0 && device < emu_device_count() ? cudaSuccess : cudaErrorInvalidDevice);
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::snprintf(p->name, sizeof p->name, "host emulator (tests/kernels/cuda/emulator)");
  p->totalGlobalMem = emu::kDeviceBytes;
  p->major = 9, p->minor = 0, p->multiProcessorCount = 1;
  return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  size_t used = 0;
  for (const auto& a : emu::allocations()) used += a.second.bytes;
  *total = emu::kDeviceBytes;
  *free_bytes = emu::kDeviceBytes - std::min(used, emu::kDeviceBytes);
  return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  if (bytes > emu::kDeviceBytes) return emu_error(cudaErrorMemoryAllocation);
  emu::GuardedBytes g;
  if (!emu::allocate_guarded(g, bytes, 256))
    return emu_error(cudaErrorMemoryAllocation);  // not cleared, as on the device
  emu::install_device_fault_handler();
  emu::close_device_buffer(g);
  std::lock_guard<std::mutex> lock(emu::device_access_mutex());
  emu::allocations()[g.data] = g;
  *p = g.data;
  return cudaSuccess;
}
template <typename T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  emu::DeviceAccess open;
  std::lock_guard<std::mutex> lock(emu::device_access_mutex());
  auto a = emu::allocations().find(p);
  if (a == emu::allocations().end()) return emu_error(cudaErrorInvalidValue);
  if (!emu::slack_untouched(a->second)) {
    std::fprintf(stderr, "emu: something wrote past the end of a %zu-byte cudaMalloc buffer\n", a->second.bytes);
    std::abort();
  }
  emu::release_guarded(a->second);
  emu::allocations().erase(a);
  return cudaSuccess;
}
inline cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = std::malloc(std::max<size_t>(bytes, 1));
  if (!*p) return emu_error(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(emu::device_access_mutex());
  emu::pinned_allocations()[*p] = bytes;
  return cudaSuccess;
}
inline cudaError_t cudaFreeHost(void* p) {
  {
    std::lock_guard<std::mutex> lock(emu::device_access_mutex());
    emu::pinned_allocations().erase(p);
  }
  std::free(p);
  return cudaSuccess;
}
// Stream-ordered allocation: the memory is there when called; the free waits its turn on the stream.
inline cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }

// A stream: the operations it holds back (a late schedule's copies and memsets; collectives waiting
// for their peers, and what follows them), in order, each returning whether it has completed, and
// how many of those enqueued so far have run. An event: the stream and the count of its operations it waits for
// (stream nullptr: complete when recorded), and the host time it was recorded.
struct CUstream_st {
  bool late = false;
  std::deque<std::function<bool()>> pending;
  uint64_t enqueued = 0, done = 0;
};
struct CUevent_st {
  CUstream_st* stream = nullptr;
  uint64_t upto = 0;
  std::chrono::steady_clock::time_point time;
};
namespace emu {
inline std::vector<CUstream_st*>& streams() {
  static std::vector<CUstream_st*> all;
  return all;
}
// Runs s's first held-back operation once; whether it completed (and left the stream).
inline bool step_stream(CUstream_st* s) {
  if (!s->pending.front()()) return false;
  s->pending.pop_front();
  ++s->done;
  return true;
}
// Runs s's held-back operations until `upto` of them have run, waiting for those that wait for
// other processes.
inline void run_stream_until(CUstream_st* s, uint64_t upto) {
  while (s && s->done < upto)
    if (!step_stream(s)) usleep(20);
}
inline void run_stream(CUstream_st* s) {
  if (s) run_stream_until(s, s->enqueued);
}
// An operation on stream s: now (the default stream, an eager stream with nothing held), or held
// back (a late stream; behind an operation still waiting).
inline void enqueue(CUstream_st* s, std::function<void()> op) {
  if (!s || (!s->late && s->pending.empty())) {
    op();
    return;
  }
  s->pending.push_back([op = std::move(op)] {
    op();
    return true;
  });
  ++s->enqueued;
}
// An operation that may have to wait for other processes: `step` does what it can and returns
// whether it completed. Held on s until it completes (tried once now where s holds nothing else);
// on the default stream it runs to completion now.
inline void enqueue_waiting(CUstream_st* s, std::function<bool()> step) {
  if (!s) {
    while (!step()) usleep(20);
    return;
  }
  if (s->pending.empty() && step()) return;
  s->pending.push_back(std::move(step));
  ++s->enqueued;
}
}  // namespace emu

namespace emu {
// CUDA leaves a copy between overlapping ranges undefined (memmove here would hide it).
inline void check_apart(const void* dst, const void* src, size_t n) {
  const auto* d = static_cast<const unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if (n > 0 && d < s + n && s < d + n) fail("cudaMemcpy between overlapping ranges (undefined in CUDA)");
}
}  // namespace emu
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
  emu::note_host_wait();
  emu::check_apart(dst, src, n);
  emu::DeviceAccess open;
  std::memmove(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t s = nullptr) {
  emu::check_apart(dst, src, n);
  emu::enqueue(s, [=] {
    emu::DeviceAccess open;
    std::memmove(dst, src, n);
  });
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int v, size_t n) {
  emu::note_host_wait();
  emu::DeviceAccess open;
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s = nullptr) {
  emu::enqueue(s, [=] {
    emu::DeviceAccess open;
    std::memset(p, v, n);
  });
  return cudaSuccess;
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  emu::enqueue(s, [=] { cudaFree(p); });
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  emu::note_host_wait();
  for (CUstream_st* s : emu::streams()) emu::run_stream(s);
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  *s = new CUstream_st;
  const char* schedule = std::getenv("KTUNE_EMU_STREAMS");
  (*s)->late = (flags & cudaStreamNonBlocking) && schedule && std::strcmp(schedule, "late") == 0;
  emu::streams().push_back(*s);
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  emu::run_stream(s);  // as on a GPU: the work already enqueued completes
  auto& all = emu::streams();
  all.erase(std::remove(all.begin(), all.end(), s), all.end());
  delete s;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  emu::note_host_wait(s);
  emu::run_stream(s);
  return cudaSuccess;
}
// Runs what s holds as far as it can without waiting: cudaErrorNotReady while an operation waits.
inline cudaError_t cudaStreamQuery(cudaStream_t s) {
  while (s && !s->pending.empty())
    if (!emu::step_stream(s)) return cudaErrorNotReady;
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st;
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
  const bool held = s && (s->late || !s->pending.empty());
  e->stream = held ? s : nullptr;
  e->upto = held ? s->enqueued : 0;
  e->time = std::chrono::steady_clock::now();
  return cudaSuccess;
}
// The waiting stream's later work may start once e's stream has run what e was recorded after: for
// the default stream (and an eager one) that is now; a late stream waits in order, when it runs.
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned = 0) {
  CUstream_st* source = e->stream;
  const uint64_t upto = e->upto;
  if (!s || !s->late) emu::run_stream_until(source, upto);
  else emu::enqueue(s, [=] { emu::run_stream_until(source, upto); });
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  emu::note_host_wait(e->stream);
  emu::run_stream_until(e->stream, e->upto);
  return cudaSuccess;
}
// A host function in stream order (a test's stand-in for a collective): run as a copy would be, now
// or held back with the stream's other operations.
using cudaHostFn_t = void (*)(void*);
inline cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  emu::enqueue(s, [=] { fn(data); });
  return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return cudaSuccess;
}

template <typename K>
cudaError_t cudaFuncSetAttribute(K kernel, cudaFuncAttribute, int bytes) {
  if (bytes < 0 || size_t(bytes) > emu::kMaxSharedBytes) {
    std::fprintf(stderr, "emu: cudaFuncSetAttribute: %d bytes of shared memory > 227 KiB (sm_90)\n", bytes);
    std::abort();
  }
  emu::shared_limits()[emu::kernel_key(kernel)] = size_t(bytes);
  return cudaSuccess;
}

// A launch as rewrite.py writes it: emu_launch(emu_config(kernel, grid, block, shared, stream), body),
// body calling the kernel with its arguments, once per thread.
struct EmuConfig {
  dim3 grid, block;
  size_t shared;
  const void* kernel;
};
template <typename K>
EmuConfig emu_config(K kernel, dim3 grid, dim3 block, size_t shared = 0, cudaStream_t = nullptr) {
  return EmuConfig{grid, block, shared, emu::kernel_key(kernel)};
}
inline void emu_launch(EmuConfig c, std::function<void()> body) {
  const unsigned threads = c.block.x;
  if (c.block.y != 1 || c.block.z != 1 || c.grid.z != 1)
    emu::fail("launch: only 1-D blocks and 2-D grids are emulated (ktune's kernels use no more)");
  if (threads == 0 || threads > 1024 || threads % 32 != 0)
    emu::fail("launch: block size must be a multiple of 32 in [32, 1024] (the emulator's warps are whole)");
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.y > 65535u)
    emu::fail("launch: grid.x must be > 0 and grid.y in [1, 65535]");
  auto limit = emu::shared_limits().find(c.kernel);
  const size_t max_shared = limit == emu::shared_limits().end() ? emu::kDefaultSharedBytes : limit->second;
  if (c.shared > max_shared) {
    std::fprintf(stderr, "emu: launch with %zu bytes of dynamic shared memory > this kernel's limit %zu%s\n", c.shared,
                 max_shared,
                 limit == emu::shared_limits().end()
                     ? " (no cudaFuncSetAttribute, or a template kernel launched with deduced arguments)"
                     : "");
    std::abort();
  }
  emu::DeviceAccess open;
  emu::g_bdim = c.block;
  emu::g_gdim = c.grid;
  emu::g_body = std::move(body);
  const int fixed = emu::fixed_schedule();
  emu::GuardedBytes shared;
  if (!emu::allocate_guarded(shared, c.shared, 128)) emu::fail("cannot map a block's shared memory");
  const uint64_t launch = emu::g_launches++;
  std::vector<std::pair<unsigned, unsigned>> blocks;  // (x, y)
  for (unsigned y = 0; y < c.grid.y; ++y)
    for (unsigned x = 0; x < c.grid.x; ++x) blocks.emplace_back(x, y);
  const int block_order = fixed >= 0 ? fixed : int(launch % 3);
  if (block_order == 1) std::reverse(blocks.begin(), blocks.end());
  if (block_order == 2) std::shuffle(blocks.begin(), blocks.end(), emu::g_rng);
  uint64_t index = launch;
  for (const auto& [x, y] : blocks) emu::run_block(x, y, threads, shared, fixed >= 0 ? fixed : int(index++ % 4));
  emu::release_guarded(shared);
}
