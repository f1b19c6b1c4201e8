// Times the attention kernels on this GPU and keeps the fastest that agrees (see attention_choice.h).
#include "model/cuda/attention_choice.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/attention_gemm.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/document_bounds.h"
#include "kernels/cuda/flash_attention_tc.h"

namespace ktune::cuda {
namespace {

using Kernel = TrainingSetup::Attention;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;

int blocks_for(int64_t n) { return int(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks)); }

// x[i] = a value in [-range, range) rounded to bf16, a hash of (seed, i): every candidate reads the
// same inputs.
__global__ void fill_uniform_kernel(__nv_bfloat16* x, int64_t n, uint32_t seed, float range) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = (uint32_t(i) ^ uint32_t(i >> 32) * 0x27D4EB2Fu) * 0x9E3779B1u ^ seed;
    h ^= h >> 16, h *= 0x85EBCA6Bu, h ^= h >> 13, h *= 0xC2B2AE35u, h ^= h >> 16;
    x[i] = __float2bfloat16_rn((float(h >> 8) * (2.0f / 16777216.0f) - 1.0f) * range);
  }
}

// out[0] = max |a - b| (infinite where either is NaN), out[1] = max(|a|, |b|), over n values, as the
// bits of non-negative floats (which order as their bits do). out starts at 0.
__global__ void max_difference_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t n, unsigned* out) {
  float difference = 0.0f, magnitude = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    const float d = fabsf(x - y);
    difference = fmaxf(difference, d <= 3.0e38f ? d : INFINITY);  // NaN compares false: infinite
    magnitude = fmaxf(magnitude, fmaxf(fabsf(x), fabsf(y)));
  }
  difference = warp_max(difference);
  magnitude = warp_max(magnitude);
  if ((threadIdx.x & 31) == 0) {
    atomicMax(&out[0], __float_as_uint(difference));
    atomicMax(&out[1], __float_as_uint(magnitude));
  }
}

struct Inputs {
  DeviceBuffer q, k, v, dout;  // (B,T,Hq,D) (B,T,Hkv,D) (B,T,Hkv,D) (B,T,Hq,D) bf16
  // The rows' documents: (B, T) doc ids and their bounds, on the host (the GEMM path's shapes) and on
  // the device (every kernel's masks, the fused and tiled kernels' skipping); empty: none.
  std::vector<int32_t> doc, first_key, last_query;
  DeviceBuffer device_doc, device_first_key, device_last_query;
  const int32_t* doc_ids() const { return doc.empty() ? nullptr : device_doc.as<int32_t>(); }
  DocumentBounds device_bounds() const {
    return doc.empty() ? DocumentBounds{} : DocumentBounds{device_first_key.as<int32_t>(), device_last_query.as<int32_t>()};
  }
  HostDocumentBounds host_bounds() const {
    return doc.empty() ? HostDocumentBounds{} : HostDocumentBounds{first_key.data(), last_query.data()};
  }
};

// Every row of `in` cut into documents of `tokens` tokens (the last one shorter), with their bounds.
void add_documents(Inputs& in, const AttentionShape& s, int64_t tokens) {
  const size_t n = size_t(s.B * s.T);
  in.doc.resize(n), in.first_key.resize(n), in.last_query.resize(n);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < s.T; ++i) in.doc[size_t(b * s.T + i)] = int32_t(i / tokens);
  document_bounds(in.first_key.data(), in.last_query.data(), in.doc.data(), s.B, s.T);
  auto upload = [n](const std::vector<int32_t>& host) {
    DeviceBuffer d(n * sizeof(int32_t));
    d.upload(host.data(), n * sizeof(int32_t));
    return d;
  };
  in.device_doc = upload(in.doc), in.device_first_key = upload(in.first_key), in.device_last_query = upload(in.last_query);
}
struct Outputs {
  DeviceBuffer out, lse, dq, dk, dv;  // (B,T,Hq,D) bf16, (B,Hq,T) f32, (B,T,Hq,D), (B,T,Hkv,D) x 2 bf16
};

int64_t q_elements(const AttentionShape& s) { return s.B * s.T * s.Hq * s.D; }
int64_t kv_elements(const AttentionShape& s) { return s.B * s.T * s.Hkv * s.D; }

DeviceBuffer random_bf16(int64_t n, uint32_t seed, float range) {
  DeviceBuffer b(size_t(n) * sizeof(bf16_t));
  fill_uniform_kernel<<<blocks_for(n), kThreads>>>(b.as<__nv_bfloat16>(), n, seed, range);
  KTUNE_CUDA_CHECK(cudaGetLastError());
  return b;
}

Outputs allocate_outputs(const AttentionShape& s) {
  const size_t q = size_t(q_elements(s)) * sizeof(bf16_t), kv = size_t(kv_elements(s)) * sizeof(bf16_t);
  return Outputs{DeviceBuffer(q), DeviceBuffer(size_t(s.B * s.Hq * s.T) * sizeof(float)), DeviceBuffer(q),
                 DeviceBuffer(kv), DeviceBuffer(kv)};
}

// One candidate's device state besides the inputs and outputs: the GEMM path's cuBLASLt context and
// scores scratch, or the fused / tiled kernels' backward scratch. Allocated for its trial only (the GEMM
// path's scores take 10 B T^2 bytes: at long T that may not fit, and then that candidate alone fails).
struct Scratch {
  std::unique_ptr<GemmContext> gemm;
  DeviceBuffer bytes;
};
Scratch scratch_for(Kernel kernel, const AttentionShape& s) {
  Scratch r;
  if (kernel == Kernel::kGemm) {
    r.gemm = std::make_unique<GemmContext>();
    r.bytes = DeviceBuffer(attention_gemm_scratch_bytes(s));
  } else {
    const int64_t floats = kernel == Kernel::kTensorCore ? flash_attention_tc_backward_scratch_floats(s)
                                                         : attention_backward_scratch_floats(s);
    r.bytes = DeviceBuffer(size_t(floats) * sizeof(float));
  }
  return r;
}

// One forward + backward of `kernel` on `in` into `o`, enqueued on the default stream.
void run_attention(Kernel kernel, const AttentionShape& s, const Inputs& in, Outputs& o, Scratch& scratch) {
  const auto* q = in.q.as<bf16_t>();
  const auto* k = in.k.as<bf16_t>();
  const auto* v = in.v.as<bf16_t>();
  const auto* dout = in.dout.as<bf16_t>();
  auto* out = o.out.as<bf16_t>();
  auto* lse = o.lse.as<float>();
  const int32_t* doc = in.doc_ids();
  switch (kernel) {
    case Kernel::kGemm:
      attention_gemm_forward(*scratch.gemm, out, lse, q, k, v, s, scratch.bytes.data(), nullptr, doc, in.host_bounds());
      attention_gemm_backward(*scratch.gemm, o.dq.as<bf16_t>(), o.dk.as<bf16_t>(), o.dv.as<bf16_t>(), dout, q, k, v, out,
                              lse, s, scratch.bytes.data(), nullptr, doc, in.host_bounds());
      return;
    case Kernel::kTensorCore:
      flash_attention_tc_forward(out, lse, q, k, v, s, nullptr, doc, in.device_bounds());
      flash_attention_tc_backward(o.dq.as<bf16_t>(), o.dk.as<bf16_t>(), o.dv.as<bf16_t>(), dout, q, k, v, out, lse, s,
                                  scratch.bytes.as<float>(), nullptr, doc, in.device_bounds());
      return;
    case Kernel::kFlash:
      attention_forward(out, lse, q, k, v, doc, in.device_bounds(), s);
      attention_backward(o.dq.as<bf16_t>(), o.dk.as<bf16_t>(), o.dv.as<bf16_t>(), dout, q, k, v, out, lse, doc,
                         in.device_bounds(), s, scratch.bytes.as<float>());
      return;
    case Kernel::kAuto:
      break;
  }
  throw Error("attention choice", "kAuto is not a kernel");
}

// Device time of fn's work on the default stream, in ms (CUDA events).
template <typename Fn>
double device_ms(Fn&& fn) {
  cudaEvent_t start = nullptr, stop = nullptr;
  KTUNE_CUDA_CHECK(cudaEventCreate(&start));
  KTUNE_CUDA_CHECK(cudaEventCreate(&stop));
  float ms = 0.0f;
  try {
    KTUNE_CUDA_CHECK(cudaEventRecord(start));
    fn();
    KTUNE_CUDA_CHECK(cudaEventRecord(stop));
    KTUNE_CUDA_CHECK(cudaEventSynchronize(stop));
    KTUNE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms);
}

// Times one candidate into t.ms (or says why it failed in t.failure): its scratch allocated, a first
// run (its outputs are compared afterwards; it also warms up, cuBLASLt's plans among it), then up to
// `repeats` timed runs, the least kept. A candidate whose first run took over 3x `best` (the fastest so
// far) is timed no further: it cannot win.
void time_candidate(AttentionTrial& t, const AttentionShape& s, const Inputs& in, Outputs& o, int repeats, double best) {
  try {  // a kernel this GPU refuses (resources, shared memory, memory) is out, not the end of the run
    Scratch scratch = scratch_for(t.kernel, s);
    t.ms = device_ms([&] { run_attention(t.kernel, s, in, o, scratch); });
    if (t.ms > 3.0 * best) return;
    t.ms = std::numeric_limits<double>::infinity();
    for (int r = 0; r < repeats; ++r) t.ms = std::min(t.ms, device_ms([&] { run_attention(t.kernel, s, in, o, scratch); }));
  } catch (const std::exception& e) {
    t.failure = e.what();
    (void)cudaGetLastError();  // clears a launch's error (a refused configuration); a fault stays:
    const cudaError_t after = cudaDeviceSynchronize();
    if (after != cudaSuccess)  // an illegal address or the like poisons the context: nothing more runs here
      throw Error("attention choice", std::string("the ") + attention_name(t.kernel) + " kernel's trial failed (" +
                                          t.failure + ") and left the GPU unusable for this process (" +
                                          cudaGetErrorString(after) + ")");
  }
}

// The largest relative difference of out, dq, dk, dv between two candidates' outputs.
double outputs_difference(const Outputs& a, const Outputs& b, const AttentionShape& s) {
  const int64_t nq = q_elements(s), nkv = kv_elements(s);
  auto of = [](const DeviceBuffer& x, const DeviceBuffer& y, int64_t n) {
    return max_relative_difference(x.as<bf16_t>(), y.as<bf16_t>(), n);
  };
  return std::max({of(a.out, b.out, nq), of(a.dq, b.dq, nq), of(a.dk, b.dk, nkv), of(a.dv, b.dv, nkv)});
}

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

}  // namespace

double max_relative_difference(const bf16_t* a, const bf16_t* b, int64_t n) {
  DeviceBuffer bits(2 * sizeof(unsigned));
  bits.zero();
  if (n > 0) {
    max_difference_kernel<<<blocks_for(n), kThreads>>>(reinterpret_cast<const __nv_bfloat16*>(a),
                                                      reinterpret_cast<const __nv_bfloat16*>(b), n, bits.as<unsigned>());
    KTUNE_CUDA_CHECK(cudaGetLastError());
  }
  unsigned host[2] = {0, 0};
  bits.download(host, sizeof host);
  float difference = 0.0f, magnitude = 0.0f;
  std::memcpy(&difference, &host[0], sizeof difference);
  std::memcpy(&magnitude, &host[1], sizeof magnitude);
  if (difference == 0.0f) return 0.0;
  if (std::isinf(difference)) return std::numeric_limits<double>::infinity();
  return magnitude > 0.0f ? double(difference) / double(magnitude) : std::numeric_limits<double>::infinity();
}

const char* attention_name(TrainingSetup::Attention kernel) {
  switch (kernel) {
    case Kernel::kGemm: return "gemm";
    case Kernel::kTensorCore: return "tensor_core";
    case Kernel::kFlash: return "flash";
    case Kernel::kAuto: return "auto";
  }
  return "?";
}

AttentionShape attention_trial_shape(const DecoderConfig& config, const TrainingSetup& setup) {
  const float scale = config.attention_scale > 0 ? config.attention_scale : 1.0f / std::sqrt(float(config.head_dim));
  return AttentionShape{setup.batch, setup.seq_len, config.num_heads, config.num_kv_heads, config.head_dim, scale, 0,
                        config.attn_logit_softcap};
}

std::vector<AttentionTrial> time_attention_kernels(const AttentionShape& s, int64_t document_tokens, int repeats) {
  check(repeats >= 1, "attention choice", "repeats must be >= 1, got " + std::to_string(repeats));
  check(s.B > 0 && s.T > 0 && s.Hq > 0 && s.Hkv > 0 && s.D > 0 && s.Hq % s.Hkv == 0, "attention choice",
        "a shape with positive sizes and Hq a multiple of Hkv");
  std::vector<AttentionTrial> trials;
  for (Kernel k : {Kernel::kGemm, Kernel::kTensorCore, Kernel::kFlash})
    if (k != Kernel::kTensorCore || flash_attention_tc_supports(s)) trials.push_back(AttentionTrial{k});
  // q, k in [-r, r) with r^2 / 3 = 2 / (scale sqrt(D)): scores of standard deviation ~2, so that each
  // row's softmax is peaked (uniform inputs in [-1, 1) leave it nearly flat, where a wrong scale or a
  // lost key hardly shows); v, dout in [-1, 1).
  const float qk_range = std::sqrt(6.0f / (s.scale * std::sqrt(float(s.D))));
  Inputs in{random_bf16(q_elements(s), 1, qk_range), random_bf16(kv_elements(s), 2, qk_range),
            random_bf16(kv_elements(s), 3, 1.0f), random_bf16(q_elements(s), 4, 1.0f)};
  if (document_tokens > 0 && document_tokens < s.T) add_documents(in, s, document_tokens);
  std::vector<Outputs> outputs;
  for (size_t i = 0; i < trials.size(); ++i) outputs.push_back(allocate_outputs(s));
  double best = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < trials.size(); ++i) {
    time_candidate(trials[i], s, in, outputs[i], repeats, best);
    if (trials[i].failure.empty()) best = std::min(best, trials[i].ms);
  }
  for (size_t i = 0; i < trials.size(); ++i) {
    trials[i].error = std::numeric_limits<double>::infinity();
    if (!trials[i].failure.empty()) continue;
    for (size_t j = 0; j < trials.size(); ++j)
      if (j != i && trials[j].failure.empty())
        trials[i].error = std::min(trials[i].error, outputs_difference(outputs[i], outputs[j], s));
  }
  synchronize();
  return trials;
}

TrainingSetup::Attention pick_attention(const std::vector<AttentionTrial>& trials) {
  const AttentionTrial* best = nullptr;
  for (const AttentionTrial& t : trials)
    if (t.agrees() && (best == nullptr || t.ms < best->ms)) best = &t;
  return best ? best->kernel : Kernel::kGemm;
}

std::vector<AttentionLayerGroup> attention_layer_groups(const DecoderConfig& config, const TrainingSetup& setup) {
  std::map<int64_t, int64_t> layers_by_window;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const int64_t window = config.window(l) >= setup.seq_len ? 0 : config.window(l);  // as the decoder drops it
    ++layers_by_window[window];
  }
  std::vector<AttentionLayerGroup> groups;
  for (const auto& [window, layers] : layers_by_window) groups.push_back(AttentionLayerGroup{window, layers});
  return groups;
}

LayerTrials time_attention_kernels_for_layers(const DecoderConfig& config, const TrainingSetup& setup,
                                              int64_t document_tokens) {
  const std::vector<AttentionLayerGroup> groups = attention_layer_groups(config, setup);
  AttentionShape shape = attention_trial_shape(config, setup);
  LayerTrials timed;
  timed.scope = attention_trials_scope(groups);
  timed.document_tokens = document_tokens > 0 && document_tokens < shape.T ? document_tokens : 0;
  std::vector<AttentionTrial>& combined = timed.trials;
  for (const AttentionLayerGroup& g : groups) {
    shape.sliding_window = g.window;
    std::vector<AttentionTrial> trials = time_attention_kernels(shape, timed.document_tokens);
    if (groups.size() == 1) {
      combined = std::move(trials);
      break;
    }
    if (combined.empty()) {
      combined = trials;
      for (AttentionTrial& t : combined) t.ms = 0.0, t.error = 0.0;
    }
    for (size_t i = 0; i < trials.size(); ++i) {  // the same kernels in the same order: they depend on D alone
      AttentionTrial& c = combined[i];
      c.ms += trials[i].ms * double(g.layers);
      c.error = std::max(c.error, trials[i].error);
      if (c.failure.empty() && !trials[i].failure.empty())
        c.failure = trials[i].failure + (g.window ? " (window " + std::to_string(g.window) + ")" : "");
    }
  }
  return timed;
}

std::string attention_trials_scope(const std::vector<AttentionLayerGroup>& groups) {
  if (groups.size() <= 1) return "one layer";
  int64_t layers = 0;
  std::string parts;
  for (const AttentionLayerGroup& g : groups) {
    layers += g.layers;
    parts += (parts.empty() ? "" : ", ") + std::to_string(g.layers) +
             (g.window ? " with a window of " + std::to_string(g.window) : std::string(" without"));
  }
  return "all " + std::to_string(layers) + " layers: " + parts;
}

std::string describe_attention_trials(const LayerTrials& timed, TrainingSetup::Attention chosen) {
  const std::vector<AttentionTrial>& trials = timed.trials;
  std::string text = "attention kernels timed (forward + backward of " + timed.scope;
  if (timed.document_tokens > 0) text += ", rows of documents of " + std::to_string(timed.document_tokens) + " tokens";
  text += "):";
  bool any_agrees = false;
  const auto ran = std::count_if(trials.begin(), trials.end(), [](const AttentionTrial& t) { return t.failure.empty(); });
  for (size_t i = 0; i < trials.size(); ++i) {
    const AttentionTrial& t = trials[i];
    text += std::string(i ? "," : "") + " " + attention_name(t.kernel);
    if (!t.failure.empty()) {
      text += " failed (" + t.failure + ")";
      continue;
    }
    text += format(" %.3f ms", t.ms);
    text += t.agrees() ? format(" (agrees to %.1e)", t.error)
                       : ran < 2 ? std::string(" (nothing to compare with: left out)")
                                             : format(" (differs by %.3g from the others: left out)", t.error);
    any_agrees |= t.agrees();
  }
  text += std::string("; chose ") + attention_name(chosen);
  if (!any_agrees) text += " (no two kernels agree on this GPU: the GEMM path runs; please report this)";
  return text;
}

}  // namespace ktune::cuda
