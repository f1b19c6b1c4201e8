// The emulator's own checks, so that what it is trusted to catch stays caught: a kernel missing a
// barrier gives a wrong result under some schedule while the same kernel with it is right under all
// four (a race between warps that only warp-level switch points separate needs the warp-by-warp one); a race between blocks shows over three launches; shuffles, wmma, mma.sync m16n8k16 and
// ldmatrix compute what CUDA and PTX document (cp.async's copies land only at their wait); reading a
// wmma fragment's elements as if their lane layout were known is wrong here;
// fresh device memory reads as NaN; cudaMalloc and cudaFree fail as the runtime does; and (in a
// child process each) a launch over its shared-memory limit or its __launch_bounds__, a read past a
// cudaMalloc buffer and a barrier that not every thread reaches all end the run; so do the host
// (or a host function) reading or writing a cudaMalloc buffer, which copies and memsets still reach,
// and a launch argument, or a pointer field of a struct argument, that points into neither device nor
// pinned memory. Under the late
// stream schedule a non-blocking stream's copy lands only when waited for, so a read that does not
// wait sees the old bytes, and an outgoing copy not waited for takes what was written after it. An
// operation waiting for other processes holds its stream (cudaStreamQuery: not ready), and a copy
// between overlapping ranges ends the run.
// Kernels here call emu_launch directly (rewrite.py's output form), since this file is no .cu.
// It deliberately checks no ktune kernel: those are the GPU tests run on the emulator.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda_runtime.h"
#include "kernels/cuda/mma_m16n8k16.cuh"
#include "mma.h"

namespace {

int g_wrong = 0;
void expect(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++g_wrong;
}

// out[0] = sum of 0..255, block-wide through shared memory; with_barrier false drops the barrier
// between the writes and the reads.
void block_sum_kernel(int* out, bool with_barrier) {
  int* s = reinterpret_cast<int*>(::emu::shared_memory());
  s[threadIdx.x] = int(threadIdx.x);
  if (with_barrier) __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (unsigned i = 0; i < blockDim.x; ++i) total += s[i];
    *out = total;
  }
}

int block_sum(bool with_barrier) {
  int out = -1;
  emu_launch(emu_config(block_sum_kernel, 1, 256, 256 * sizeof(int)), [&] { block_sum_kernel(&out, with_barrier); });
  return out;
}

void shuffle_kernel(float* out) {
  float v = float(threadIdx.x);
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  out[threadIdx.x] = v + __shfl_sync(0xffffffffu, float(threadIdx.x), 3) * 0.0f;
}

// C (16 x 16) = A B with A(m, k) = m + k, B(k, n) = k - n, from shared memory; `peek` instead writes
// C by reading the accumulator's elements as if lane l held row-major elements 8l .. 8l + 7.
void wmma_kernel(float* c, bool peek) {
  namespace wmma = nvcuda::wmma;
  auto* a = reinterpret_cast<__nv_bfloat16*>(::emu::shared_memory());
  __nv_bfloat16* b = a + 256;
  for (int i = threadIdx.x; i < 256; i += 32) {
    a[i] = __float2bfloat16_rn(float(i / 16 + i % 16));
    b[i] = __float2bfloat16_rn(float(i / 16 - i % 16));
  }
  __syncwarp();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(acc, fa, fb, acc);
  if (!peek) {
    wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
  } else {
    for (int e = 0; e < 8; ++e) c[threadIdx.x * 8 + e] = acc.x[e];
  }
}

bool wmma_matches(bool peek) {
  alignas(32) float c[256];
  emu_launch(emu_config(wmma_kernel, 1, 32, 512 * sizeof(__nv_bfloat16)), [&] { wmma_kernel(c, peek); });
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      float want = 0;
      for (int k = 0; k < 16; ++k) want += float(m + k) * float(k - n);
      if (c[m * 16 + n] != want) return false;
    }
  return true;
}

// mma.sync m16n8k16 with its fragments built element by element from PTX's table (not through
// ldmatrix): lane 4g + t holds A(g, 2t..2t+1), A(g+8, ..), A(g, 8+2t..), A(g+8, 8+2t..); B(2t.., g),
// B(8+2t.., g); C(g, 2t), C(g, 2t+1), C(g+8, 2t), C(g+8, 2t+1). A(m, k) = m + k, B(k, n) = k - n,
// C(m, n) = m n: D written back by the same table into d (16 x 8).
void ptx_mma_kernel(float* d) {
  namespace ptx = ktune::cuda::ptx;
  const int lane = int(threadIdx.x), g = lane / 4, t = lane % 4;
  auto A = [](int m, int k) { return float(m + k); };
  auto B = [](int k, int n) { return float(k - n); };
  const uint32_t a[4] = {ptx::pack_bf16x2(A(g, 2 * t), A(g, 2 * t + 1)),
                         ptx::pack_bf16x2(A(g + 8, 2 * t), A(g + 8, 2 * t + 1)),
                         ptx::pack_bf16x2(A(g, 8 + 2 * t), A(g, 9 + 2 * t)),
                         ptx::pack_bf16x2(A(g + 8, 8 + 2 * t), A(g + 8, 9 + 2 * t))};
  float c[4] = {float(g * 2 * t), float(g * (2 * t + 1)), float((g + 8) * 2 * t), float((g + 8) * (2 * t + 1))};
  ptx::mma_bf16_16816(c, a, ptx::pack_bf16x2(B(2 * t, g), B(2 * t + 1, g)), ptx::pack_bf16x2(B(8 + 2 * t, g), B(9 + 2 * t, g)));
  d[g * 8 + 2 * t] = c[0], d[g * 8 + 2 * t + 1] = c[1], d[(g + 8) * 8 + 2 * t] = c[2], d[(g + 8) * 8 + 2 * t + 1] = c[3];
}

bool ptx_mma_matches() {
  float d[128];
  emu_launch(emu_config(ptx_mma_kernel, 1, 32), [&] { ptx_mma_kernel(d); });
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      float want = float(m * n);
      for (int k = 0; k < 16; ++k) want += float(m + k) * float(k - n);
      if (d[m * 8 + n] != want) return false;
    }
  return true;
}

// ldmatrix x4 (trans or not) of four 8x8 bf16 matrices in shared memory, X_i(r, c) = 64 i + 8 r + c
// (rows 24 elements apart, lane 8i + r giving matrix i's row r); got[lane * 4 + i] = register i's
// two halves as (low, high) element values, unpacked.
void ldmatrix_kernel(float* got, bool trans) {
  namespace ptx = ktune::cuda::ptx;
  auto* x = reinterpret_cast<__nv_bfloat16*>(::emu::shared_memory());
  for (int e = int(threadIdx.x); e < 32 * 24; e += 32) {
    const int row = e / 24, col = e % 24;  // row 8i + r
    x[e] = __float2bfloat16_rn(col < 8 ? float(64 * (row / 8) + 8 * (row % 8) + col) : -1.0f);
  }
  __syncwarp();
  uint32_t r[4];
  const __nv_bfloat16* row = x + threadIdx.x * 24;
  if (trans) ptx::ldmatrix_x4_trans(r, row);
  else ptx::ldmatrix_x4(r, row);
  for (int i = 0; i < 4; ++i) got[(threadIdx.x * 4 + i) * 2] = ptx::low_half(r[i]), got[(threadIdx.x * 4 + i) * 2 + 1] = ptx::high_half(r[i]);
}

// Lane 4g + t holds X_i(g, 2t), X_i(g, 2t+1) plainly and X_i(2t, g), X_i(2t+1, g) transposed.
bool ldmatrix_matches(bool trans) {
  float got[32 * 4 * 2];
  emu_launch(emu_config(ldmatrix_kernel, 1, 32, 32 * 24 * 2), [&] { ldmatrix_kernel(got, trans); });
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const int g = lane / 4, t = lane % 4;
      const float lo = trans ? float(64 * i + 8 * (2 * t) + g) : float(64 * i + 8 * g + 2 * t);
      const float hi = trans ? float(64 * i + 8 * (2 * t + 1) + g) : float(64 * i + 8 * g + 2 * t + 1);
      if (got[(lane * 4 + i) * 2] != lo || got[(lane * 4 + i) * 2 + 1] != hi) return false;
    }
  return true;
}

// Each thread cp.asyncs 16 bytes into shared memory (the second group zero-filled) and reads them back
// before its wait and after it; seen: (before, after the first group's wait, after all) per thread.
void cp_async_kernel(const float* src, float* seen) {
  namespace ptx = ktune::cuda::ptx;
  float* s = reinterpret_cast<float*>(::emu::shared_memory());
  const int i = int(threadIdx.x);
  ptx::cp_async_16(s + 4 * i, src + 4 * i, true);
  ptx::cp_async_commit();
  ptx::cp_async_16(s + 128 + 4 * i, src + 4 * i, false);
  ptx::cp_async_commit();
  seen[3 * i] = s[4 * i];
  ptx::cp_async_wait<1>();
  seen[3 * i + 1] = s[4 * i] + s[128 + 4 * i];
  ptx::cp_async_wait<0>();
  seen[3 * i + 2] = s[128 + 4 * i];
}

// out[w] = what warp w's lane 0 reads of warp (w + 1) % 4's slot, written before a few warp-level
// switch points on both sides; with_barrier adds the __syncthreads that the reads need.
void cross_warp_kernel(int* out, bool with_barrier) {
  int* s = reinterpret_cast<int*>(::emu::shared_memory());
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (lane == 0) s[warp] = warp + 1;
  for (int i = 0; i < 3; ++i) __syncwarp();
  if (with_barrier) __syncthreads();
  if (lane == 0) out[warp] = s[(warp + 1) % 4];
}

bool cross_warp_right(bool with_barrier) {
  int out[4];
  emu_launch(emu_config(cross_warp_kernel, 1, 128, 4 * sizeof(int)), [&] { cross_warp_kernel(out, with_barrier); });
  return out[0] == 2 && out[1] == 3 && out[2] == 4 && out[3] == 1;
}

// Block b reads what block b - 1 writes, with nothing ordering the two: an inter-block race.
void neighbour_kernel(int* written, int* seen) {
  if (threadIdx.x != 0) return;
  const unsigned b = blockIdx.x;
  seen[b] = b > 0 ? written[b - 1] : 1;
  written[b] = 1;
}

void read_past_kernel(const float* x, float* out) { out[threadIdx.x] = x[threadIdx.x + 64]; }
void bounded_kernel() { ::emu::check_launch_bounds(32); }  // __launch_bounds__(32), as rewrite.py writes it
void half_barrier_kernel() {
  if (threadIdx.x < 32) __syncthreads();
}

// A kernel's struct argument, as the attention kernels' Params: its pointers are checked field by field.
struct Span {
  const float* data;
  int64_t count;
};
struct KernelParams {
  int64_t rows;
  float scale;
  const float* x;
  const float* optional;  // may be null
  Span span;
};

// fn run in a child process: its exit status, or -1 when it ended abnormally (abort or a fault).
int in_child(const std::function<void()>& fn) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    std::freopen("/dev/null", "w", stderr);
    fn();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
bool dies(const std::function<void()>& fn) { return in_child(fn) == -1; }

// d[e] = e + 1 for e < n, copied from the host (the host cannot write device memory).
void upload_counting(float* d, int n) {
  std::vector<float> values(static_cast<size_t>(n));
  for (int e = 0; e < n; ++e) values[size_t(e)] = float(e + 1);
  cudaMemcpy(d, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice);
}

}  // namespace

int main() {
  bool all_right = true, any_wrong = false;
  for (const char* schedule : {"order", "reverse", "shuffle"}) {
    setenv("KTUNE_EMU_SCHEDULE", schedule, 1);  // read once per process: each schedule in a child
    all_right &= in_child([] { _exit(block_sum(true) == 255 * 256 / 2 ? 0 : 1); }) == 0;
    any_wrong |= in_child([] { _exit(block_sum(false) == 255 * 256 / 2 ? 0 : 1); }) == 1;
  }
  bool cross_right = true, cross_wrong = false, round_robin_hides = true;
  for (const char* schedule : {"order", "reverse", "shuffle", "warps"}) {
    setenv("KTUNE_EMU_SCHEDULE", schedule, 1);
    cross_right &= in_child([] { _exit(cross_warp_right(true) ? 0 : 1); }) == 0;
    const bool wrong = in_child([] { _exit(cross_warp_right(false) ? 0 : 1); }) == 1;
    cross_wrong |= wrong;
    if (std::string(schedule) != "warps") round_robin_hides &= !wrong;
  }
  bool copies_held = false, copies_eager = false;
  {
    float* src = nullptr;  // (each schedule in a child, before this process launches anything: see above)
    cudaMalloc(&src, 128 * sizeof(float));
    upload_counting(src, 128);
    // 0: every copy held until its wait (before: NaN, after the first wait: value + NaN, then the
    // zero-fill); 1: every copy landed when issued; 2: anything else
    auto copies = [src](const char* schedule) {
      setenv("KTUNE_EMU_SCHEDULE", schedule, 1);
      const int status = in_child([src] {
        float seen[96];
        emu_launch(emu_config(cp_async_kernel, 1, 32, 256 * sizeof(float)), [&] { cp_async_kernel(src, seen); });
        bool held = true, eager = true;
        for (int i = 0; i < 32; ++i) {
          const float value = float(4 * i + 1);
          held &= std::isnan(seen[3 * i]) && std::isnan(seen[3 * i + 1]) && seen[3 * i + 2] == 0.0f;
          eager &= seen[3 * i] == value && seen[3 * i + 1] == value && seen[3 * i + 2] == 0.0f;
        }
        _exit(held ? 0 : eager ? 1 : 2);
      });
      unsetenv("KTUNE_EMU_SCHEDULE");
      return status;
    };
    copies_held = copies("order") == 0 && copies("shuffle") == 0;
    copies_eager = copies("reverse") == 1 && copies("warps") == 1;
    cudaFree(src);
  }
  unsetenv("KTUNE_EMU_SCHEDULE");
  expect(all_right, "a block sum with its barrier is right under every schedule");
  expect(any_wrong, "the block sum without its barrier is wrong under some schedule");
  expect(cross_right, "warps reading each other's writes after a __syncthreads are right under every schedule");
  expect(cross_wrong && round_robin_hides,
         "without it (only warp-level switch points between), only the warp-by-warp schedule shows the race");

  float sums[64];
  emu_launch(emu_config(shuffle_kernel, 1, 64), [&] { shuffle_kernel(sums); });
  expect(sums[0] == 496.0f && sums[31] == 496.0f && sums[32] == 1520.0f, "__shfl_xor_sync sums each warp");

  expect(wmma_matches(false), "wmma load / mma_sync / store computes A B");
  expect(!wmma_matches(true), "reading accumulator elements by an assumed lane layout is wrong");
  expect(ptx_mma_matches(), "mma.sync m16n8k16 computes D = A B + C by PTX's fragment table");
  expect(ldmatrix_matches(false), "ldmatrix x4 gives lane 4g + t matrix i's (g, 2t..2t+1)");
  expect(ldmatrix_matches(true), "ldmatrix x4 .trans gives lane 4g + t matrix i's (2t..2t+1, g)");
  expect(copies_held, "order, shuffle: a cp.async copy lands only at the wait that covers its group (before: NaN)");
  expect(copies_eager, "reverse, warps: a cp.async copy lands when issued");
  {
    float* src = nullptr;
    cudaMalloc(&src, 128 * sizeof(float));
    upload_counting(src, 128);
    expect(dies([src] {
             float out[96];
             emu_launch(emu_config(cp_async_kernel, 1, 32, 64 * sizeof(float)), [&] { cp_async_kernel(src, out); });
           }),
           "a cp.async past the block's shared memory aborts");
    cudaFree(src);
  }

  int seen_totals[3];  // three launches in a row: grid order, reversed, shuffled
  for (int& total : seen_totals) {
    int written[8] = {}, seen[8] = {};
    emu_launch(emu_config(neighbour_kernel, 8, 32), [&] { neighbour_kernel(written, seen); });
    total = 0;
    for (int v : seen) total += v;
  }
  expect(seen_totals[0] != seen_totals[1] || seen_totals[0] != seen_totals[2],
         "a block reading another block's writes sees different values over three launches");

  float* d = nullptr;
  float fresh[64];
  expect(cudaMalloc(&d, 64 * sizeof(float)) == cudaSuccess &&
             cudaMemcpy(fresh, d, sizeof fresh, cudaMemcpyDeviceToHost) == cudaSuccess && std::isnan(fresh[0]) &&
             std::isnan(fresh[63]),
         "fresh device memory reads as NaN");
  expect(dies([d] { std::printf("%f\n", double(d[0])); }) && dies([d] { d[1] = 1.0f; }),
         "the host reading or writing a cudaMalloc buffer outside a device operation faults");
  expect(!dies([d] {
    float one = 1.0f, back = 0.0f;
    cudaMemcpy(d + 1, &one, sizeof one, cudaMemcpyHostToDevice);
    cudaMemset(d + 2, 0, sizeof(float));
    cudaMemcpy(&back, d + 1, sizeof back, cudaMemcpyDeviceToHost);
    if (back != 1.0f) std::abort();
  }),
         "copies and memsets reach it (they are device operations)");
  expect(!dies([d] {
    float* pinned = nullptr;
    cudaMallocHost(reinterpret_cast<void**>(&pinned), 16 * sizeof(float));
    emu::check_kernel_pointers(d, d + 64, pinned, static_cast<const float*>(nullptr), 3, 1.5f);
  }) && dies([d] {
    float on_the_stack[4];
    emu::check_kernel_pointers(d, on_the_stack);
  }) && dies([d] { emu::check_kernel_pointers(d + 65); }),
         "a launch's pointer arguments: device, one past its end, pinned and null pass; a host array or "
         "past the end aborts");
  expect(!dies([d] {
    emu::check_kernel_pointers(KernelParams{4, 0.5f, d, nullptr, {d + 8, 2}}, 1);
  }) && dies([d] {
    float on_the_stack[4];
    emu::check_kernel_pointers(KernelParams{4, 0.5f, d, on_the_stack, {d, 2}});
  }) && dies([d] {
    std::vector<float> host(4);
    emu::check_kernel_pointers(KernelParams{4, 0.5f, d, nullptr, {host.data(), 2}});
  }),
         "a struct argument's pointer fields, nested ones too, are held to the same rule");
  expect(dies([d] {
    cudaStream_t s = nullptr;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaLaunchHostFunc(s, [](void* p) { static_cast<float*>(p)[0] = 2.0f; }, d);
    cudaStreamSynchronize(s);
  }),
         "a host function (cudaLaunchHostFunc) writing it faults: it is host code");
  void* huge = nullptr;
  expect(cudaMalloc(&huge, size_t(1) << 52) == cudaErrorMemoryAllocation && huge == nullptr &&
             cudaGetLastError() == cudaErrorMemoryAllocation && cudaGetLastError() == cudaSuccess,
         "an allocation past the device's memory fails, once, as cudaErrorMemoryAllocation");
  float host = 0;
  expect(cudaFree(&host) == cudaErrorInvalidValue && cudaGetLastError() == cudaErrorInvalidValue,
         "cudaFree of memory cudaMalloc did not hand out fails");

  expect(dies([] { emu_launch(emu_config(block_sum_kernel, 1, 32, 49 * 1024), [] {}); }),
         "a launch with 49 KiB of dynamic shared memory and no cudaFuncSetAttribute aborts");
  expect(!dies([] {
    cudaFuncSetAttribute(block_sum_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024);
    emu_launch(emu_config(block_sum_kernel, 1, 32, 100 * 1024), [] {});
  }),
         "the same launch after cudaFuncSetAttribute runs");
  expect(dies([d] {
           float out[32];
           emu_launch(emu_config(read_past_kernel, 1, 32), [&] { read_past_kernel(d, out); });
         }),
         "a read past the end of a cudaMalloc buffer faults");
  expect(dies([] { emu_launch(emu_config(half_barrier_kernel, 1, 64), [] { half_barrier_kernel(); }); }),
         "a __syncthreads that half the block skips is a deadlock, which aborts");
  expect(!dies([] { emu_launch(emu_config(bounded_kernel, 1, 32), [] { bounded_kernel(); }); }) &&
             dies([] { emu_launch(emu_config(bounded_kernel, 1, 64), [] { bounded_kernel(); }); }),
         "a block larger than the kernel's __launch_bounds__ aborts");
  expect(cudaFree(d) == cudaSuccess, "cudaFree of a cudaMalloc buffer");

  // Streams: a copy on a non-blocking stream, late (held back until waited for) and eager.
  auto copy_then_read = [](const char* schedule, bool wait) {
    setenv("KTUNE_EMU_STREAMS", schedule, 1);  // read when the stream is created
    cudaStream_t side = nullptr;
    cudaEvent_t copied = nullptr;
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&copied, cudaEventDisableTiming);
    int source = 1, target = 0;
    cudaMemcpyAsync(&target, &source, sizeof(int), cudaMemcpyDeviceToDevice, side);
    cudaEventRecord(copied, side);
    source = 2;  // the default stream overwrites the source after enqueueing the copy
    if (wait) cudaStreamWaitEvent(nullptr, copied, 0);
    const int seen = target;
    cudaStreamDestroy(side);  // runs what is left
    cudaEventDestroy(copied);
    unsetenv("KTUNE_EMU_STREAMS");
    return std::make_pair(seen, target);
  };
  expect(copy_then_read("late", false) == std::make_pair(0, 2),
         "late streams: a copy nobody waited for has not landed, and it later copies the newer source");
  expect(copy_then_read("late", true) == std::make_pair(2, 2),
         "late streams: the copy lands at the wait (the latest a GPU may run it)");
  expect(copy_then_read("eager", false) == std::make_pair(1, 1), "eager streams: the copy runs when called");

  // An operation that waits for other processes (fake/nccl.h's collectives) holds its stream, and
  // what follows it, until it completes: cudaStreamQuery says not ready meanwhile.
  {
    cudaStream_t side = nullptr;
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);  // eager
    bool peers_arrived = false;
    int source = 1, target = 0;
    emu::enqueue_waiting(side, [&] { return peers_arrived; });
    cudaMemcpyAsync(&target, &source, sizeof(int), cudaMemcpyDeviceToDevice, side);
    const bool held = cudaStreamQuery(side) == cudaErrorNotReady && target == 0;
    peers_arrived = true;
    expect(held && cudaStreamQuery(side) == cudaSuccess && target == 1,
           "a waiting operation holds an eager stream's later copy until it completes");
    cudaStreamDestroy(side);
  }
  expect(dies([] {
           char bytes[8] = {};
           cudaMemcpy(bytes + 1, bytes, 4, cudaMemcpyDeviceToDevice);
         }) &&
             !dies([] {
               char bytes[8] = {};
               cudaMemcpy(bytes + 4, bytes, 4, cudaMemcpyDeviceToDevice);
             }),
         "cudaMemcpy between overlapping ranges aborts (adjacent ones copy)");

  std::printf("%s CUDA emulator self-test (%d wrong)\n", g_wrong == 0 ? "PASS" : "FAIL", g_wrong);
  return g_wrong == 0 ? 0 : 1;
}
