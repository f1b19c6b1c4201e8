// Times full training steps of a Llama-shaped decoder (forward, backward, AdamW) and prints, per
// batch size and mode: tokens/s, achieved GFLOP/s (useful FLOPs: 6 N per token for full fine-tuning,
// 4 N with the base frozen, plus causal attention), the oneDNN f32 GEMM rate measured in the same run
// on the step's own (B*T, I, C) shape, their ratio, and, when given PyTorch's figures, the speed-up.
// Modes: "full" trains every parameter; "frozen" trains only the RMSNorm weights, so that
// activation gradients flow through every layer with no weight-gradient GEMMs (what LoRA needs,
// without the adapters' own small GEMMs).
// It deliberately measures steps of one fixed batch (data loading is not timed) and no bf16.
//
// usage: ktune_bench_train_step [--batch 1,2,4] [--seq 256] [--steps 2] [--modes full,frozen]
//                               [--peer torch.json] [--layers 12 --hidden 768 --heads 12
//                                --intermediate 2048 --vocab 32000]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/parallel.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/gemm.h"
#include "model/decoder.h"

using namespace ktune;
using namespace ktune::model;

namespace {

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

std::vector<std::string> parse_names(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> batches{1, 2, 4};
  std::vector<std::string> modes{"full", "frozen"};
  int64_t T = 256, steps = 2, layers = 12, hidden = 768, heads = 12, intermediate = 2048, vocab = 32000;
  std::string peer_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--batch") batches = parse_list(v);
    else if (k == "--seq") T = std::stoll(v);
    else if (k == "--steps") steps = std::stoll(v);
    else if (k == "--modes") modes = parse_names(v);
    else if (k == "--peer") peer_path = v;
    else if (k == "--layers") layers = std::stoll(v);
    else if (k == "--hidden") hidden = std::stoll(v);
    else if (k == "--heads") heads = std::stoll(v);
    else if (k == "--intermediate") intermediate = std::stoll(v);
    else if (k == "--vocab") vocab = std::stoll(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  nlohmann::json peer;
  if (!peer_path.empty()) {
    std::ifstream in(peer_path);
    if (in) peer = nlohmann::json::parse(in, nullptr, false);
  }
  set_log_level(LogLevel::Warn);

  ModelConfig config = ModelConfig::llama_like(vocab, hidden, layers, heads, heads, intermediate);
  Decoder model(config, 1);
  const int64_t C = hidden, I = intermediate, QD = config.q_dim(), KD = config.kv_dim();
  const double matmul_params = double(layers) * double(C * QD + 2 * C * KD + QD * C + 3 * C * I) + double(vocab) * C;
  std::printf("train_step: llama-shaped %.1fM parameters (L=%lld C=%lld H=%lld I=%lld V=%lld), T=%lld, f32, "
              "%d threads, AdamW\n",
              double(config.num_parameters()) / 1e6, (long long)layers, (long long)C, (long long)heads,
              (long long)I, (long long)vocab, (long long)T, num_threads());

  std::vector<std::vector<float>> adam_m, adam_v;
  for (const std::string& mode : modes) {
    const bool full = mode == "full";
    model.set_trainable([&](const std::string& name) { return full || name.find("norm") != std::string::npos; });
    std::vector<Parameter*> trainable;
    adam_m.clear();
    adam_v.clear();
    for (Parameter* p : model.parameters())
      if (p->trainable) {
        trainable.push_back(p);
        adam_m.emplace_back(size_t(p->value.numel()), 0.0f);
        adam_v.emplace_back(size_t(p->value.numel()), 0.0f);
      }
    for (int64_t B : batches) {
      const int64_t N = B * T;
      std::vector<int32_t> tokens(static_cast<size_t>(N)), labels(static_cast<size_t>(N));
      uint64_t s = 12345;
      for (int64_t i = 0; i < N; ++i) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tokens[size_t(i)] = int32_t((s >> 33) % uint64_t(vocab));
      }
      for (int64_t i = 0; i < N; ++i) labels[size_t(i)] = (i + 1) % T == 0 ? -100 : tokens[size_t(i + 1)];
      Batch batch{tokens.data(), labels.data(), nullptr, nullptr, B, T};
      cpu::AdamWStep opt{1e-5f};
      opt.weight_decay = 0.01f;
      int64_t step = 0;
      auto train_step = [&]() {
        model.zero_grad();
        LossResult r = model.forward_backward(batch, 1.0f);
        opt.step = ++step;
        for (size_t i = 0; i < trainable.size(); ++i) {
          Parameter* p = trainable[i];
          cpu::adamw_step(p->value.f32(), p->grad.f32(), adam_m[i].data(), adam_v[i].data(), p->value.numel(), opt);
        }
        return r;
      };
      LossResult first = train_step();  // warm-up: plans the arena, creates the GEMM primitives
      // The ceiling is measured just before and just after the timed steps and averaged, since
      // these machines are shared and their speed drifts.
      const double gemm_before = cpu::measure_gemm_gflops(N, I, C, 0.5);
      double t0 = now_s();
      for (int64_t i = 0; i < steps; ++i) train_step();
      double dt = (now_s() - t0) / double(steps);
      const double gemm = 0.5 * (gemm_before + cpu::measure_gemm_gflops(N, I, C, 0.5));
      const double tokens_per_s = double(N) / dt;
      const double attention = 6.0 * double(layers) * double(T) * double(QD);  // causal, fwd + bwd, per token
      const double flops_per_token = (full ? 6.0 : 4.0) * matmul_params + attention;
      const double gflops = flops_per_token * tokens_per_s / 1e9;
      std::printf("train_step %-6s B=%lld T=%lld: %.1f tokens/s, %.3f s/step, %.1f GFLOP/s achieved, oneDNN GEMM "
                  "%.1f GFLOP/s (M=%lld N=%lld K=%lld) -> %.0f%% of GEMM (target >= 60%%)  [loss %.3f, arena %.1f MiB]\n",
                  mode.c_str(), (long long)B, (long long)T, tokens_per_s, dt, gflops, gemm, (long long)N, (long long)I,
                  (long long)C, 100.0 * gflops / gemm, first.loss_sum / double(first.n_valid),
                  double(model.activation_arena_capacity()) / (1 << 20));
      std::string key = std::to_string(B);
      if (peer.is_object() && peer.contains(mode) && peer[mode].contains(key)) {
        double peer_tps = peer[mode][key].get<double>();
        // No step beats the GEMM rate, so ktune/PyTorch <= 1 / (PyTorch's share of it): a 3x lead
        // needs PyTorch below 33% of the ceiling. Print its share, so the ratio can be read against it.
        const double peer_share = 100.0 * peer_tps * flops_per_token / 1e9 / gemm;
        std::printf("train_step %-6s B=%lld T=%lld: PyTorch eager %.1f tokens/s (%.0f%% of GEMM), ktune %.1f tokens/s "
                    "-> %.2fx (target >= 3x; the most any step could reach here is %.2fx)\n",
                    mode.c_str(), (long long)B, (long long)T, peer_tps, peer_share, tokens_per_s, tokens_per_s / peer_tps,
                    100.0 / peer_share);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}
