// One fine-tuning loop for the four recipes (see finetune_recipe.h). Read setup() then train().
#include "train/finetune_recipe.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "data/data_loader.h"
#include "data/dataset_builders.h"
#include "data/fixed_shape_batch.h"
#include "data/padding_free.h"
#include "io/safetensors.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nf4.h"
#include "model/adapters/frozen_nf4_adapter.h"
#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"
#include "text/chat_format.h"
#include "train/checkpointer.h"
#include "train/cuda_trainer.h"
#include "train/device_selection.h"
#include "train/known_models.h"
#include "train/lr_scheduler.h"
#include "train/memory_stats.h"
#include "train/metric_logger.h"
#include "train/trainer_status.h"
#include "train/profiler.h"
#include "core/trace_spans.h"
#include "train/optimizer.h"
#include "train/progress_bar.h"
#include "train/prompt_templates.h"
#include "train/sharded_data_parallel.h"
#include "train/weights_fingerprint.h"

namespace fs = std::filesystem;

namespace ktune::train {

namespace {

ChatFormatKind chat_format_for(const TokenizerConfig& t, const Tokenizer& tokenizer) {
  if (t.family == "llama3" || t.family == "llama3_1" || t.family == "llama3_2" || t.family == "llama3_3")
    return ChatFormatKind::kLlama3;
  if (t.family == "qwen2_5" || t.family == "qwen2") return ChatFormatKind::kChatML;
  if (t.family == "gemma" || t.family == "gemma2") return ChatFormatKind::kGemma;
  if (t.family == "mistral") return ChatFormatKind::kMistral;
  return detect_chat_format(tokenizer);
}

// HuggingFaceModelTokenizer's format: the model's own chat template, from tokenizer_config_path
// (or the chat_template.jinja beside it).
std::unique_ptr<ChatFormat> template_chat_format(const TokenizerConfig& t, const std::string& tokenizer_config_path,
                                                 const Tokenizer& tokenizer, int64_t max_seq_len, bool log) {
  if (tokenizer_config_path.empty())
    throw Error("tokenizer.tokenizer_config_json_path",
                "not set, and there is no tokenizer_config.json beside " + t.path + " to read the chat template from");
  std::optional<HfChatTemplate> chat = HfChatTemplate::from_tokenizer_config(tokenizer_config_path);
  if (!chat)
    throw Error(tokenizer_config_path, "has no chat_template (nor is a chat_template.jinja beside it): " + t.component +
                                           " formats conversations with the model's own template; use the model "
                                           "family's tokenizer builder (or ktune.models.hf_tokenizer) instead");
  if (log) log_info("tokenizer: conversations through the chat template of " + chat->origin());
  const std::optional<int32_t> eos = chat->eos_id(tokenizer, t.generation_config_path);
  return std::make_unique<ChatFormat>(tokenizer, std::move(*chat), eos, max_seq_len,
                                      t.truncation_type == "left" ? Truncation::kLeft : Truncation::kRight);
}

// How unpacked batches reach the model (data/padding_free.h; the loss and gradients are the same):
// as one row of all their samples' tokens (the default: no padding left; attention stays inside
// each sample and costs Σ L² as padded), re-laid as rows of at most their T tokens (some padding
// left where samples do not fill rows), or padded as collated. The GPU step, planned for at most
// (batch_size, its longest sample), takes rows of at most T: one row would be longer than its plan.
// env KTUNE_PADDING_FREE = 1 or one_row (default; rows on a GPU), rows, 0.
enum class PaddingFree { kOneRow, kRowsOfT, kOff };

// The value of env `name`, one of `choices` (unset or empty: the first, the default); anything else
// throws an Error naming the variable, its value and `expected`.
std::string env_choice(const char* name, const std::vector<std::string>& choices, const std::string& expected) {
  const char* v = std::getenv(name);
  const std::string mode = v && *v ? v : choices.front();
  if (std::find(choices.begin(), choices.end(), mode) == choices.end())
    throw Error(std::string("env ") + name, "is '" + mode + "'; expected " + expected);
  return mode;
}

PaddingFree padding_free_mode() {
  const std::string mode =
      env_choice("KTUNE_PADDING_FREE", {"1", "one_row", "rows", "0"},
                 "1 or one_row (the default: each batch as one row), rows (rows of at most the padded length) "
                 "or 0 (keep the padding)");
  return mode == "rows" ? PaddingFree::kRowsOfT : mode == "0" ? PaddingFree::kOff : PaddingFree::kOneRow;
}

// Readies a loader batch for the model, in place: labels shifted per row (torchtune's shift,
// before anything joins rows), then an unpacked batch re-laid without its padding as `mode` says.
// Packed and re-laid batches keep their samples apart by doc ids.
model::Batch model_batch(Batch& batch, bool packed, PaddingFree mode) {
  shift_labels(batch);
  const bool relay = !packed && mode != PaddingFree::kOff;
  if (relay) {
    const int64_t max_row_len = mode == PaddingFree::kOneRow ? batch.batch_size * batch.seq_len : batch.seq_len;
    batch = remove_padding(batch, max_row_len);
  }
  return {batch.tokens.data(), batch.labels.data(), batch.positions.data(),
          packed || relay ? batch.doc_ids.data() : nullptr, batch.batch_size, batch.seq_len};
}

// The distributed recipes shard (FSDP) unless KTUNE_DATA_PARALLEL=replicate asks for the DDP
// baseline (benchmarks compare the two); single-device recipes never shard. KTUNE_DATA_PARALLEL=zero2
// shards too, but a GPU full fine-tune then keeps its layers' weights whole on every GPU (ZeRO-2, to
// compare against the default ZeRO-3); the CPU engine shards as with shard.
std::string data_parallel_mode() {
  return env_choice("KTUNE_DATA_PARALLEL", {"shard", "replicate", "zero2"},
                    "shard (the default), zero2 or replicate");
}

bool shard_parameters(const RecipeSpec& recipe) {
  return recipe.distributed && data_parallel_mode() != "replicate";
}

// Whether a sharded GPU run shards its layers' weights too (ZeRO-3) or keeps them whole on every GPU
// (ZeRO-2). fsdp_reshard_after_forward=False asks FSDP to keep every layer gathered from its forward
// to its backward: at the step's peak all the layers' weights are whole on every GPU, which is what
// ZeRO-2 holds throughout, with one all-gather of the updated values an optimizer step instead of
// one a micro-batch. So it selects ZeRO-2, as KTUNE_DATA_PARALLEL=zero2 does.
bool cuda_shards_layer_weights(const RecipeConfig& cfg) {
  return data_parallel_mode() != "zero2" && cfg.fsdp_reshard_after_forward;
}

// ZeRO-3's prefetch (cuda::TrainingSetup::prefetch_weights): env KTUNE_ZERO3_PREFETCH = 1 (the
// default: the next layer's weights gathered into a second slot while a layer computes, as FSDP does)
// or 0 (one slot, each layer gathered as it is about to compute: one layer's weights less on every
// GPU, the gathers no longer overlapped with the compute).
bool cuda_prefetches_layer_weights() {
  return env_choice("KTUNE_ZERO3_PREFETCH", {"1", "0"}, "1 (the default) or 0") == "1";
}

// The GPU step's attention kernels (cuda::TrainingSetup::Attention): env KTUNE_CUDA_ATTENTION = auto
// (the default: each kernel timed on the GPU at the planned shape before training, the fastest that
// agrees with the others chosen, model/cuda/attention_choice.h), gemm (cuBLASLt GEMMs over one head's
// scores), tensor_core (the fused FlashAttention-2 on the tensor cores, head_dim 64/128) or flash
// (tiled, on the CUDA cores).
cuda::TrainingSetup::Attention cuda_attention_mode() {
  const std::string mode = env_choice("KTUNE_CUDA_ATTENTION", {"auto", "gemm", "tensor_core", "flash"},
                                      "auto (the default), gemm, tensor_core or flash");
  return mode == "auto"          ? cuda::TrainingSetup::Attention::kAuto
         : mode == "gemm"        ? cuda::TrainingSetup::Attention::kGemm
         : mode == "tensor_core" ? cuda::TrainingSetup::Attention::kTensorCore
                                 : cuda::TrainingSetup::Attention::kFlash;
}

// QLoRA's NF4 GEMMs on the GPU (cuda::TrainingSetup::nf4_fused_gemm): env KTUNE_CUDA_NF4_GEMM =
// dequantize (the default: W dequantised into bf16 scratch, then cuBLASLt) or fused (the GEMM that
// dequantises W tile by tile, kernels/cuda/nf4_gemm.h). Until a GPU has measured them, the user's.
bool cuda_nf4_fused_gemm() {
  return env_choice("KTUNE_CUDA_NF4_GEMM", {"dequantize", "fused"}, "dequantize (the default) or fused") == "fused";
}

// The samples' mean length in tokens, rounded (at least 1).
int64_t mean_sample(const TokenizedDataset& dataset) {
  double total = 0.0;
  for (int64_t i = 0; i < dataset.size(); ++i) total += double(dataset.length(i));
  return dataset.size() > 0 ? std::max<int64_t>(1, std::llround(total / double(dataset.size()))) : 1;
}

int64_t longest_sample(const TokenizedDataset& dataset) {
  int64_t longest = 1;
  for (int64_t i = 0; i < dataset.size(); ++i) longest = std::max(longest, dataset.length(i));
  return longest;
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f MiB", double(bytes) / (1 << 20));
  return text;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

class FinetuneRecipe {
 public:
  FinetuneRecipe(const RecipeConfig& config, const RecipeSpec& recipe, dist::ProcessGroup& group,
                 const WorkerDevices& devices)
      : cfg_(config), recipe_(recipe), group_(group), devices_(devices), rank0_(group.rank() == 0) {}

  void setup();
  void train();

 private:
  // seed=null: every rank takes the seed rank 0 drew (torchtune's set_seed broadcasts it), so that
  // the ranks shuffle alike and seed their adapters alike.
  uint64_t agreed_seed() const;
  void setup_data();
  void check_rows_fit_positions(const model::ModelConfig& mc) const;
  void warn_on_other_model_type(const model::ModelConfig& mc) const;
  void record_config() const;
  // Tokenizes every dataset of `configs` into one; says whether any is packed / splits across packs.
  std::shared_ptr<TokenizedDataset> build_datasets(const std::vector<DatasetConfig>& configs, bool* packed, bool* split);
  // on_gpu: device=cuda with a GPU, where the GPU step (gpu_) runs the steps and optimizer_ and
  // sharded_ stay empty.
  void setup_model(bool on_gpu);
  // The CPU engine's training state: sharded (FSDP) or replicated parameters and the AdamW optimizer.
  void setup_cpu_training(DType storage, int64_t trainable_bytes);
  // device=cuda on a GPU: the GPU step (cuda_trainer.h), planned for (batch_size, gpu_seq_len_), and
  // an NCCL group over the workers' GPUs for the gradients (and, sharded, the AdamW shards' gathers).
  // The host model then keeps only what rank 0's saves read (release_host_values).
  void setup_gpu_training();
  // Once the GPU step holds every value: rank 0 keeps the trainable values (a save downloads into
  // them) and the frozen base a merged checkpoint is made of (not under save_adapter_weights_only;
  // QLoRA's NF4 bases in its adapters alike); the other ranks keep none. Logs what each rank's host
  // model then holds.
  void release_host_values();
  // Rank 0, before the first step: whether output_dir's filesystem has room for a checkpoint (an
  // Error naming the sizes if not: the first save would fail after the epoch's training) and for the
  // saves this run plans (a warning if not). Env KTUNE_SKIP_SPACE_CHECK=1 makes the error a warning.
  void check_checkpoint_space() const;
  // The saves the rest of the run makes: one a remaining epoch, and one every save_every_n_steps
  // steps that does not end an epoch.
  int64_t planned_saves() const;
  // The dtype of the merged model's files: the run's (bf16, or f32).
  DType saved_weights_dtype() const { return cfg_.dtype == TrainDtype::BF16 ? DType::BF16 : DType::F32; }
  // DoRA over several ranks (LoraOptions::dora_magnitudes_later): each rank makes the magnitudes of
  // every world-th adapter and the ranks sum them.
  void share_dora_magnitudes();
  // One optimizer step (gradient_accumulation_steps micro-batches), on either engine.
  struct StepOutcome {
    double loss = 0, tokens = 0, lr = 0;
    std::optional<double> grad_norm;
  };
  StepOutcome cpu_step();
  StepOutcome gpu_step();
  // A shifted batch laid out for the GPU step: (batch_size, its longest row rounded up to a multiple
  // of kGpuSeqLenMultiple, at most gpu_seq_len_), or padding-free (unless KTUNE_PADDING_FREE=0) its
  // samples re-laid into the fewest such rows first-fit finds, each sample a document.
  // packed: a batch of the packed loader (train or val), laid out with its positions and doc ids.
  FixedShapeBatch gpu_batch(const Batch& shifted, bool packed) const;
  // The next training batch, its positions counted (padded, real) for log_padding_skipped.
  Batch next_training_batch();
  // The LoRA dropout key of micro-batch `micro` of the coming step (both engines draw by it).
  uint64_t dropout_key(int micro) const { return uint64_t(global_step_) * 1000003u + uint64_t(micro); }
  AdamWSettings adamw_settings() const {
    return {cfg_.optimizer.lr, cfg_.optimizer.beta1, cfg_.optimizer.beta2, cfg_.optimizer.eps,
            cfg_.optimizer.weight_decay};
  }
  // The learning rate of the next step; throws when the loss is not finite (before any update).
  double next_lr(double loss) const;
  double lr_at(int64_t step) const;  // the lr of optimizer step `step` (0-based), the schedule's
  int64_t optimizer_steps() const { return gpu_ ? gpu_->optimizer_steps() : optimizer_->steps(); }
  // dataset_val: the token-mean loss over the whole validation set, every rank its share, no
  // gradients; logged as val_loss.
  void validate(int64_t epoch);
  void resume();
  void warn_of_earlier_checkpoints() const;
  void warn_of_changed_length(const nlohmann::json& state, const std::string& checkpoint) const;
  void save(const std::string& name, int64_t next_epoch, int64_t step_in_epoch);
  void check_resumed_trainable(const std::map<std::string, Tensor>& saved, const std::string& dir) const;
  // A full fine-tune's trained values from the GPUs or the CPU shards, unit by unit, to `sink` (none:
  // this rank's part in the gathers only); collective.
  void stream_trained_values(const io::TensorSink& sink);
  void all_reduce_gradients();
  // The positions the training steps computed against those of the padded batches, all ranks.
  void log_padding_skipped();

  const RecipeConfig& cfg_;
  const RecipeSpec& recipe_;
  dist::ProcessGroup& group_;
  WorkerDevices devices_;
  bool rank0_;

  uint64_t seed_ = 0;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatFormat> format_;
  std::shared_ptr<TokenizedDataset> dataset_;
  std::unique_ptr<DataLoader> loader_;
  std::unique_ptr<DataLoader> val_loader_;  // dataset_val, when given
  bool val_packed_ = false;
  PaddingFree padding_free_ = PaddingFree::kOneRow;
  // Unpacked: the positions of this run's training batches as padded, their samples' tokens, and the
  // positions the model computed (this rank).
  int64_t positions_padded_ = 0, positions_real_ = 0, positions_computed_ = 0;
  std::unique_ptr<HfCheckpointer> checkpointer_;
  std::unique_ptr<model::Decoder> model_;
  std::vector<std::shared_ptr<model::LoraAdapter>> adapters_;
  // QLoRA on Llama, Mistral, Gemma 2: the layer projections without LoRA, their bases NF4 too (torchtune's)
  std::vector<std::shared_ptr<model::FrozenNf4Adapter>> frozen_nf4_;
  std::optional<AdapterDescription> adapter_description_;
  std::vector<model::Parameter*> trainable_;
  std::vector<io::TensorSpec> trainable_specs_;  // their names, dtypes and shapes, as a save plans them
  std::unique_ptr<ShardedDataParallel> sharded_;  // distributed recipes: FSDP over group_
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<dist::ProcessGroup> nccl_;  // distributed GPU runs: the GPUs' group (outlives gpu_)
  std::unique_ptr<CudaTrainer> gpu_;
  int64_t gpu_seq_len_ = 0;                   // the GPU step's planned T: the longest sample (train or val)
  int64_t gpu_document_tokens_ = 0;           // a training row's typical document (CudaStepPlan's), 0: one a row
  std::optional<CosineWithWarmup> schedule_;
  std::unique_ptr<MetricLogger> metrics_;
  std::unique_ptr<TrainerStatusReporter> status_;  // rank 0, where KUBEFLOW_TRAINER_SERVER_URL is set
  std::unique_ptr<StepProfiler> profiler_;         // profiler.enabled

  int64_t steps_per_epoch_ = 0;
  int64_t global_step_ = 0;
  int64_t start_epoch_ = 0;
  int64_t resume_step_in_epoch_ = 0;
  std::optional<LoaderState> resume_loader_;
  std::string last_checkpoint_;
  int64_t peak_rss_before_save_ = -1;  // VmHWM when the first checkpoint began (the training steps' peak)
};

uint64_t FinetuneRecipe::agreed_seed() const {
  if (cfg_.seed) return *cfg_.seed;
  const uint64_t mine = std::random_device{}();
  std::vector<uint64_t> seeds(size_t(group_.size()));
  group_.all_gather_bytes(seeds.data(), &mine, int64_t(sizeof mine));
  return seeds[0];
}

void FinetuneRecipe::setup() {
  seed_ = agreed_seed();
  padding_free_ = padding_free_mode();
  const DeviceChoice device = choose_step_device(cfg_.device, cuda_backend_built(), cuda_devices_visible());
  const bool on_gpu = device.device == StepDevice::kCuda;
  if (on_gpu && padding_free_ == PaddingFree::kOneRow) padding_free_ = PaddingFree::kRowsOfT;  // see PaddingFree
  if (rank0_) log_info(device.reason);
  checkpointer_ = std::make_unique<HfCheckpointer>(cfg_.checkpointer.checkpoint_dir, cfg_.checkpointer.checkpoint_files,
                                                   cfg_.output_dir);
  checkpointer_->accept_files_under_output_dir(cfg_.resume_from_checkpoint && !recipe_.lora);
  checkpointer_->check_copied_files();  // every rank: the same files, the same verdict
  if (const fs::path config = fs::path(cfg_.checkpointer.checkpoint_dir) / "config.json";
      cfg_.model.family != "hf" && fs::is_regular_file(config))  // a size-specific builder: the checkpoint's shape
    check_builder_matches_checkpoint(cfg_.model.component, cfg_.model.family, cfg_.model.size,
                                     model::ModelConfig::from_file(config.string()), config.string());
  if (rank0_)  // what a run killed in the middle of a save left (resume() waits for this on every rank)
    for (const std::string& change : checkpointer_->recover_interrupted_saves()) log_warn("interrupted save: " + change);
  setup_data();
  setup_model(on_gpu);

  // Steps: batches // accumulation, capped by max_steps_per_epoch; the schedule spans them all.
  steps_per_epoch_ = loader_->batches_per_epoch() / cfg_.gradient_accumulation_steps;
  if (cfg_.max_steps_per_epoch) steps_per_epoch_ = std::min<int64_t>(steps_per_epoch_, *cfg_.max_steps_per_epoch);
  if (steps_per_epoch_ < 1)
    throw Error("dataset", std::to_string(loader_->batches_per_epoch()) + " batches per epoch on each of " +
                               std::to_string(group_.size()) + " ranks is fewer than gradient_accumulation_steps=" +
                               std::to_string(cfg_.gradient_accumulation_steps) + ": nothing to train on");
  if (!cfg_.lr_scheduler.component.empty())
    schedule_ = CosineWithWarmup{cfg_.lr_scheduler.num_warmup_steps, int64_t(cfg_.epochs) * steps_per_epoch_,
                                 cfg_.lr_scheduler.num_cycles};
  if (rank0_) {
    MetricLoggerOptions logging;
    const std::string& logger = cfg_.metric_logger.component;
    logging.sink = logger.ends_with("StdoutLogger")        ? MetricSink::Stdout
                   : logger.ends_with("TensorBoardLogger") ? MetricSink::TensorBoard
                                                           : MetricSink::Disk;
    logging.log_dir = cfg_.metric_logger.log_dir.empty() ? (fs::path(cfg_.output_dir) / "logs").string()
                                                         : cfg_.metric_logger.log_dir;
    logging.filename = cfg_.metric_logger.filename;
    logging.organize_logs = cfg_.metric_logger.organize_logs;
    metrics_ = std::make_unique<MetricLogger>(logging, int64_t(std::time(nullptr)));
    status_ = TrainerStatusReporter::from_env(0);  // on Kubernetes, where the controller asks for it
    record_config();
  }
  if (cfg_.profiler.enabled) {  // every rank profiles its own steps, as torchtune's profiler does
    ProfilerOptions po;
    po.output_dir = cfg_.profiler.output_dir.empty() ? (fs::path(cfg_.output_dir) / "profiling_outputs").string()
                                                     : cfg_.profiler.output_dir;
    if (cfg_.profiler.wait_steps) po.wait_steps = *cfg_.profiler.wait_steps;
    if (cfg_.profiler.warmup_steps) po.warmup_steps = *cfg_.profiler.warmup_steps;
    if (cfg_.profiler.active_steps) po.active_steps = *cfg_.profiler.active_steps;
    if (cfg_.profiler.num_cycles) po.num_cycles = *cfg_.profiler.num_cycles;
    profiler_ = std::make_unique<StepProfiler>(po, group_.rank());
    if (rank0_) {
      std::string ignored;
      for (const std::string& k : cfg_.profiler.ignored) ignored += (ignored.empty() ? "" : ", ") + k;
      log_info("profiler: steps " + std::to_string(po.wait_steps + po.warmup_steps + 1) + " to " +
               std::to_string(po.wait_steps + po.warmup_steps + po.active_steps) + " of each cycle of " +
               std::to_string(po.wait_steps + po.warmup_steps + po.active_steps) + " recorded into " + po.output_dir +
               " (the step's phases, each layer's forward and backward, the loss)" +
               (ignored.empty() ? "" : "; " + ignored + ": torch profiler options ktune does not record"));
    }
  }
  if (cfg_.resume_from_checkpoint) resume();
  else if (rank0_) warn_of_earlier_checkpoints();
  if (rank0_) check_checkpoint_space();
}

void FinetuneRecipe::check_checkpoint_space() const {
  const CheckpointBytes one = checkpointer_->planned_bytes(trainable_specs_, saved_weights_dtype(), recipe_.lora,
                                                            cfg_.save_adapter_weights_only);
  const int64_t saves = planned_saves();
  const std::optional<int64_t> free = checkpointer_->free_bytes();
  const std::string sizes = std::to_string(one.total()) + " bytes (" + mib(one.total()) + ": merged model " +
                            mib(one.model) + ", adapter " + mib(one.adapter) + ", recipe state " + mib(one.recipe_state) +
                            ", other files " + mib(one.other) + ")";
  log_info("checkpoints: " + std::to_string(saves) + " planned, each " + sizes +
           (free ? "; " + std::to_string(*free) + " bytes (" + mib(*free) + ") free under " + cfg_.output_dir
                 : "; the space free under " + cfg_.output_dir + " is unknown"));
  if (!free || saves == 0) return;
  if (*free < one.total()) {
    const std::string why = "has " + std::to_string(*free) + " bytes (" + mib(*free) +
                            ") free, fewer than one checkpoint needs: " + sizes +
                            "; the first save would fail after training up to it. Free space or set output_dir elsewhere";
    const char* skip = std::getenv("KTUNE_SKIP_SPACE_CHECK");
    if (skip == nullptr || std::string(skip) != "1")
      throw Error("output_dir " + cfg_.output_dir, why + " (env KTUNE_SKIP_SPACE_CHECK=1 trains anyway)");
    log_warn("output_dir " + cfg_.output_dir + " " + why + " (training anyway: KTUNE_SKIP_SPACE_CHECK=1)");
  } else if (*free < saves * one.total()) {
    log_warn("output_dir " + cfg_.output_dir + " has room for " + std::to_string(*free / one.total()) + " of the " +
             std::to_string(saves) + " checkpoints this run plans (" + mib(one.total()) + " each): delete older ones as it goes");
  }
}

int64_t FinetuneRecipe::planned_saves() const {
  const int64_t epochs = std::max<int64_t>(0, cfg_.epochs - start_epoch_);
  int64_t saves = epochs;
  if (cfg_.save_every_n_steps)
    for (int64_t step = global_step_ + 1; step <= global_step_ + epochs * steps_per_epoch_; ++step)
      saves += step % *cfg_.save_every_n_steps == 0 && step % steps_per_epoch_ != 0;
  return saves;
}

void FinetuneRecipe::setup_data() {
  TokenizerOptions t;
  t.path = cfg_.tokenizer.path;
  t.merges_file = cfg_.tokenizer.merges_file;
  t.config_path = cfg_.tokenizer.tokenizer_config_path;
  // ktune.models.hf_tokenizer reads its special tokens (eos, pad) and chat template from the
  // tokenizer_config.json beside the tokenizer.json unless told another, as HF's AutoTokenizer does
  // from the model's directory.
  if (const fs::path beside = fs::path(t.path).parent_path() / "tokenizer_config.json";
      cfg_.tokenizer.family == "hf" && t.config_path.empty() && fs::is_regular_file(beside)) {
    t.config_path = beside.string();
    if (rank0_) log_info("tokenizer: special tokens and chat template from " + t.config_path);
  }
  tokenizer_ = load_tokenizer(t);
  const int64_t max_seq_len = cfg_.tokenizer.max_seq_len.value_or(0);
  if (cfg_.tokenizer.chat_template)
    format_ = template_chat_format(cfg_.tokenizer, t.config_path, *tokenizer_, max_seq_len, rank0_);
  else
    format_ = std::make_unique<ChatFormat>(*tokenizer_, chat_format_for(cfg_.tokenizer, *tokenizer_), max_seq_len,
                                           prompt_template_from_config(cfg_.tokenizer.prompt_template));

  bool packed = false, split = false;
  dataset_ = build_datasets(cfg_.datasets, &packed, &split);
  if (packed && max_seq_len <= 0) throw Error("dataset.packed", "packing needs tokenizer.max_seq_len to be set");
  if (dataset_->size() > 0 && dataset_->num_targets() == 0)  // a loss of 0 / 0 tokens: nothing to learn from
    throw Error("dataset", "no sample has a token to train on: every label is masked" +
                               (dataset_->num_truncated > 0
                                    ? " (" + std::to_string(dataset_->num_truncated) + " of " +
                                          std::to_string(dataset_->size()) + " samples were cut to tokenizer.max_seq_len=" +
                                          std::to_string(max_seq_len) + " before their responses: raise it)"
                                    : std::string(" (the responses are empty, or train_on_input is needed)")));
  if (rank0_) {
    log_info("dataset: " + std::to_string(dataset_->size()) + " samples, " + std::to_string(dataset_->num_tokens()) +
             " tokens (" + std::to_string(dataset_->num_targets()) + " trained on)" + (dataset_->num_truncated ? ", " + std::to_string(dataset_->num_truncated) +
                                                        " truncated to max_seq_len=" + std::to_string(max_seq_len)
                                                  : std::string()));
  }
  LoaderOptions o;
  o.batch_size = cfg_.batch_size;
  o.shuffle = cfg_.shuffle;
  o.seed = seed_;
  o.packed = packed;
  o.max_seq_len = max_seq_len;
  o.split_across_pack = split;
  o.rank = group_.rank();
  o.world_size = group_.size();
  o.pad_id = tokenizer_->pad_id().value_or(0);
  loader_ = std::make_unique<DataLoader>(dataset_, o);
  loader_->set_epoch(0);
  gpu_seq_len_ = std::max(gpu_seq_len_, longest_sample(*dataset_));
  if (packed) gpu_seq_len_ = std::max(gpu_seq_len_, max_seq_len);  // packs are max_seq_len long
  // rows of several samples (packs, or padding-free rows): their documents are the samples
  gpu_document_tokens_ = packed || padding_free_ != PaddingFree::kOff ? mean_sample(*dataset_) : 0;

  if (cfg_.datasets_val.empty()) return;
  bool val_split = false;
  std::shared_ptr<TokenizedDataset> val = build_datasets(cfg_.datasets_val, &val_packed_, &val_split);
  if (val_packed_ && max_seq_len <= 0) throw Error("dataset_val.packed", "packing needs tokenizer.max_seq_len to be set");
  LoaderOptions v = o;  // the same batch size and ranks; in order, every sample once
  v.shuffle = false;
  v.packed = val_packed_;
  v.split_across_pack = val_split;
  val_loader_ = std::make_unique<DataLoader>(val, v);
  gpu_seq_len_ = std::max(gpu_seq_len_, longest_sample(*val));
  if (val_packed_) gpu_seq_len_ = std::max(gpu_seq_len_, max_seq_len);
  val_loader_->set_epoch(0);
  if (val_loader_->batches_per_epoch() < 1)
    throw Error("dataset_val", std::to_string(val->size()) + " samples make no batch of " + std::to_string(cfg_.batch_size) +
                                   " on each of " + std::to_string(group_.size()) + " ranks");
  if (rank0_)
    log_info("dataset_val: " + std::to_string(val->size()) + " samples, " + std::to_string(val->num_tokens()) + " tokens, " +
             std::to_string(val_loader_->batches_per_epoch()) + " batches a rank");
}

std::shared_ptr<TokenizedDataset> FinetuneRecipe::build_datasets(const std::vector<DatasetConfig>& configs, bool* packed,
                                                                 bool* split) {
  auto dataset = std::make_shared<TokenizedDataset>();
  for (const DatasetConfig& d : configs) {
    DatasetOptions options = dataset_options(d);
    TokenizedDataset part = build_dataset(options, *format_);
    for (int64_t i = 0; i < part.size(); ++i)
      if (part.length(i) > 0) dataset->add(part.tokens(i), part.trained(i));  // an empty one has nothing to train
    if (part.num_empty > 0 && rank0_)  // torchtune keeps them, and its step fails on a batch of them
      log_warn(std::to_string(part.num_empty) + " sample" + (part.num_empty > 1 ? "s" : "") +
               " of no token (empty text) left out; the first: " + part.first_empty);
    dataset->num_truncated += part.num_truncated;
    dataset->num_rows_read += part.num_rows_read;
    *packed = *packed || d.packed;
    *split = *split || split_across_pack(options);
  }
  return dataset;
}

void FinetuneRecipe::validate(int64_t epoch) {
  for (auto& a : adapters_) a->set_training(false);  // no dropout
  val_loader_->set_epoch(0);
  double sums[2] = {0.0, 0.0};  // loss sum, label tokens (this rank, then the world)
  Batch batch;
  while (val_loader_->next(&batch)) {
    model::LossResult r;
    if (gpu_) {
      shift_labels(batch);
      r = gpu_->forward_loss(gpu_batch(batch, val_packed_));
    } else {
      const model::Batch mb = model_batch(batch, val_packed_, padding_free_);
      r = sharded_ ? sharded_->forward_loss(mb) : model_->forward_loss(mb);
    }
    sums[0] += r.loss_sum;
    sums[1] += double(r.n_valid);
  }
  for (auto& a : adapters_) a->set_training(true);
  group_.allreduce_sum(sums, 2);
  const double val_loss = sums[0] / std::max(1.0, sums[1]);
  if (!rank0_) return;
  char line[160];
  std::snprintf(line, sizeof line, "validation after step %lld (epoch %lld): val_loss %.4f over %.0f tokens",
                (long long)global_step_, (long long)epoch + 1, val_loss, sums[1]);
  log_info(line);
  metrics_->log(global_step_, {{"val_loss", val_loss}});
  if (status_)
    status_->report(global_step_, int64_t(cfg_.epochs) * steps_per_epoch_, epoch, cfg_.epochs, {{"val_loss", val_loss}});
}

// dtype=bf16 is pure bf16, as torchtune trains: weights (trainable and frozen), gradients and AdamW
// moments stored in bf16, compute in f32 one weight at a time, the update rounded stochastically
// (optimizer.h). Kept f32: LoRA/DoRA adapter parameters (tiny), and on the CPU engine the base of
// DoRA and QLoRA, whose adapters compute on an f32 base (QLoRA's then becomes NF4). On a GPU the
// host's values are only uploaded (the GPU step holds its own bf16 copy, QLoRA's bases quantised into
// the CPU quantiser's codes of the same values) and read by rank 0's saves, so that base stays bf16
// there: views of a bf16 checkpoint rather than an f32 copy of it (a QLoRA run's whole model in f32
// on every rank at load before the adapters quantised it: 32 GB at 8B, 280 GB at 70B).
DType weight_storage(const RecipeConfig& cfg, const RecipeSpec& recipe, bool on_gpu) {
  if (cfg.dtype != TrainDtype::BF16) return DType::F32;
  if (recipe.lora && (cfg.model.use_dora || cfg.model.quantize_base) && !on_gpu) return DType::F32;
  return DType::BF16;
}

void FinetuneRecipe::setup_model(bool on_gpu) {
  const DType storage = weight_storage(cfg_, recipe_, on_gpu);
  // A GPU run's ranks only read their values (the fingerprint, the upload) and then release them:
  // views of the mapped files (f32, bf16 or f16; one in another dtype than the storage's read rounded to it,
  // Parameter::stored_dtype), the page cache's pages shared by the node's ranks instead of a private
  // copy each (Gemma 2's f32 files under bf16: its whole model in bf16 on every rank otherwise). Rank 0 of a LoRA run keeps its frozen values for its
  // saves to merge into, mapped, their pages dropped once uploaded (release_host_values) and read
  // again from the file by each save; a full fine-tune's rank 0 keeps none (its saves stream the
  // trained values from the GPUs).
  // A sharded CPU run maps them too: each rank copies only its shards out of the mapped files
  // (ShardedDataParallel), where every rank made a copy of the whole model first (W copies of it on a
  // node at once), then unmaps them.
  const bool cpu_sharded = !on_gpu && shard_parameters(recipe_);  // as setup_cpu_training decides
  model_ = checkpointer_->load_model(storage, /*map_values=*/on_gpu || cpu_sharded);
  if (on_gpu) model_->set_host_gradients(false);  // the GPU step keeps the gradients; nothing on the host reads them
  const model::ModelConfig& mc = model_->config();
  if (tokenizer_->vocab_size() > mc.vocab_size)
    throw Error(cfg_.tokenizer.chat_template ? "tokenizer.tokenizer_json_path" : "tokenizer.path",
                "the tokenizer has " + std::to_string(tokenizer_->vocab_size()) +
                                      " ids but the model's vocab_size is " + std::to_string(mc.vocab_size));
  check_rows_fit_positions(mc);
  warn_on_other_model_type(mc);
  if (recipe_.lora) {
    check(cfg_.model.lora, "model", "the " + recipe_.name + " recipe needs a LoRA model builder (lora_… or qlora_…)");
    model::LoraOptions options;
    options.rank = cfg_.model.lora_rank;
    options.alpha = float(cfg_.model.lora_alpha);
    options.dropout = float(cfg_.model.lora_dropout);
    options.use_dora = cfg_.model.use_dora;
    options.quantize_base = cfg_.model.quantize_base;
    // torchao's NF4 in the dtype torchtune's model holds the base in (a GPU run is bf16 only)
    options.nf4_arithmetic = cfg_.dtype == TrainDtype::BF16 ? cpu::Nf4Arithmetic::kBf16 : cpu::Nf4Arithmetic::kF32;
    options.nf4_on_demand = on_gpu;  // the GPU quantises its own copy; a save makes the codes it merges
    options.dora_magnitudes_later = options.use_dora && group_.size() > 1;  // a share a rank, summed
    options.seed = seed_;
    model::LoraTargets targets{cfg_.model.lora_attn_modules, cfg_.model.apply_lora_to_mlp, cfg_.model.apply_lora_to_output};
    adapters_ = model::attach_lora(*model_, targets, options);
    // As torchtune's QLoRA builders: Llama, Mistral and Gemma 2 hold the layers' other projections in
    // NF4 too (FrozenNF4Linear), Qwen2 keeps them in the model's dtype.
    if (options.quantize_base && model::qlora_quantizes_unadapted(mc.family))
      frozen_nf4_ = model::attach_frozen_nf4(*model_, options.nf4_arithmetic, options.nf4_on_demand);
    if (options.dora_magnitudes_later) share_dora_magnitudes();
    adapter_description_ = AdapterDescription{options, model::lora_target_modules(targets)};
  } else {
    model_->set_trainable([](const std::string&) { return true; });
  }
  model_->set_activation_checkpointing(cfg_.enable_activation_checkpointing);
  for (model::Parameter* p : model_->parameters())
    if (p->trainable) trainable_.push_back(p);
  trainable_specs_ = parameter_specs(trainable_);  // before any value is released
  // Every rank starts from the same weights: it loaded the same files and seeded its adapters alike.
  // Checked, not sent: the fingerprints of every parameter held (trainable and frozen) against rank 0's.
  check_same_parameters(model_->parameters(), group_, "the starting weights");
  int64_t n_trainable = 0, trainable_bytes = 0;
  for (model::Parameter* p : trainable_) {
    n_trainable += p->value.numel();
    trainable_bytes += int64_t(dtype_bytes(model::stored_dtype_of(*p), size_t(p->value.numel())));  // as stored
  }
  if (on_gpu)
    setup_gpu_training();
  else
    setup_cpu_training(storage, trainable_bytes);
  std::string adapted;
  if (recipe_.lora) {
    adapted = " (adapters on " + std::to_string(adapters_.size()) + " projections";
    if (!frozen_nf4_.empty())
      adapted += "; the frozen bases of the layers' " + std::to_string(frozen_nf4_.size()) +
                 " other projections NF4 too, as torchtune's QLoRA";
    adapted += ")";
  }
  if (rank0_)
    log_info("model: " + mc.model_type + ", " + std::to_string(mc.num_parameters()) + " parameters, " +
             std::to_string(n_trainable) + " trainable" + adapted);
}

// As torchtune's TransformerDecoder refuses a sequence longer than its max_seq_len (at the step that
// meets it), before any step: the longest row the run makes (a sample, train or val, or a pack)
// against config.json's max_position_embeddings. Positions past it were never trained (HF's
// transformers computes them anyway): a longer context is the model's config to state.
void FinetuneRecipe::check_rows_fit_positions(const model::ModelConfig& mc) const {
  if (mc.max_position_embeddings <= 0 || gpu_seq_len_ <= mc.max_position_embeddings) return;
  const std::string config = (fs::path(cfg_.checkpointer.checkpoint_dir) / "config.json").string();
  throw Error("dataset", "rows of up to " + std::to_string(gpu_seq_len_) + " tokens are longer than the model's " +
                             std::to_string(mc.max_position_embeddings) + " positions (max_position_embeddings in " +
                             config + "): set tokenizer.max_seq_len=" + std::to_string(mc.max_position_embeddings) +
                             " or less to cut them, or raise max_position_embeddings if the model (its RoPE scaling) "
                             "is made for longer");
}

// As torchtune's recipes: the resolved config logged at the start (keys sorted), and (its loggers'
// log_config: save_config, OmegaConf.save without resolving) the config as written, overrides
// applied and interpolations left as they are, saved to output_dir/torchtune_config.yaml, so a run's
// overrides can be read back from its outputs.
void FinetuneRecipe::record_config() const {
  ConfigNode sorted = cfg_.tree;
  sorted.sort_keys();
  log_info("Running " + recipe_.name + " with resolved config:\n\n" + sorted.to_yaml());
  if (cfg_.metric_logger.component.empty()) return;
  const std::string path = (fs::path(cfg_.output_dir) / "torchtune_config.yaml").string();
  try {  // as torchtune's save_config: a config that cannot be saved is said, and the run goes on
    fs::create_directories(cfg_.output_dir);
    write_file_atomic(path, (cfg_.unresolved_tree.is_map() ? cfg_.unresolved_tree : cfg_.tree).to_yaml());
  } catch (const std::exception& e) {
    log_warn("could not save the config to " + path + ": " + e.what());
  }
}

// checkpointer.model_type names the family torchtune's checkpointer would convert; ktune reads the
// model config.json describes whatever it says. A model_type of another family is a config written
// for another model: said, not refused (the run trains what config.json describes).
void FinetuneRecipe::warn_on_other_model_type(const model::ModelConfig& mc) const {
  static const std::map<std::string, std::string> kHfModelType = {
      {"LLAMA2", "llama"}, {"LLAMA3", "llama"}, {"LLAMA3_2", "llama"}, {"QWEN2", "qwen2"},
      {"GEMMA", "gemma"},  {"GEMMA2", "gemma2"}, {"MISTRAL", "mistral"}};
  auto it = kHfModelType.find(cfg_.checkpointer.model_type);
  if (!rank0_ || it == kHfModelType.end() || it->second == mc.model_type) return;
  log_warn("checkpointer.model_type=" + cfg_.checkpointer.model_type + " is for " + it->second + " models, but " +
           (fs::path(cfg_.checkpointer.checkpoint_dir) / "config.json").string() + " describes " + mc.model_type +
           ": the run trains what config.json describes");
}

// Each rank makes the magnitudes of adapters rank, rank + W, ... (the row norms of their bases: QLoRA's
// quantised and dequantised, a whole model's quantising on every rank otherwise) and the ranks sum
// them: each element is one rank's value plus zeros, so every rank holds the magnitudes one rank
// alone would make, bit for bit (the fingerprint check that follows compares them).
void FinetuneRecipe::share_dora_magnitudes() {
  std::vector<model::Parameter*> magnitudes;
  int64_t total = 0;
  for (const auto& a : adapters_) {
    magnitudes.push_back(a->parameters().back());  // lora_magnitude_vector, f32 (out), zeros so far
    total += magnitudes.back()->value.numel();
  }
  std::vector<float> all(size_t(total), 0.0f);
  int64_t at = 0;
  for (size_t i = 0; i < adapters_.size(); ++i) {
    const Tensor& m = magnitudes[i]->value;
    if (int64_t(i) % group_.size() == group_.rank()) {
      adapters_[i]->init_dora_magnitude(model_->linear(adapters_[i]->module_name()));
      std::copy(m.f32(), m.f32() + m.numel(), all.begin() + at);
    }
    at += m.numel();
  }
  group_.allreduce_sum(all.data(), total);
  at = 0;
  for (model::Parameter* p : magnitudes) {
    std::copy(all.begin() + at, all.begin() + at + p->value.numel(), p->value.f32());
    at += p->value.numel();
  }
}

void FinetuneRecipe::setup_cpu_training(DType storage, int64_t trainable_bytes) {
  if (cfg_.enable_activation_offloading && rank0_)
    log_info("enable_activation_offloading: nothing to do on the CPU engine, whose activations are host memory "
             "already (checkpointing keeps them small)");
  if (shard_parameters(recipe_)) {
    sharded_ = std::make_unique<ShardedDataParallel>(*model_, trainable_, group_,
                                                     ShardingOptions{cfg_.fsdp_reshard_after_forward});
    // Every mapped value is in a shard now: the files are unmapped (none of their values is held).
    const int64_t still_mapped = model_->mapped_value_bytes();
    model_->drop_mapped_pages();
    check(still_mapped == 0, "sharded data parallel",
          "the model still holds " + std::to_string(still_mapped) + " bytes of the checkpoint files' mapped values");
    if (rank0_) {
      const ShardedMemory m = sharded_->memory();
      log_info("sharded data parallel (FSDP) over " + std::to_string(group_.size()) + " ranks, reshard_after_forward=" +
               (cfg_.fsdp_reshard_after_forward ? "true" : "false") + ": per rank " + mib(m.sharded_params) +
               " parameters + " + mib(m.gradient_shards) + " gradients + " + mib(2 * m.sharded_params) +
               " AdamW state (unsharded: " + mib(4 * trainable_bytes) + ")" +
               (m.sharded_frozen ? "; frozen base sharded: " + mib(m.sharded_frozen) + " per rank" : std::string()) +
               (m.replicated_frozen ? "; frozen, replicated (not f32 or bf16): " + mib(m.replicated_frozen) : std::string()) +
               "; gathered at once: root " + mib(m.root_unit_full) + " + layer " + mib(m.largest_unit_full));
    }
  } else if (recipe_.distributed && rank0_) {
    log_info("replicated data parallel (DDP) over " + std::to_string(group_.size()) + " ranks: per rank " +
             mib(trainable_bytes) + " parameters + " + mib(trainable_bytes) + " gradients + " + mib(2 * trainable_bytes) +
             " AdamW state (trainable)");
  }
  // Sharded: each shard element is keyed to its model parameter for the bf16 stochastic rounding.
  optimizer_ = std::make_unique<AdamW>(
      sharded_ ? sharded_->shard_parameters() : trainable_,
      adamw_settings(),
      sharded_ ? sharded_->element_origins() : std::vector<std::vector<ElementOrigin>>{});
  if (rank0_) {
    TrainingStateBytes state = training_state_bytes(sharded_ ? sharded_->shard_parameters() : model_->parameters(),
                                                    optimizer_->state_bytes());
    if (sharded_) state.frozen = sharded_->memory().sharded_frozen + sharded_->memory().replicated_frozen;
    std::string what = cfg_.dtype != TrainDtype::BF16 ? "dtype=fp32: f32 weights, gradients and AdamW state"
                       : storage == DType::BF16 && !recipe_.lora
                           ? std::string("dtype=bf16: bf16 weights, gradients and AdamW moments (") +
                                 (cpu::bf16_weights_use_bf16_gemm() ? "GEMMs on bf16 operands with f32 accumulation"
                                                                    : "weights widened to f32 for the GEMMs") +
                                 ", optimizer math in f32, stochastically rounded updates)"
                       : storage == DType::BF16
                           ? "dtype=bf16: the frozen base is stored bf16; the LoRA adapters, their gradients and "
                             "AdamW state stay f32 (they are tiny)"
                           : std::string("dtype=bf16: the ") + (cfg_.model.quantize_base ? "QLoRA" : "DoRA") +
                                 " base is kept f32 (its adapters compute on an f32 base; QLoRA's becomes NF4, "
                                 "torchao's in bf16 as torchtune makes it) and the adapters are f32; merged "
                                 "checkpoints are written in bf16";
    log_info(what + "; state " + (sharded_ ? "per rank: " : "") + state.str());
  }
}

void FinetuneRecipe::setup_gpu_training() {
  CudaStepPlan plan = plan_cuda_step(cfg_, recipe_, model_->config(), cfg_.batch_size, gpu_seq_len_);
  if (!plan.gaps.empty()) throw Error("device=" + cfg_.device, describe_gaps(plan.gaps));
  plan.setup.lora_seed = seed_;  // the adapters' LoraOptions::seed (the masks' function is the CPU adapter's)
  plan.setup.attention = cuda_attention_mode();
  plan.attention_document_tokens = gpu_document_tokens_;
  plan.setup.nf4_fused_gemm = cuda_nf4_fused_gemm();
  select_cuda_device(devices_.local_rank);
  const bool sharded = group_.size() > 1 && shard_parameters(recipe_);  // else one GPU, or replicas
  const bool prefetch = cuda_prefetches_layer_weights();  // checked on every run, used where ZeRO-3 shards
  // A full fine-tune shards the gradients too (ZeRO-2: each layer's reduced as its backward ends)
  // and the layers' weights (ZeRO-3: each gathered before its forward and backward) unless
  // cuda_shards_layer_weights says no; LoRA's gradients are small and stay in one buffer (ZeRO-1),
  // and LoRA / DoRA / QLoRA shard the layers' frozen base the same way (QLoRA's NF4 codes and scales too).
  if (sharded) shard_cuda_step(plan, group_.size(), group_.rank(), cuda_shards_layer_weights(cfg_), prefetch);
  if (group_.size() > 1) {
    check(devices_.store != nullptr, "device=cuda", "a distributed run needs its rendezvous store to join NCCL");
    nccl_ = make_gpu_process_group(*devices_.store, "ktune/nccl", group_.rank(), group_.size(),
                                   devices_.collective_timeout);
  }
  // Every value goes up as the host stores it: a bf16 one's pages as they are, any other read a chunk
  // at a time (model::read_stored_f32: one mapped in its file's other dtype rounded to the storage
  // dtype; under ZeRO-3 only this rank's piece): QLoRA's bases too (LoraOptions::nf4_on_demand keeps
  // them the parameters' values), which the GPU step quantises into the CPU quantiser's codes (under
  // ZeRO-3 only its own blocks).
  gpu_ = make_cuda_trainer(model_->parameters(), plan, seed_, model::read_stored_f32, nccl_.get());
  log_info(gpu_->attention_report());  // every rank: with auto, each says what it timed and took (the same)
  release_host_values();
  if (!rank0_) return;
  log_info("GPU step: bf16 weights, activations and AdamW moments, f32 gradients and accumulation, stochastically "
           "rounded updates; every batch laid into (" + std::to_string(cfg_.batch_size) +
           ", its longest sample rounded up to a multiple of " + std::to_string(kGpuSeqLenMultiple) +
           "), memory planned for (" + std::to_string(cfg_.batch_size) + ", " + std::to_string(gpu_seq_len_) + ")" +
           (sharded ? "; data parallel over " + std::to_string(group_.size()) +
                          " GPUs with the AdamW state sharded" +
                          (plan.setup.shard_weights && !plan.setup.full_finetune
                               ? std::string(" (ZeRO-1: the adapters' gradients reduce-scattered over NCCL after the "
                                             "backward, each GPU steps its slice, the updated adapters all-gathered) "
                                             "and the layers' frozen bf16 base weights (ZeRO-3: each GPU stores its "
                                             "piece of each layer's, all-gathered over NCCL before the layer's forward "
                                             "and its backward, QLoRA's NF4 codes and scales with them; the "
                                             "embedding, the final norm and the head whole)")
                           : plan.setup.shard_weights
                               ? std::string(", the gradients and the layers' weights (ZeRO-3: each layer's bf16 "
                                             "weights all-gathered over NCCL before its forward and its backward, "
                                             "its gradients reduce-scattered as its backward ends, each GPU "
                                             "accumulates and steps its pieces; the embedding and the head whole, "
                                             "their updated values all-gathered)")
                           : plan.setup.shard_gradients
                               ? std::string(" and the gradients too (ZeRO-2: each layer's gradients reduce-scattered "
                                             "over NCCL as its backward ends, each GPU accumulates and steps its "
                                             "pieces, the updated weights all-gathered in bf16)")
                               : std::string(" (ZeRO-1: the gradients reduce-scattered over NCCL after the backward, "
                                             "each GPU steps its slice, the updated weights all-gathered in bf16)"))
            : group_.size() > 1 ? "; replicated over " + std::to_string(group_.size()) +
                                      " GPUs (KTUNE_DATA_PARALLEL=replicate), gradients summed over NCCL"
                                : std::string()));
  if (sharded && !plan.setup.shard_weights && !cfg_.fsdp_reshard_after_forward)
    log_info("fsdp_reshard_after_forward=False: the layers' weights stay whole on every GPU from step to step "
             "(ZeRO-2; FSDP would hold them all gathered from the forward to the backward, the same peak)");
  if (cfg_.enable_activation_checkpointing)
    log_info("enable_activation_checkpointing: the GPU step keeps each layer's input and recomputes the layer's "
             "forward before its backward (one layer's activations planned below)");
  if (cfg_.enable_activation_offloading)
    log_info("enable_activation_offloading: the GPU step sends the layer inputs that checkpointing keeps (but the "
             "last layer's) to pinned host memory during the forward and brings each back one layer ahead of the "
             "backward, on a copy stream of its own (two device slots planned below)");
  if (plan.setup.quantize_base)
    log_info(plan.setup.nf4_fused_gemm
                 ? "QLoRA: the layers' NF4 weights are dequantised inside their GEMMs, tile by tile "
                   "(KTUNE_CUDA_NF4_GEMM=fused; DoRA's and shapes off the 64 grid through bf16 scratch)"
                 : "QLoRA: each NF4 weight is dequantised into bf16 scratch before its GEMM "
                   "(KTUNE_CUDA_NF4_GEMM=dequantize, the default)");
  log_info(gpu_->memory_report());
}

void FinetuneRecipe::release_host_values() {
  const bool merged_saved = !(recipe_.lora && cfg_.save_adapter_weights_only);
  // Rank 0 keeps what its saves read from the host: a LoRA run's adapters (a save downloads into them)
  // and its frozen base where a merged model is written. A full fine-tune's saves stream the trained
  // values from the GPUs (CudaTrainer::stream_trainable): nothing kept.
  model_->release_values([&](const model::Parameter& p) { return !rank0_ || !(p.trainable ? recipe_.lora : merged_saved); });
  if (!rank0_ || !merged_saved) {  // what an adapter holds of its base (QLoRA's NF4, unless made on demand): as the frozen base
    for (const auto& a : adapters_) a->release_base();
    for (const auto& f : frozen_nf4_) f->release_base();
  }
  malloc_trim(0);  // the freed values were heap blocks (below glibc's dynamic mmap threshold): back to the OS
  int64_t value_bytes = 0, grad_bytes = 0, nf4_bytes = 0;
  for (const model::Parameter* p : model_->parameters()) {
    check(!(p->trainable && model_->value_is_mapped(*p)), p->name,
          "a trainable value is a view of the read-only checkpoint mapping (a save would download into it)");
    value_bytes += p->value.defined() ? int64_t(p->value.bytes()) : 0;
    grad_bytes += p->grad.defined() ? int64_t(p->grad.bytes()) : 0;
  }
  // Rank 0 of a LoRA run: the frozen values it keeps for its saves are the files' pages, read for the
  // upload; dropped from its resident memory until a save reads them again.
  const int64_t mapped_bytes = model_->drop_mapped_pages();
  if (cfg_.model.quantize_base) {  // NF4 codes and scales the adapters hold (none when made on demand)
    for (const auto& a : adapters_) nf4_bytes += int64_t(a->base_weight_bytes(model_->linear(a->module_name())));
    for (const auto& f : frozen_nf4_) nf4_bytes += int64_t(f->base_weight_bytes());
  }
  const std::string role =
      !rank0_ ? "rank " + std::to_string(group_.rank()) + ": no values, its GPU holds them and rank 0 writes the checkpoints"
      : !recipe_.lora ? "rank 0: no values, a save streams the trained ones from the GPUs as it writes them"
      : merged_saved ? "rank 0: the adapters a save downloads into and the frozen base its merged model is made of"
                     : "rank 0: the adapters a save downloads into (save_adapter_weights_only: no merged model)";
  log_info("host model after the upload to the GPU: " + std::to_string(value_bytes) + " bytes of parameter values (" +
           mib(value_bytes) + ") and " + std::to_string(grad_bytes) + " bytes of gradients held" +
           (!cfg_.model.quantize_base ? std::string()
            : nf4_bytes > 0 ? ", and the adapters' NF4 bases: " + std::to_string(nf4_bytes) + " bytes (" + mib(nf4_bytes) + ")"
            : rank0_ && merged_saved ? ", the adapters' NF4 bases quantised from the frozen base as a save merges them"
                                     : std::string()) +
           (mapped_bytes > 0 ? "; " + std::to_string(mapped_bytes) + " bytes of the values (" + mib(mapped_bytes) +
                                   ") are the checkpoint files' mapped pages, dropped from memory until a save reads them"
                             : std::string()) +
           " (" + role + "); resident now " + mib(read_memory_stats().rss_bytes));
}

// The checkpoint's trainable weights are this run's, name for name and shape for shape, before any
// is loaded: a run resumed with another LoRA rank or other adapted modules is refused naming the
// tensor, not halfway through with a bare shape error.
void FinetuneRecipe::check_resumed_trainable(const std::map<std::string, Tensor>& saved, const std::string& dir) const {
  const std::string hint = ": resume with the model settings the checkpoint was trained with (e.g. model.lora_rank, "
                           "model.lora_attn_modules, model.apply_lora_to_mlp, model.apply_lora_to_output)";
  for (const io::TensorSpec& mine : trainable_specs_) {
    auto it = saved.find(mine.name);
    if (it == saved.end()) throw Error(dir, "the recipe state has no weights for " + mine.name + ", which this run trains" + hint);
    if (it->second.shape() != mine.shape)
      throw Error(dir + ": " + mine.name, "saved with shape " + it->second.shape().str() + ", this run's is " +
                                              mine.shape.str() + hint);
  }
  if (saved.size() > trainable_specs_.size()) {
    std::set<std::string> mine;
    for (const io::TensorSpec& spec : trainable_specs_) mine.insert(spec.name);
    for (const auto& [name, tensor] : saved)
      if (!mine.count(name))
        throw Error(dir, "the recipe state holds weights for " + name + ", which this run does not train" + hint);
  }
}

// A fresh run in an output_dir that holds an earlier run's checkpoints: said before it trains (they
// stay until a save of the same name replaces them; a later resume continues from the newest save).
void FinetuneRecipe::warn_of_earlier_checkpoints() const {
  if (std::optional<std::string> earlier = checkpointer_->find_latest())
    log_warn("output_dir " + cfg_.output_dir + " holds checkpoints of an earlier run (the newest: " + *earlier +
             "); this run starts afresh (resume_from_checkpoint=False) and its saves replace those of the same "
             "name; a later resume_from_checkpoint=True continues from the newest save");
}

// The run's length may change on resume (more epochs, another cap on an epoch's steps): this run's
// values are used, and said, where the checkpoint was written with others (torchtune warns too).
void FinetuneRecipe::warn_of_changed_length(const nlohmann::json& state, const std::string& checkpoint) const {
  if (!rank0_) return;
  if (state.contains("total_epochs") && state["total_epochs"].get<int64_t>() != cfg_.epochs)
    log_warn(checkpoint + " was written by a run of epochs=" + std::to_string(state["total_epochs"].get<int64_t>()) +
             "; this run trains to epochs=" + std::to_string(cfg_.epochs));
  if (state.contains("max_steps_per_epoch")) {
    const nlohmann::json mine = cfg_.max_steps_per_epoch ? nlohmann::json(*cfg_.max_steps_per_epoch) : nlohmann::json(nullptr);
    if (state["max_steps_per_epoch"] != mine)
      log_warn(checkpoint + " was written with max_steps_per_epoch=" + state["max_steps_per_epoch"].dump() +
               "; this run uses max_steps_per_epoch=" + mine.dump() + " from here on");
  }
}

void FinetuneRecipe::resume() {
  group_.barrier();  // rank 0 has put right what an interrupted save left (setup)
  std::optional<std::string> latest = checkpointer_->find_latest();
  if (!latest)
    throw Error("resume_from_checkpoint", "no checkpoint with a recipe state under " + cfg_.output_dir);
  ResumePoint point = checkpointer_->load_resume_point(*latest);
  const nlohmann::json& s = point.recipe_state;
  // The recipe state holds whole tensors, so another number of ranks can take it up; only a position
  // inside an epoch (each rank's share of its batches) ties a checkpoint to the ranks that wrote it.
  const bool mid_epoch = s.value("step_in_epoch", int64_t(0)) > 0;
  if (s.value("world_size", 1) != group_.size()) {
    if (mid_epoch)
      throw Error(*latest, "was written by " + std::to_string(s.value("world_size", 1)) + " ranks in the middle of an "
                               "epoch; this run has " + std::to_string(group_.size()) +
                               " (resume with the same world size, or from a checkpoint at an epoch's end)");
    if (rank0_)
      log_info(*latest + ": written by " + std::to_string(s.value("world_size", 1)) + " ranks at an epoch's end; " +
               std::to_string(group_.size()) + " take it up");
  }
  if (s.value("recipe", std::string()) != recipe_.name)
    throw Error(*latest, "was written by recipe " + s.value("recipe", std::string("?")) + ", not " + recipe_.name);
  check_resumed_trainable(point.trainable, *latest);
  const int64_t step_in_epoch = s.at("step_in_epoch").get<int64_t>();
  if (step_in_epoch > 0 && s.contains("gradient_accumulation_steps") &&
      s["gradient_accumulation_steps"].get<int64_t>() != cfg_.gradient_accumulation_steps)
    throw Error(*latest, "stopped at step " + std::to_string(step_in_epoch) + " of an epoch with gradient_accumulation_steps=" +
                             std::to_string(s["gradient_accumulation_steps"].get<int64_t>()) + "; this run has " +
                             std::to_string(cfg_.gradient_accumulation_steps) +
                             " (the epoch's remaining batches would be counted in other steps): resume with the same "
                             "value, or from a checkpoint at an epoch's end");
  const int64_t steps_done = s.at("optimizer_steps").get<int64_t>();
  if (sharded_) {
    sharded_->load_full_parameters(point.trainable, *latest + " recipe state");
    optimizer_->load_state(sharded_->shard_optimizer_state(point.optimizer_state, *latest), steps_done, *latest);
  } else if (gpu_) {  // straight to the GPU step (the host values may be released; rank 0's are the
                      // GPU's again when the next save downloads them), and the moments
    gpu_->upload_trainable(point.trainable, *latest);
    gpu_->load_optimizer_state(point.optimizer_state, steps_done, *latest);
  } else {
    for (model::Parameter* p : trainable_) p->value.copy_from(point.trainable.at(p->name));  // checked above
    optimizer_->load_state(point.optimizer_state, steps_done, *latest);
  }
  global_step_ = s.at("global_step").get<int64_t>();
  start_epoch_ = s.at("epoch").get<int64_t>();
  resume_step_in_epoch_ = step_in_epoch;
  seed_ = s.at("seed").get<uint64_t>();
  warn_of_changed_length(s, *latest);
  if (s.contains("loader") && !s["loader"].is_null()) resume_loader_ = LoaderState::from_json(s["loader"]);
  last_checkpoint_ = *latest;
  if (rank0_) log_info("resumed from " + *latest + " at step " + std::to_string(global_step_));
}

void FinetuneRecipe::save(const std::string& name, int64_t next_epoch, int64_t step_in_epoch) {
  group_.barrier();
  if (peak_rss_before_save_ < 0) peak_rss_before_save_ = read_memory_stats().peak_rss_bytes;
  // A full fine-tune's moments and trained values are gathered unit by unit as rank 0 writes them
  // (a GPU run's, a sharded CPU run's): every rank runs the gathers in one order, the moments' then
  // the values'; the other ranks take part now, rank 0 inside its save (it holds one unit at a time).
  // A GPU run's LoRA adapters are whole on every GPU: rank 0 downloads them into its host model first
  // (the merged model is made of them; no collective), and its moments stream the same way. A sharded
  // CPU LoRA run gathers its adapters and their moments whole first (small), then its frozen base unit
  // by unit as rank 0 writes the merged model's tensors of each (FrozenInTurn): rank 0 holds one
  // unit of the base at a time, not the model.
  const bool streamed_values = !recipe_.lora && (gpu_ || sharded_);
  const bool frozen_in_turn = sharded_ && recipe_.lora && !cfg_.save_adapter_weights_only;
  std::map<std::string, Tensor> optimizer_state;  // a CPU run's moments, whole on rank 0
  std::vector<io::PlannedTensor> gpu_moments;      // a GPU run's: rank 0's, each gathered as it is written
  if (sharded_ && recipe_.lora) {
    sharded_->gather_trainable_parameters(/*keep=*/rank0_);
    optimizer_state = sharded_->gather_optimizer_state(*optimizer_, /*keep=*/rank0_);
  } else if (!sharded_ && !gpu_ && rank0_) {
    optimizer_state = optimizer_->state();
  }
  if (gpu_ && rank0_ && recipe_.lora) gpu_->download_trainable();
  if (gpu_) gpu_moments = gpu_->stream_optimizer_state(/*keep=*/rank0_);
  if (!rank0_ && sharded_ && streamed_values) sharded_->stream_optimizer_state(*optimizer_, io::TensorSink());
  if (!rank0_ && streamed_values) stream_trained_values(io::TensorSink());
  if (!rank0_ && frozen_in_turn) sharded_->stream_frozen_parameters(nullptr);
  if (rank0_) {
    SaveRequest r;
    r.name = name;
    r.decoder = model_.get();
    r.adapters = adapters_;
    r.frozen_nf4 = frozen_nf4_;
    r.adapter = adapter_description_;
    r.adapter_weights_only = cfg_.save_adapter_weights_only;
    r.weights_dtype = saved_weights_dtype();
    r.recipe_state = {{"recipe", recipe_.name}, {"epoch", next_epoch}, {"step_in_epoch", step_in_epoch},
                      {"saved_at", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
                      {"global_step", global_step_}, {"optimizer_steps", optimizer_steps()},
                      {"seed", seed_}, {"world_size", group_.size()}, {"total_epochs", cfg_.epochs},
                      {"gradient_accumulation_steps", cfg_.gradient_accumulation_steps},
                      {"max_steps_per_epoch", cfg_.max_steps_per_epoch ? nlohmann::json(*cfg_.max_steps_per_epoch)
                                                                       : nlohmann::json(nullptr)},
                      {"loader", step_in_epoch > 0 ? loader_->state().to_json() : nlohmann::json(nullptr)}};
    bool moments_streamed = false, values_streamed = false, frozen_streamed = false;  // whether the save reached the streams
    if (gpu_)
      r.optimizer_state = streamed_in_order(std::move(gpu_moments));
    else if (sharded_ && streamed_values)
      r.optimizer_state = {sharded_->optimizer_state_specs(*optimizer_), [&](const io::TensorSink& sink) {
                             moments_streamed = true;
                             sharded_->stream_optimizer_state(*optimizer_, sink);
                           }};
    else
      r.optimizer_state = streamed_as_they_are(optimizer_state);
    if (streamed_values)
      r.trainable = {trainable_specs_, [&](const io::TensorSink& sink) {
                       values_streamed = true;
                       stream_trained_values(sink);
                     }};
    else
      r.trainable = host_trainable_values(trainable_);
    if (frozen_in_turn)
      r.frozen = {sharded_->frozen_specs(), [&](const std::function<void(const std::vector<std::string>&)>& held) {
                    frozen_streamed = true;
                    sharded_->stream_frozen_parameters(held);
                  }};
    try {
      last_checkpoint_ = checkpointer_->save(r);
    } catch (...) {
      // The other ranks wait in the gathers the failed save did not reach: run them, then fail.
      try {
        if (gpu_) gpu_->finish_optimizer_state();
        if (sharded_ && streamed_values && !moments_streamed) sharded_->stream_optimizer_state(*optimizer_, io::TensorSink());
        if (streamed_values && !values_streamed) stream_trained_values(io::TensorSink());
        if (frozen_in_turn && !frozen_streamed) sharded_->stream_frozen_parameters(nullptr);
      } catch (const std::exception&) {
      }
      throw;
    }
    log_info("saved checkpoint " + last_checkpoint_);
  }
  if (gpu_ && rank0_) gpu_->finish_optimizer_state();  // any gather no written tensor reached (none)
  if (sharded_ && recipe_.lora) sharded_->release_full_parameters();
  group_.barrier();
}

void FinetuneRecipe::stream_trained_values(const io::TensorSink& sink) {
  if (!gpu_) return sharded_->stream_full_parameters(sink);
  gpu_->finish_optimizer_state();  // the moments' gathers all run first (on rank 0: written, none left)
  gpu_->stream_trainable(sink);
}

void FinetuneRecipe::all_reduce_gradients() {
  if (group_.size() == 1 || sharded_) return;  // sharded: reduce-scattered inside forward_backward
  for (model::Parameter* p : trainable_) {
    if (p->grad.dtype() == DType::F32) {
      group_.allreduce_sum(p->grad.f32(), p->grad.numel());
    } else {  // bf16: summed in f32 (the groups reduce f32), rounded once
      Tensor wide = p->grad.to(DType::F32);
      group_.allreduce_sum(wide.f32(), wide.numel());
      p->grad.copy_from(wide);
    }
  }
}

void FinetuneRecipe::log_padding_skipped() {
  if (loader_->options().packed) return;  // a pack's padding tail is kept (T = max_seq_len)
  double counts[3] = {double(positions_padded_), double(positions_real_), double(positions_computed_)};
  group_.allreduce_sum(counts, 3);
  if (!rank0_) return;
  const double padded = counts[0], real = counts[1], computed = counts[2];
  auto percent = [&](double n) { return padded > 0 ? 100.0 * n / padded : 0.0; };
  char line[512];
  if (gpu_) {  // rows of a length rounded up to a multiple of kGpuSeqLenMultiple
    const bool relaid = padding_free_ != PaddingFree::kOff;
    std::snprintf(line, sizeof line,
                  "GPU step%s: the training steps computed %.0f positions for %.0f sample tokens (every batch laid "
                  "into %s, its longest %s rounded up to a multiple of %lld, at most %lld)); collated, the batches "
                  "hold %.0f (%.1f%% padding): %.0f positions (%.1f%%) %s",
                  relaid ? ", padding-free (rows of at most T)" : " (KTUNE_PADDING_FREE=0)", computed, real,
                  relaid ? "(the rows its samples fill" : "(batch_size", relaid ? "row" : "sample",
                  (long long)kGpuSeqLenMultiple, (long long)gpu_seq_len_, padded, percent(padded - real),
                  std::fabs(padded - computed), percent(std::fabs(padded - computed)),
                  computed <= padded ? "skipped" : "of extra padding");
    log_info(line);
    return;
  }
  std::snprintf(line, sizeof line,
                "%s: the training steps computed %.0f positions for %.0f sample tokens; padded, the batches "
                "hold %.0f (%.1f%% padding): %.0f positions (%.1f%%) skipped",
                padding_free_ == PaddingFree::kRowsOfT  ? "padding-free (rows of at most T)"
                : padding_free_ == PaddingFree::kOneRow ? "padding-free (one row)"
                                                        : "KTUNE_PADDING_FREE=0",
                computed, real, padded,
                percent(padded - real), padded - computed, percent(padded - computed));
  log_info(line);
}

Batch FinetuneRecipe::next_training_batch() {
  Batch batch;
  if (!loader_->next(&batch)) throw Error("data loader", "ran out of batches inside an epoch");
  positions_padded_ += batch.batch_size * batch.seq_len;
  positions_real_ += std::count(batch.doc_ids.begin(), batch.doc_ids.end(), 0);  // unpacked: doc id 0 = sample
  return batch;
}

FinetuneRecipe::StepOutcome FinetuneRecipe::cpu_step() {
  model_->zero_grad();
  if (sharded_) sharded_->zero_grad();
  double sums[2] = {0.0, 0.0};  // loss sum, label tokens (this rank, then the world)
  for (int micro = 0; micro < cfg_.gradient_accumulation_steps; ++micro) {
    Batch batch;
    {
      trace::Span span("phase", "data");
      batch = next_training_batch();
    }
    for (auto& a : adapters_) a->set_dropout_key(dropout_key(micro));
    const model::Batch mb = model_batch(batch, loader_->options().packed, padding_free_);
    positions_computed_ += mb.B * mb.T;
    trace::Span span("phase", "forward and backward");
    model::LossResult r = sharded_ ? sharded_->forward_backward(mb, 1.0f) : model_->forward_backward(mb, 1.0f);
    sums[0] += r.loss_sum;
    sums[1] += double(r.n_valid);
  }
  // Token-weighted loss over the global batch: Σ CE / Σ label tokens, across steps and ranks.
  {
    trace::Span span("phase", "gradient all-reduce");
    group_.allreduce_sum(sums, 2);
    all_reduce_gradients();
  }
  trace::Span optimizer_span("phase", "clip and optimizer step");
  StepOutcome out;
  out.tokens = sums[1];
  out.loss = sums[0] / std::max(1.0, sums[1]);
  out.lr = next_lr(out.loss);
  scale_gradients(optimizer_->params(), float(1.0 / std::max(1.0, sums[1])));
  if (cfg_.clip_grad_norm)
    out.grad_norm = sharded_ ? sharded_->clip_gradient_norm(*cfg_.clip_grad_norm)
                             : clip_gradient_norm(trainable_, *cfg_.clip_grad_norm);
  optimizer_->step(out.lr);
  return out;
}

FixedShapeBatch FinetuneRecipe::gpu_batch(const Batch& shifted, bool packed) const {
  const int32_t pad_id = tokenizer_->pad_id().value_or(0);
  const int64_t T = step_seq_len(shifted, kGpuSeqLenMultiple, gpu_seq_len_);
  if (packed || padding_free_ == PaddingFree::kOff) return to_fixed_shape(shifted, cfg_.batch_size, T, pad_id, packed);
  // Padding-free: the samples re-laid into as few rows of at most T tokens as first-fit finds, each
  // a document of its own (positions from 0), the step run on those rows only.
  const Batch rows = remove_padding(shifted, T);
  const int64_t rows_T = std::max<int64_t>(1, step_seq_len(rows, kGpuSeqLenMultiple, gpu_seq_len_));
  return to_fixed_shape(rows, rows.batch_size, rows_T, pad_id, true);
}

// The micro-batches come first: their label tokens, summed over the ranks, are the 1 / N that
// scales each gradient as it accumulates on the GPU (the CPU step scales once at the end instead).
FinetuneRecipe::StepOutcome FinetuneRecipe::gpu_step() {
  std::vector<FixedShapeBatch> micro_batches;
  double sums[2] = {0.0, 0.0};  // label tokens, then loss sum (this rank, then the world)
  for (int micro = 0; micro < cfg_.gradient_accumulation_steps; ++micro) {
    Batch batch = next_training_batch();
    shift_labels(batch);
    sums[0] += double(batch.num_label_tokens());
    micro_batches.push_back(gpu_batch(batch, loader_->options().packed));
    positions_computed_ += micro_batches.back().batch_size * micro_batches.back().seq_len;
  }
  group_.allreduce_sum(sums, 1);
  const double tokens = std::max(1.0, sums[0]);
  gpu_->zero_grad();
  double loss_sum = 0;
  for (size_t micro = 0; micro < micro_batches.size(); ++micro) {
    gpu_->set_dropout_key(dropout_key(int(micro)));
    loss_sum += gpu_->forward_backward(micro_batches[micro], float(1.0 / tokens)).loss_sum;
  }
  group_.allreduce_sum(&loss_sum, 1);
  gpu_->reduce_gradients();
  StepOutcome out;
  out.tokens = sums[0];
  out.loss = loss_sum / tokens;
  out.lr = next_lr(out.loss);
  if (cfg_.clip_grad_norm) out.grad_norm = gpu_->clip_gradient_norm(*cfg_.clip_grad_norm);
  gpu_->optimizer_step(out.lr, adamw_settings());
  return out;
}

double FinetuneRecipe::next_lr(double loss) const {
  if (!std::isfinite(loss))
    throw Error("training at step " + std::to_string(global_step_ + 1),
                "the loss is " + std::to_string(loss) + "; stopped before updating the weights" +
                    (last_checkpoint_.empty() ? std::string() : "; the last good checkpoint is " + last_checkpoint_));
  return lr_at(global_step_);
}

double FinetuneRecipe::lr_at(int64_t step) const {
  return cfg_.optimizer.lr * (schedule_ ? schedule_->multiplier(step) : 1.0);
}

void FinetuneRecipe::train() {
  // On stderr, as torchtune's tqdm bar: stdout keeps only what the run reports (StdoutLogger's lines).
  const bool terminal = rank0_ && ProgressBar::is_terminal(stderr);
  ProgressBar bar(stderr, terminal, steps_per_epoch_);
  const auto run_start = std::chrono::steady_clock::now();
  double later_steps_seconds = 0;  // steps after this run's first (which also plans the arena)
  int64_t later_steps = 0, steps_this_run = 0;
  for (int64_t epoch = start_epoch_; epoch < cfg_.epochs; ++epoch) {
    int64_t step_in_epoch = 0;
    if (resume_loader_ && epoch == start_epoch_) {
      loader_->restore(*resume_loader_);
      step_in_epoch = resume_step_in_epoch_;
    } else {
      loader_->set_epoch(epoch);
    }
    bar.reset(steps_per_epoch_);
    const auto epoch_start = std::chrono::steady_clock::now();
    while (step_in_epoch < steps_per_epoch_) {
      const auto step_start = std::chrono::steady_clock::now();
      if (profiler_) profiler_->begin_step(steps_this_run);
      StepOutcome step;
      {
        trace::Span span("step", "step", global_step_ + 1);
        step = gpu_ ? gpu_step() : cpu_step();
      }
      if (profiler_) profiler_->end_step(steps_this_run, global_step_ + 1);
      const double loss = step.loss;
      const std::optional<double>& grad_norm = step.grad_norm;
      ++global_step_;
      ++step_in_epoch;
      // As torchtune's recipes log it: get_lr after lr_scheduler.step(), i.e. the next update's lr.
      const double lr = lr_at(global_step_);

      const double step_seconds = seconds_since(step_start);
      if (steps_this_run++ > 0) {
        later_steps_seconds += step_seconds;
        ++later_steps;
      }
      const double tokens_per_second = step.tokens > 0 ? step.tokens / group_.size() / step_seconds : 0.0;
      if (rank0_ && global_step_ % cfg_.log_every_n_steps == 0) {
        Metrics m = {{"loss", loss}, {"lr", lr}, {"tokens_per_second_per_gpu", tokens_per_second}};
        if (grad_norm) m.push_back({"grad_norm", *grad_norm});
        if (cfg_.log_peak_memory_stats) m.push_back({"peak_memory_rss_gib", double(read_memory_stats().peak_rss_bytes) / (1 << 30)});
        metrics_->log(global_step_, m);
        metrics_->progress(global_step_, int64_t(cfg_.epochs) * steps_per_epoch_, epoch, loss, lr, tokens_per_second);
      }
      if (status_)
        status_->report(global_step_, int64_t(cfg_.epochs) * steps_per_epoch_, epoch, cfg_.epochs,
                        {{"loss", loss}, {"lr", lr}, {"tokens_per_second_per_gpu", tokens_per_second}});
      if (rank0_) bar.update(epoch + 1, global_step_, loss, step_in_epoch, seconds_since(epoch_start));
      if (val_loader_ && cfg_.run_val_every_n_steps && global_step_ % *cfg_.run_val_every_n_steps == 0) validate(epoch);
      if (cfg_.save_every_n_steps && global_step_ % *cfg_.save_every_n_steps == 0 && step_in_epoch < steps_per_epoch_)
        save("step_" + std::to_string(global_step_), epoch, step_in_epoch);
    }
    if (rank0_) bar.finish();
    // Without run_val_every_n_steps, dataset_val is evaluated at the end of every epoch.
    if (val_loader_ && !cfg_.run_val_every_n_steps) validate(epoch);
    save("epoch_" + std::to_string(epoch), epoch + 1, 0);
  }
  if (profiler_) profiler_->finish(global_step_);
  log_padding_skipped();
  // Every rank reports its own peak (ranks differ: rank 0 also gathers checkpoints).
  if (rank0_ || group_.size() > 1) {
    char timing[160];
    std::snprintf(timing, sizeof timing, "%.1f s; mean step %.4f s over %lld steps after the first", seconds_since(run_start),
                  later_steps ? later_steps_seconds / double(later_steps) : 0.0, (long long)later_steps);
    const std::string steps = steps_this_run == global_step_
                                  ? std::to_string(global_step_) + " steps"
                                  : std::to_string(steps_this_run) + " steps (to step " + std::to_string(global_step_) +
                                        ", resumed at " + std::to_string(global_step_ - steps_this_run) + ")";
    log_info("training done: " + steps + " in " + timing + "; peak RSS " +
             std::to_string(read_memory_stats().peak_rss_bytes >> 20) + " MiB (" +
             std::to_string(peak_rss_before_save_ >> 20) + " MiB before the first checkpoint)");
    if (gpu_) log_info("GPU memory: " + gpu_->memory_report());
  }
}

}  // namespace

int run_finetune(const RecipeConfig& config, const RecipeSpec& recipe, dist::ProcessGroup& group,
                 const WorkerDevices& devices) {
  FinetuneRecipe r(config, recipe, group, devices);
  r.setup();
  r.train();
  return 0;
}

}  // namespace ktune::train
