// The attention kernels' choice on the GPU at hand (model/cuda/attention_choice.h): every candidate
// runs at the planned shape, the candidates agree with each other (a kernel that computes something
// else would differ by tens of percent; the bf16 roundings leave ~1%), each has a time, and the pick is
// the fastest that agrees; one that differs or failed is never picked, and with none agreeing the GEMM
// path is. Also the difference the comparison rests on: relative to the larger magnitude, NaN and
// infinities infinite, equal arrays 0.
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_harness.h"
#include "model/cuda/attention_choice.h"

namespace ktune {
namespace {

using cuda::AttentionTrial;
using Kernel = cuda::TrainingSetup::Attention;
using cuda_test::to_bf16;
using cuda_test::to_device;

double difference_of(const std::vector<float>& a, const std::vector<float>& b) {
  const cuda::DeviceBuffer da = to_device(to_bf16(a)), db = to_device(to_bf16(b));
  return cuda::max_relative_difference(da.as<bf16_t>(), db.as<bf16_t>(), int64_t(a.size()));
}

void check_trials(const cpu::AttentionShape& s, const std::vector<Kernel>& expected, const std::string& what,
                  int64_t document_tokens = 0) {
  const std::vector<AttentionTrial> trials = cuda::time_attention_kernels(s, document_tokens, 2);
  CHECK(trials.size() == expected.size()) << what << ": " << trials.size() << " trials";
  if (trials.size() != expected.size()) return;
  double fastest = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < trials.size(); ++i) {
    const AttentionTrial& t = trials[i];
    CHECK(t.kernel == expected[i]) << what << ": trial " << i << " is " << cuda::attention_name(t.kernel);
    CHECK(t.failure.empty()) << what << ": " << cuda::attention_name(t.kernel) << " failed: " << t.failure;
    // bf16 roundings at different places: ~1% apart; the agreement bound is 5%
    CHECK(t.error < 0.03) << what << ": " << cuda::attention_name(t.kernel) << " differs by " << t.error;
    CHECK(t.ms >= 0.0 && std::isfinite(t.ms)) << what << ": " << cuda::attention_name(t.kernel) << " took " << t.ms;
    fastest = std::min(fastest, t.ms);
  }
  const Kernel chosen = cuda::pick_attention(trials);
  for (const AttentionTrial& t : trials) {
    if (t.kernel == chosen) {
      CHECK(t.ms == fastest) << what << ": chose " << cuda::attention_name(chosen);
    }
  }
  const std::string line = cuda::describe_attention_trials({trials, "one layer", document_tokens}, chosen);
  std::printf("%s: %s\n", what.c_str(), line.c_str());  // on a GPU, its times
  CHECK(line.find(std::string("chose ") + cuda::attention_name(chosen)) != std::string::npos) << line;
}

KTUNE_CUDA_TEST(AttentionChoiceTimesTheThreeKernelsAtHeadDim64AndTheyAgree) {
  check_trials(cpu::AttentionShape{2, 80, 4, 2, 64, 0.125f, 0, 0.0f}, {Kernel::kGemm, Kernel::kTensorCore, Kernel::kFlash},
               "D=64 GQA");
}

KTUNE_CUDA_TEST(AttentionChoiceWithASoftCapAndOneKvHead) {
  check_trials(cpu::AttentionShape{1, 70, 2, 1, 128, 0.5f, 0, 2.0f}, {Kernel::kGemm, Kernel::kTensorCore, Kernel::kFlash},
               "D=128 MQA soft-cap 2");
}

// Rows of documents (a padding-free or packed step's): every kernel masks across them and skips what they
// hide by its own rules (the GEMM path by blocks of rows, the others by tiles), and they still agree.
KTUNE_CUDA_TEST(AttentionChoiceOnRowsOfDocuments) {
  check_trials(cpu::AttentionShape{2, 150, 4, 2, 64, 0.125f, 0, 0.0f}, {Kernel::kGemm, Kernel::kTensorCore, Kernel::kFlash},
               "D=64 documents of 40", 40);
  const std::string line = cuda::describe_attention_trials({{AttentionTrial{Kernel::kGemm, 1.0, 0.0, ""}}, "one layer", 40}, Kernel::kGemm);
  CHECK(line.find("(forward + backward of one layer, rows of documents of 40 tokens):") != std::string::npos) << line;
}

KTUNE_CUDA_TEST(AttentionChoiceLeavesTheFusedKernelOutForAHeadSizeItLacks) {
  check_trials(cpu::AttentionShape{2, 40, 2, 2, 48, 0.25f, 0, 0.0f}, {Kernel::kGemm, Kernel::kFlash}, "D=48");
}

KTUNE_CUDA_TEST(AttentionChoicePicksTheFastestThatAgrees) {
  AttentionTrial gemm{Kernel::kGemm, 3.0, 0.01, ""};
  AttentionTrial tc{Kernel::kTensorCore, 1.0, 0.01, ""};
  AttentionTrial flash{Kernel::kFlash, 9.0, 0.01, ""};
  CHECK(cuda::pick_attention({gemm, tc, flash}) == Kernel::kTensorCore);
  AttentionTrial wrong_tc = tc;
  wrong_tc.error = 0.4;  // fastest, but it computes something else
  CHECK(cuda::pick_attention({gemm, wrong_tc, flash}) == Kernel::kGemm);
  const std::string line = cuda::describe_attention_trials({{gemm, wrong_tc, flash}}, Kernel::kGemm);
  CHECK(line.find("tensor_core 1.000 ms (differs by 0.4 from the others: left out)") != std::string::npos) << line;
  AttentionTrial nan_tc = tc;
  nan_tc.error = std::numeric_limits<double>::infinity();  // NaN in its outputs
  const std::string nan_line = cuda::describe_attention_trials({{gemm, nan_tc, flash}}, Kernel::kGemm);
  CHECK(nan_line.find("tensor_core 1.000 ms (differs by inf from the others: left out)") != std::string::npos)
      << nan_line;
  AttentionTrial failed_tc{Kernel::kTensorCore, 0.0, 0.0, "too many resources requested for launch"};
  CHECK(!failed_tc.agrees());
  CHECK(cuda::pick_attention({gemm, failed_tc, flash}) == Kernel::kGemm);
  AttentionTrial failed_flash{Kernel::kFlash, 0.0, 0.0, "out of memory"};
  AttentionTrial lone_gemm = gemm;
  lone_gemm.error = std::numeric_limits<double>::infinity();  // the only one that ran: nothing to compare with
  const std::string lone = cuda::describe_attention_trials({{lone_gemm, failed_tc, failed_flash}}, Kernel::kGemm);
  CHECK(lone.find("gemm 3.000 ms (nothing to compare with: left out), tensor_core failed (too many resources "
                  "requested for launch), flash failed (out of memory); chose gemm (no two kernels agree") !=
        std::string::npos)
      << lone;
  AttentionTrial slow_gemm = gemm;
  slow_gemm.ms = 20.0;
  CHECK(cuda::pick_attention({slow_gemm, failed_tc, flash}) == Kernel::kFlash);
  AttentionTrial gemm_apart = gemm, flash_apart = flash;
  gemm_apart.error = flash_apart.error = 0.5;  // two kernels that disagree: neither is trusted
  CHECK(cuda::pick_attention({gemm_apart, flash_apart}) == Kernel::kGemm);
  const std::string none = cuda::describe_attention_trials({{gemm_apart, flash_apart}}, Kernel::kGemm);
  CHECK(none.find("no two kernels agree") != std::string::npos) << none;
}

// kAuto is a request to the trainer, not a kernel: a decoder built with it refuses (naming the header that
// resolves it), while Decoder::plan plans it as the GEMM path (the larger scratch), and the trial shape is
// the plan's batch and seq_len with the model's heads, scale and soft-cap, no window.
KTUNE_CUDA_TEST(AttentionChoiceAutoIsResolvedBeforeADecoderIsBuilt) {
  cuda::DecoderConfig c;
  c.vocab_size = 96, c.hidden_size = 64, c.num_layers = 2, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 16;
  c.intermediate_size = 128, c.rms_norm_eps = 1e-5f, c.rope_theta = 10000.0f, c.attn_logit_softcap = 30.0f;
  c.sliding_window = {8, 0};
  cuda::TrainingSetup setup;
  setup.batch = 2, setup.seq_len = 24, setup.full_finetune = true;
  setup.attention = Kernel::kAuto;
  std::string refusal;
  try {
    cuda::Decoder refused(c, setup, 1);
  } catch (const Error& e) {
    refusal = e.what();
  }
  CHECK(refusal.find("kAuto") != std::string::npos && refusal.find("attention_choice.h") != std::string::npos)
      << refusal;
  cuda::TrainingSetup gemm = setup;
  gemm.attention = Kernel::kGemm;
  CHECK(cuda::Decoder::plan(c, setup).total() == cuda::Decoder::plan(c, gemm).total());
  const cpu::AttentionShape shape = cuda::attention_trial_shape(c, setup);
  CHECK(shape.B == 2 && shape.T == 24 && shape.Hq == 4 && shape.Hkv == 2 && shape.D == 16 && shape.scale == 0.25f &&
        shape.sliding_window == 0 && shape.softcap == 30.0f);
}

// Windowed layers (Mistral's window shorter than the row, Gemma2's alternate ones) are timed with their
// window: one trial set a distinct window, each kernel's time summed over the layers; a window reaching
// over the whole row counts as none, as the decoder drops it.
KTUNE_CUDA_TEST(AttentionChoiceTimesEachDistinctWindowOfTheLayers) {
  cuda::DecoderConfig c;
  c.vocab_size = 96, c.hidden_size = 128, c.num_layers = 4, c.num_heads = 2, c.num_kv_heads = 1, c.head_dim = 64;
  c.intermediate_size = 128, c.rms_norm_eps = 1e-5f, c.rope_theta = 10000.0f;
  c.sliding_window = {24, 0, 24, 200};  // 200 >= seq_len: none
  cuda::TrainingSetup setup;
  setup.batch = 1, setup.seq_len = 72;
  const std::vector<cuda::AttentionLayerGroup> groups = cuda::attention_layer_groups(c, setup);
  CHECK(groups.size() == 2 && groups[0].window == 0 && groups[0].layers == 2 && groups[1].window == 24 &&
        groups[1].layers == 2);
  const std::string scope = cuda::attention_trials_scope(groups);
  CHECK(scope == "all 4 layers: 2 without, 2 with a window of 24") << scope;
  CHECK(cuda::attention_trials_scope({cuda::AttentionLayerGroup{0, 16}}) == "one layer");
  const cuda::LayerTrials timed = cuda::time_attention_kernels_for_layers(c, setup, 20);
  CHECK(timed.trials.size() == 3);
  CHECK(timed.scope == scope && timed.document_tokens == 20) << timed.scope << ", " << timed.document_tokens;
  for (const AttentionTrial& t : timed.trials) {
    CHECK(t.failure.empty() && t.error < 0.03 && t.ms > 0.0) << cuda::attention_name(t.kernel) << ": " << t.error;
  }
  const std::string line = cuda::describe_attention_trials(timed, cuda::pick_attention(timed.trials));
  std::printf("windows: %s\n", line.c_str());
  CHECK(line.find("(forward + backward of all 4 layers: 2 without, 2 with a window of 24, rows of documents of 20 "
                  "tokens): gemm ") != std::string::npos)
      << line;
}

KTUNE_CUDA_TEST(AttentionChoiceDifferenceIsRelativeToTheLargerMagnitude) {
  CHECK(difference_of({1.0f, -2.0f, 0.5f}, {1.0f, -2.0f, 0.5f}) == 0.0);
  CHECK(difference_of({0.0f, 0.0f}, {0.0f, 0.0f}) == 0.0);
  CHECK(std::fabs(difference_of({1.0f, -4.0f, 0.5f}, {1.0f, -4.0f, 1.5f}) - 0.25) < 1e-6);
  CHECK(std::fabs(difference_of({0.0f, 0.0f}, {0.0f, 2.0f}) - 1.0) < 1e-6);
  CHECK(std::isinf(difference_of({1.0f, std::nanf("")}, {1.0f, 1.0f})));
  CHECK(std::isinf(difference_of({1.0f, 1.0f}, {1.0f, std::numeric_limits<float>::infinity()})));
  std::vector<float> many(100000, 0.25f), other = many;
  other[77777] = 0.5f;  // one element in the middle of a long array, past the first block's reach
  CHECK(std::fabs(difference_of(many, other) - 0.5) < 1e-6);
}

}  // namespace
}  // namespace ktune
