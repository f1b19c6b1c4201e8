// The CUDA tests' main: runs the registered cases (cuda_test_harness.h) and prints PASS/FAIL/SKIP
// per case and a summary. Exit 0: all passed; 1: a case failed; 77: no CUDA device (all skipped).
// `--self-test` checks the harness's own comparisons on the CPU; any other argument filters cases:
// comma-separated name substrings, '-' in front excluding (see selected()).
#include <chrono>
#include <cstdlib>
#include <exception>
#include <string>

#include "cuda_test_harness.h"
#include "kernels/cuda/device_memory.h"

namespace ktune::cuda_test {
namespace {
int g_failures = 0;
}

std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

void record_failure(const char* file, int line, const std::string& message) {
  ++g_failures;
  std::printf("    %s:%d: %s\n", file, line, message.c_str());
  std::fflush(stdout);
}

int failures_in_current_case() { return g_failures; }

Closeness closeness(const float* got, const float* want, int64_t n, double atol, double rtol) {
  Closeness c;
  for (int64_t i = 0; i < n; ++i) {
    double g = got[i], w = want[i];
    const double diff = std::fabs(g - w);
    // Equal values are within any tolerance (also atol = rtol = 0, where 0/0 would be NaN).
    double r = std::isnan(g) || std::isnan(w) ? INFINITY : diff == 0.0 ? 0.0 : diff / (atol + rtol * std::fabs(w));
    if (r > c.ratio || c.worst < 0) c = Closeness{r, i, g, w};
  }
  return c;
}

std::string describe(const Closeness& c, double atol, double rtol) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "worst element %lld: got %.9g want %.9g (%.3g x the tolerance atol=%g rtol=%g)",
                (long long)c.worst, c.got, c.want, c.ratio, atol, rtol);
  return buf;
}

}  // namespace ktune::cuda_test

namespace {

// --self-test: the harness's own logic, on the CPU (runs where there is no GPU, so CTest proves the
// comparisons that every GPU case relies on). Returns the number of wrong answers.
int self_test() {
  using namespace ktune::cuda_test;
  int wrong = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::printf("self-test: %s\n", what);
      ++wrong;
    }
  };
  const float a[3] = {1.0f, -2.0f, 0.0f}, b[3] = {1.0f, -2.0f, 0.0f}, c[3] = {1.0f, -2.001f, 0.0f};
  const float nan[3] = {1.0f, NAN, 0.0f};
  expect(closeness(a, b, 3, 0.0, 0.0).ratio == 0.0, "equal arrays are within a zero tolerance");
  expect(closeness(a, c, 3, 0.0, 1e-4).ratio > 1.0, "a 5e-4 relative difference exceeds rtol 1e-4");
  expect(closeness(a, c, 3, 0.0, 1e-3).ratio <= 1.0, "a 5e-4 relative difference is within rtol 1e-3");
  expect(closeness(a, c, 3, 0.0, 1e-4).worst == 1, "the worst element is named");
  expect(closeness(nan, b, 3, 1.0, 1.0).ratio > 1.0, "NaN is never close");
  const int before = failures_in_current_case();
  CHECK(1 + 1 == 3) << "expected failure, printed by the self-test";
  CHECK_CLOSE(a, c, 3, 0.0, 1e-4) << "expected failure, printed by the self-test";
  CHECK(true) << "not recorded";
  CHECK_CLOSE(a, b, 3, 0.0, 0.0);
  expect(failures_in_current_case() - before == 2, "CHECK and CHECK_CLOSE record exactly the two failures");
  return wrong;
}

// The case filter: comma-separated substrings of case names; a case runs when it contains one of
// the plain ones (or there are none) and none of those written with a leading '-'.
//   "Gemm"   "AttentionGemm,GemmStrided"   "-Decoder,-AttentionGemm"
bool selected(const std::string& name, const std::string& filter) {
  bool any_include = false, included = false;
  size_t begin = 0;
  while (begin <= filter.size()) {
    size_t end = filter.find(',', begin);
    if (end == std::string::npos) end = filter.size();
    std::string item = filter.substr(begin, end - begin);
    begin = end + 1;
    if (item.empty()) continue;
    if (item[0] == '-') {
      if (name.find(item.substr(1)) != std::string::npos) return false;
    } else {
      any_include = true;
      if (name.find(item) != std::string::npos) included = true;
    }
  }
  return !any_include || included;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ktune::cuda_test;
  const std::string filter = argc > 1 ? argv[1] : "";
  if (filter == "--self-test") {
    int wrong = self_test();
    const bool filters_ok = selected("DecoderLora", "") && selected("DecoderLora", "Decoder") &&
                            !selected("DecoderLora", "Gemm") && selected("AttentionGemmX", "Decoder,AttentionGemm") &&
                            !selected("DecoderLora", "-Decoder") && selected("GemmCaches", "-Decoder,-AttentionGemm") &&
                            !selected("AttentionGemmX", "-Decoder,-AttentionGemm");
    if (!filters_ok) {
      std::printf("self-test: the case filter selects the wrong cases\n");
      ++wrong;
    }
    std::printf("%s harness self-test (%d wrong)\n", wrong == 0 ? "PASS" : "FAIL", wrong);
    return wrong == 0 ? 0 : 1;
  }
  const int devices = ktune::cuda::device_count();
  int passed = 0, failed = 0, skipped = 0;
  if (devices == 0) {
    const std::string why = ktune::cuda::device_description();
    for (const Case& c : registry()) {
      if (!selected(c.name, filter)) continue;
      std::printf("SKIP %s: %s\n", c.name, why.c_str());
      ++skipped;
    }
    std::printf("ktune CUDA tests: 0 passed, 0 failed, %d skipped (no GPU: nothing was tested)\n", skipped);
    return 77;
  }
  std::printf("device: %s\n", ktune::cuda::device_description().c_str());
  for (const Case& c : registry()) {
    if (!selected(c.name, filter)) continue;
    const int before = failures_in_current_case();
    auto start = std::chrono::steady_clock::now();
    std::string thrown;
    std::printf("RUN  %s\n", c.name);  // a crash or hang shows which case it was in
    std::fflush(stdout);
    try {
      c.body();
      ktune::cuda::synchronize();  // a fault in a kernel this case launched is this case's failure
    } catch (const std::exception& e) {
      thrown = e.what();
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!thrown.empty()) std::printf("    threw: %s\n", thrown.c_str());
    if (thrown.empty() && failures_in_current_case() == before) {
      std::printf("PASS %s (%.0f ms)\n", c.name, ms);
      ++passed;
    } else {
      std::printf("FAIL %s (%.0f ms)\n", c.name, ms);
      ++failed;
    }
    std::fflush(stdout);
  }
  std::printf("ktune CUDA tests: %d passed, %d failed, 0 skipped\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
