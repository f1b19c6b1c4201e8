// Threading: OpenMP across the machine's cores. One place sets the thread count (KTUNE_NUM_THREADS,
// else OMP_NUM_THREADS, else all cores) so that kernels, oneDNN and the benchmarks agree.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace ktune {

int num_threads();                  // the count in force
void set_num_threads(int threads);  // for OpenMP regions (oneDNN's OpenMP build follows it)

// Split [0, n) into contiguous chunks, one per thread: body(begin, end). Runs inline when n is small.
template <typename Body>
void parallel_for(int64_t n, Body body, int64_t min_per_thread = 1) {
  int threads = int(std::min<int64_t>(num_threads(), std::max<int64_t>(1, n / std::max<int64_t>(1, min_per_thread))));
  if (threads <= 1) {
    body(int64_t(0), n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num();
    int count = omp_get_num_threads();
    int64_t begin = n * t / count;
    int64_t end = n * (t + 1) / count;
    if (begin < end) body(begin, end);
  }
}

}  // namespace ktune
