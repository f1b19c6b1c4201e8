#include "core/parallel.h"

#include <cstdlib>
#include <string>

namespace ktune {

static int initial_threads() {
  for (const char* name : {"KTUNE_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const char* v = std::getenv(name)) {
      int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return omp_get_num_procs();
}

static int g_threads = 0;

int num_threads() {
  if (g_threads == 0) set_num_threads(initial_threads());
  return g_threads;
}

void set_num_threads(int threads) {
  g_threads = threads > 0 ? threads : 1;
  omp_set_num_threads(g_threads);
}

}  // namespace ktune
