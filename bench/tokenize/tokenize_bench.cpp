// bench/tokenize: ktune's tokenisation throughput on the documents of make_corpus.py — one document
// at a time on one thread, and all documents over the thread pool (parallel_for, KTUNE_NUM_THREADS) —
// best of --repeat after a warm-up pass, printed beside HF tokenizers' figures from bench_hf.py
// (--peer) with the ratio. It also checks that every document's ids equal HF's.
#include <nlohmann/json.hpp>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "text/tokenizer.h"

using namespace ktune;

namespace {

double wall_clock() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
// This thread's CPU time: unaffected by other processes sharing the cores.
double thread_cpu_clock() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Timing {
  double wall = 1e30, cpu = 1e30;  // best seconds
};
// Best wall-clock and best thread-CPU seconds over `repeat` timed runs after a warm-up run.
template <typename F>
Timing best_seconds(int repeat, F&& fn) {
  fn();
  Timing t;
  for (int r = 0; r < repeat; ++r) {
    double w0 = wall_clock(), c0 = thread_cpu_clock();
    fn();
    t.wall = std::min(t.wall, wall_clock() - w0);
    t.cpu = std::min(t.cpu, thread_cpu_clock() - c0);
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, docs_path, peer_path, label = "tokenizer";
  int repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--tokenizer") tokenizer_path = argv[i + 1];
    else if (a == "--docs") docs_path = argv[i + 1];
    else if (a == "--peer") peer_path = argv[i + 1];
    else if (a == "--repeat") repeat = std::stoi(argv[i + 1]);
    else if (a == "--label") label = argv[i + 1];
  }
  if (tokenizer_path.empty() || docs_path.empty()) {
    std::fprintf(stderr, "usage: ktune_bench_tokenize --tokenizer F --docs DOCS.jsonl [--peer HF.json] [--repeat N] [--label L]\n");
    return 2;
  }
  try {
    std::vector<std::string> docs;
    size_t bytes = 0;
    std::ifstream in(docs_path);
    for (std::string line; std::getline(in, line);) {
      docs.push_back(nlohmann::json::parse(line).get<std::string>());
      bytes += docs.back().size();
    }
    const double mb = double(bytes) / 1e6;
    double w0 = wall_clock(), c0 = thread_cpu_clock();
    TokenizerOptions options;
    options.path = tokenizer_path;
    auto tok = load_tokenizer(options);
    double load_s = wall_clock() - w0, load_cpu_s = thread_cpu_clock() - c0;

    std::vector<std::vector<int32_t>> ids(docs.size());
    auto encode_each = [&] {
      for (size_t i = 0; i < docs.size(); ++i) ids[i] = tok->encode(docs[i]);
    };
    Timing single = best_seconds(repeat, encode_each);
    Timing batch = best_seconds(repeat, [&] {
      parallel_for(int64_t(docs.size()), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) ids[size_t(i)] = tok->encode(docs[size_t(i)]);
      });
    });
    size_t tokens = 0;
    for (const auto& v : ids) tokens += v.size();
    std::printf("%s: %zu documents, %.2f MB, %zu tokens, loaded in %.2f s (%.2f s CPU), %d threads for batch\n",
                label.c_str(), docs.size(), mb, tokens, load_s, load_cpu_s, num_threads());
    double hf_single = 0, hf_single_cpu = 0, hf_batch = 0;
    if (!peer_path.empty()) {
      nlohmann::json peer = nlohmann::json::parse(std::ifstream(peer_path));
      if (peer.contains("single_mb_s")) {
        hf_single = peer["single_mb_s"].get<double>();
        hf_single_cpu = peer["single_cpu_mb_s"].get<double>();
        hf_batch = peer["batch_mb_s"].get<double>();
        size_t mismatched = 0;
        for (size_t i = 0; i < docs.size(); ++i)
          if (peer["ids"][i].get<std::vector<int32_t>>() != ids[i]) ++mismatched;
        std::printf("  ids identical to HF tokenizers: %zu / %zu documents\n", docs.size() - mismatched, docs.size());
      }
    }
    auto line = [&](const char* what, double ours, double theirs) {
      if (theirs > 0)
        std::printf("  %-24s HF tokenizers %8.2f MB/s | ktune %8.2f MB/s | ktune/HF %.2fx\n", what, theirs, ours,
                    ours / theirs);
      else
        std::printf("  %-24s ktune %8.2f MB/s (HF tokenizers not measured)\n", what, ours);
    };
    line("single thread", mb / single.wall, hf_single);
    line("single thread, CPU time", mb / single.cpu, hf_single_cpu);
    line("batch", mb / batch.wall, hf_batch);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
