// Which attention kernels a GPU step runs, measured on the GPU it runs on (TrainingSetup::attention =
// kAuto, the recipes' default). Each candidate — the GEMM path (kernels/cuda/attention_gemm.h), the
// fused tensor-core kernel where the head size allows (flash_attention_tc.h) and the tiled kernel
// (attention.h) — runs the forward + backward of one layer at the planned (batch, seq_len, heads,
// head_dim, scale, soft-cap) on the same random bf16 inputs (q and k large enough for scores of
// standard deviation ~2: a peaked softmax, where a wrong scale or a lost key shows; on nearly flat rows
// a 10% scale error moved the outputs by 4%). The candidates' results are compared
// with each other: a candidate whose out, dq, dk or dv differ from every other candidate's by more
// than kAttentionAgreement of the larger magnitude is out, so a kernel that computes something else
// on this GPU (a race, a fragment layout the emulator does not share) is never chosen. Of the rest
// the fastest (the least of `repeats` timed runs, CUDA events) is the choice; when no two agree, the
// GEMM path, with the trials in the report to say so.
// Costs a few hundred ms before training and transient device memory (the inputs, every candidate's
// outputs and scratch: ~0.6 GiB at Llama-3.2-1B, batch 4 x 2048), freed before the decoder's arenas
// are allocated. It deliberately chooses one kernel for every layer (a layer's window changes what the
// kernels skip, so each distinct window is timed, but not a kernel per layer).
#pragma once

#include <string>
#include <vector>

#include "kernels/cuda/attention.h"  // AttentionShape
#include "model/cuda/decoder.h"      // TrainingSetup::Attention

namespace ktune::cuda {

// Two kernels agree when every output differs by at most this fraction of its larger magnitude:
// the paths round P, dS and the outputs to bf16 at different places (0.5-0.7% apart on the tests'
// shapes), while a wrong mask, tile or barrier is off by tens of percent (the fused kernel's
// forward with a 10% larger scale: 46% at head_dim 64, 6.5% under a saturating soft-cap of 2).
inline constexpr double kAttentionAgreement = 0.05;

struct AttentionTrial {
  TrainingSetup::Attention kernel = TrainingSetup::Attention::kGemm;
  double ms = 0;     // the fastest timed forward + backward
  double error = 0;  // the least, over the other candidates, of the largest relative difference
  std::string failure;  // why it did not run on this GPU (a launch it refused), or empty
  bool agrees() const { return failure.empty() && error <= kAttentionAgreement; }
};

// max |a - b| / max(|a|, |b|) over n bf16 device values: 0 when they are equal (all zeros too),
// infinite when either holds a NaN or an infinity.
double max_relative_difference(const bf16_t* a, const bf16_t* b, int64_t n);

// "gemm", "tensor_core", "flash" (KTUNE_CUDA_ATTENTION's words), "auto".
const char* attention_name(TrainingSetup::Attention kernel);

// The candidates for `shape` (the GEMM path, the fused one where its head_dim allows, the tiled
// kernel), each run once to compare and up to `repeats` times to time, on the current device.
// document_tokens > 0 (and < T): every row cut into documents of that many tokens (the last shorter),
// given to each kernel as doc ids with their DocumentBounds, as a packed or padding-free step gives
// them: the kernels skip what the documents mask by different rules, so the documents a run's rows
// hold can change which is fastest. 0: one causal document a row.
std::vector<AttentionTrial> time_attention_kernels(const AttentionShape& shape, int64_t document_tokens = 0,
                                                   int repeats = 3);

// A model's layers as the trials see them: each distinct window (0: none; a window reaching back over
// the whole planned row is none, as the decoder drops it) and how many layers have it, by window.
struct AttentionLayerGroup {
  int64_t window = 0;
  int64_t layers = 0;
};
std::vector<AttentionLayerGroup> attention_layer_groups(const DecoderConfig& config, const TrainingSetup& setup);

// What the trials timed, for describe_attention_trials: "one layer", or "all 26 layers: 13 with a window
// of 4096, 13 without" with several groups.
std::string attention_trials_scope(const std::vector<AttentionLayerGroup>& groups);

// A model's trials and what they timed, as describe_attention_trials says it.
struct LayerTrials {
  std::vector<AttentionTrial> trials;  // one a candidate kernel
  std::string scope = "one layer";     // attention_trials_scope of the layers' groups
  int64_t document_tokens = 0;         // the rows' documents as timed (0: one a row)
};

// The trials for a model's layers: time_attention_kernels at the trial shape with each group's window,
// combined per kernel — its time summed over the model's layers (a group's time times its layers), its
// largest difference over the groups, a failure in any. With one group (no windows, Llama's and Qwen's
// layers) that is one layer's trials as they are. Mistral's windows shorter than the row and Gemma2's
// windowed alternate layers are timed as they run: the GEMM path and the tiled kernels skip a window's
// keys by other rules than the fused one's. document_tokens as time_attention_kernels takes them
// (documents as long as the planned row or longer are none, and the result says 0).
LayerTrials time_attention_kernels_for_layers(const DecoderConfig& config, const TrainingSetup& setup,
                                              int64_t document_tokens);

// The fastest agreeing trial's kernel; kGemm when none agrees.
TrainingSetup::Attention pick_attention(const std::vector<AttentionTrial>& trials);

// One line: what was timed (its scope), the rows' documents, every trial's time and agreement, and the
// choice.
std::string describe_attention_trials(const LayerTrials& timed, TrainingSetup::Attention chosen);

// The shape the trials time for a model and a plan: the planned batch and seq_len, the model's heads,
// head_dim, attention scale and soft-cap, no window.
AttentionShape attention_trial_shape(const DecoderConfig& config, const TrainingSetup& setup);

}  // namespace ktune::cuda
