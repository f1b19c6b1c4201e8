// The recipes' steps on a GPU (device=cuda). A cuda::Decoder (model/cuda/decoder.h) holds the model,
// its gradients and its AdamW state on the device, planned once for one (B, T_max); the host model
// that the checkpointer loaded is the source of the weights and rank 0's the destination:
//   setup       every host parameter uploaded by name (HF names for the base, PEFT's for LoRA A/B as
//               attach_lora initialised them: the same start as a CPU run with the same seed); the
//               recipe then releases the host values that no save reads (all of them but on rank 0)
//   each step   micro-batches laid into (B, T), T their own longest row rounded up to a multiple of
//               kGpuSeqLenMultiple, at most T_max (data/fixed_shape_batch.h; packed ones keep their
//               positions and doc ids), their gradients scaled by
//               1 / the global batch's label tokens as they accumulate (the count is known on the
//               host before the forward), summed across GPUs over NCCL, clipped, and one AdamW step
//               on the device (bf16 weights and moments, stochastically rounded updates)
//   resume      the checkpoint's trainable tensors uploaded by name, past the host model
//   checkpoint  the trainable parameters downloaded into rank 0's host model, whose save writes the
//               merged model, the PEFT adapter and the recipe state as a CPU run does; the AdamW
//               moments come back as "exp_avg.<name>" / "exp_avg_sq.<name>" (bf16), the names the
//               CPU optimizer uses, so a checkpoint resumes on either engine
// The implementation (train/cuda/cuda_decoder_trainer.cpp) is a plugin, libktune_cuda_step.so beside
// the ktune binary (or where env KTUNE_CUDA_STEP_PLUGIN says), loaded by make_cuda_trainer() the
// first time a run trains on a GPU: cuBLASLt
// alone costs ~210 MiB of resident memory the moment it is loaded (its kernels register at load),
// which every CPU run would otherwise carry. Hence an interface, and a recipe that never sees a
// CUDA type. The binary itself links only the CUDA runtime (to count and select GPUs).
// Distributed GPU runs (one GPU a worker, an NCCL group given at creation): the distributed recipes
// shard the AdamW state (CudaStepPlan::setup.optimizer_shards = the world size; each GPU steps its
// shard, the updated values all-gathered in bf16), or, with env KTUNE_DATA_PARALLEL=replicate,
// replicate it (one all-reduce of the gradients, every GPU steps all of them). A sharded full
// fine-tune shards the gradients too (ZeRO-2, setup.shard_gradients): each gradient unit (the
// embedding, each layer, the final norm + an untied head) is reduce-scattered on the NCCL stream as
// soon as the backward has finished it (while the next layers' backward runs) and its piece added
// into this GPU's f32 accumulator, so a GPU holds 4/W bytes of gradient a parameter plus two
// layers' (the two slots the reduce-scatters overlap through), the embedding's and the head's whole
// gradients.
// LoRA, QLoRA and DoRA runs shard the AdamW state only (ZeRO-1: their gradients are small; one
// buffer, reduce-scattered after the backward). A sharded full fine-tune shards the layers' bf16
// weights as well (ZeRO-3, setup.shard_weights; fsdp_reshard_after_forward=False or env
// KTUNE_DATA_PARALLEL=zero2 keeps them whole): each GPU stores and updates its pieces of each layer,
// and the decoder all-gathers a layer into one of two slots before its forward and its backward (the
// next layer's while this one computes); the embedding and the head stay whole on every GPU.
// Sharded LoRA, DoRA and QLoRA runs shard the layers' frozen bf16 base the same way (each GPU stores
// its piece, gathered before each layer's forward and backward; QLoRA's NF4 codes and scales too).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/fixed_shape_batch.h"
#include "dist/process_group.h"
#include "io/safetensors.h"
#include "model/decoder.h"  // LossResult (a plain struct)
#include "model/linear.h"   // Parameter (a plain struct)
#include "train/device_selection.h"
#include "train/optimizer.h"

namespace ktune::train {

class CudaTrainer {
 public:
  virtual ~CudaTrainer() = default;

  // host → device: the trainable parameters' values by name (a resume's checkpoint tensors, any float
  // dtype), without the host model, whose values may be released. Errors name `where` and a trainable
  // parameter that `values` lacks or holds with another count of values.
  virtual void upload_trainable(const std::map<std::string, Tensor>& values, const std::string& where) = 0;
  // device → host, unit by unit: each trainable parameter's values handed to `sink` (f32, the
  // parameter's shape; the tensor lives for the call only), so that the host holds one at a time (a
  // save writes them as they come: a full fine-tune's rank 0 keeps no host values). With the layers'
  // weights sharded (ZeRO-3, a full fine-tune's) a collective: every GPU calls it, in the same order
  // among its other collectives (each layer is gathered before its values are read); an empty sink
  // takes part in the gathers only. A sink that throws stops no gather: the remaining ones run (the
  // other GPUs wait in them), and the first error is rethrown after the last. A LoRA run's trainable
  // values (the adapters) are whole on every GPU: no collective.
  virtual void stream_trainable(const io::TensorSink& sink) = 0;
  // The same, into the host model's tensors (their dtype kept).
  virtual void download_trainable() = 0;

  virtual void zero_grad() = 0;
  // One micro-batch of (B, T), each at most the planned one (the step runs on (B, T) only); gradients
  // accumulate scaled by grad_scale. The loss sum is unscaled. A packed batch (batch.packed()) runs
  // with its positions and doc ids (RoPE per token, attention masked across documents).
  virtual model::LossResult forward_backward(const FixedShapeBatch& batch, float grad_scale) = 0;
  // The loss only, for validation (no backward, no LoRA dropout). The gradients are left as they were.
  virtual model::LossResult forward_loss(const FixedShapeBatch& batch) = 0;
  // The LoRA dropout masks' key for the following micro-batch (as LoraAdapter::set_dropout_key).
  virtual void set_dropout_key(uint64_t key) = 0;
  // Σ over the GPUs of every gradient, where this GPU's optimizer step reads it: the whole buffer
  // (replicated: an all-reduce) or this GPU's shard (sharded: a reduce-scatter). One GPU, or the
  // gradients sharded (ZeRO-2: forward_backward reduced each unit already): nothing.
  virtual void reduce_gradients() = 0;
  // torch.nn.utils.clip_grad_norm_ over every gradient (sharded: the shards' squares summed over the
  // GPUs); returns the norm before clipping (+inf max_norm only measures). After reduce_gradients.
  virtual double clip_gradient_norm(double max_norm) = 0;
  // One AdamW step at lr; steps are counted from 1 (and continue after load_optimizer_state).
  // Sharded: each GPU steps its shard, then every GPU gets every updated value (an all-gather that
  // uses the gradient buffer as its scratch: the gradients are spent after it).
  virtual void optimizer_step(double lr, const AdamWSettings& settings) = 0;
  virtual int64_t optimizer_steps() const = 0;
  // The moments by the CPU optimizer's names (bf16), as a save writes them: planned tensors, each
  // brought to the host only when its produce() runs, in the order the GPUs gather them (unit by
  // unit, exp_avg's units then exp_avg_sq's), so that rank 0 holds one unit's moments at a time, not
  // all of them (280 GB at 70B). Sharded, a collective: every GPU calls it (it gathers the shards
  // through the gradient buffer (ZeRO-2: unit by unit through the units' buffers), so between an
  // optimizer step and the next zero_grad). Where keep is false it runs all of its gathers at once
  // and returns nothing; where keep is true the tensors' produce() run the gathers, and must run in
  // the planned order (a tensor produced after a later one is an Error); finish_optimizer_state()
  // then runs the gathers no produce() reached (a save that failed part-way, a tensor not written),
  // so that every GPU has taken part in every gather.
  virtual std::vector<io::PlannedTensor> stream_optimizer_state(bool keep) = 0;
  virtual void finish_optimizer_state() = 0;
  // The same, whole: every moment brought to the host (where keep is true; elsewhere an empty map).
  std::map<std::string, Tensor> optimizer_state(bool keep = true) {
    std::map<std::string, Tensor> state;
    for (const io::PlannedTensor& t : stream_optimizer_state(keep)) state[t.name] = t.produce();
    finish_optimizer_state();
    return state;
  }
  // A state as optimizer_state() (or the CPU AdamW::state()) wrote it, whole: each GPU takes its
  // shard of it. Errors name `where` and the entry.
  virtual void load_optimizer_state(const std::map<std::string, Tensor>& state, int64_t steps,
                                    const std::string& where) = 0;

  // The planned device memory and what the driver reports in use.
  virtual std::string memory_report() const = 0;
  // The attention kernels the step runs and why: the user's (KTUNE_CUDA_ATTENTION), or the trials that
  // chose them on this GPU (auto, model/cuda/attention_choice.h).
  virtual std::string attention_report() const = 0;
};

// How the GPU step reads a host parameter at its upload: elements [first, first + count) of it, as
// f32, into out; called a chunk at a time (cuda::Decoder::upload_read), one parameter at a time, never
// for a parameter whose value the host holds in bf16 as it stores it (its pages go up as they are).
// The recipe's: model::read_stored_f32, a value mapped in its file's other dtype read as the model
// stores it (no copy of the whole value); the tests': a CPU QLoRA adapter's dequantised base.
using HostReader = std::function<void(const model::Parameter&, int64_t first, int64_t count, float* out)>;

// Plans the device memory and uploads the host model: `host` is its parameters() (with its LoRA
// adapters attached, if any), each read as `read` gives it (nullptr: model::read_stored_f32). seed: of the
// stochastic rounding. gpus: the data-parallel group of a distributed run (an NCCL group over the
// workers' GPUs; any ProcessGroup whose collectives take this device's pointers), nullptr for one
// GPU; plan.setup.optimizer_shards > 1 must be its size (and optimizer_shard its rank). Throws
// ktune::Error in a build without the CUDA backend, when the plugin cannot be loaded (naming its
// path), or naming a parameter the two models do not share.
std::unique_ptr<CudaTrainer> make_cuda_trainer(const std::vector<model::Parameter*>& host, const CudaStepPlan& plan,
                                               uint64_t seed, const HostReader& read = nullptr,
                                               dist::ProcessGroup* gpus = nullptr);

// The GPUs' group of a distributed GPU run: NCCL over the workers' GPUs (each worker selected its own
// first, select_cuda_device), joined through the launcher's store under `prefix`. The plugin makes
// it (dist/cuda/process_group_nccl.cpp is compiled into it, not into ktune_dist), so that the emulated step
// (tests/kernels/cuda/emulator) brings its fake NCCL along and a distributed GPU run is tested in CI
// without GPUs. Throws ktune::Error as make_nccl_process_group does (a build without NCCL, a peer
// that never joins). A collective that waits longer than `timeout` for a peer ends in an Error.
std::unique_ptr<dist::ProcessGroup> make_gpu_process_group(dist::TcpStore& store, const std::string& prefix, int rank,
                                                           int size, std::chrono::milliseconds timeout);

// The GPU step's device memory for `plan` (cuda::Decoder::plan: what a run with it allocates on each
// GPU), computed by the plugin without touching any device, so that it answers on a machine without
// a GPU (`ktune plan --device cuda`). Throws ktune::Error as make_cuda_trainer does (no backend, no
// plugin) and for a plan the GPU step refuses (naming why).
cuda::Decoder::MemoryPlan plan_cuda_memory(const CudaStepPlan& plan);

// The plugin's exported functions (C linkage, so that dlsym finds them by these names).
extern "C" {
using CudaStepPlanMemoryFn = void (*)(const CudaStepPlan* plan, cuda::Decoder::MemoryPlan* out);
using CreateCudaTrainerFn = CudaTrainer* (*)(const std::vector<model::Parameter*>* host, const CudaStepPlan* plan,
                                             uint64_t seed, const HostReader* read, dist::ProcessGroup* gpus);
using CudaStepDeviceCountFn = int (*)();
using CudaStepSelectDeviceFn = void (*)(int index);
using CudaStepMakeProcessGroupFn = dist::ProcessGroup* (*)(dist::TcpStore* store, const std::string* prefix, int rank,
                                                          int size, int64_t timeout_ms);
}
// A GPU step's T: its batch's longest row rounded up to a multiple of this (step_seq_len). Every
// kernel takes any T; the rounding keeps the distinct GEMM shapes (cuBLASLt plans) few and the rows
// of the attention's (T, T) scores 64-byte aligned, for at most 15 positions of padding a row.
inline constexpr int64_t kGpuSeqLenMultiple = 16;

inline constexpr const char* kCudaStepPlugin = "libktune_cuda_step.so";
inline constexpr const char* kCreateCudaTrainerSymbol = "ktune_create_cuda_trainer";
inline constexpr const char* kCudaStepDeviceCountSymbol = "ktune_cuda_step_device_count";
inline constexpr const char* kCudaStepSelectDeviceSymbol = "ktune_cuda_step_select_device";
inline constexpr const char* kCudaStepMakeProcessGroupSymbol = "ktune_cuda_step_make_process_group";
inline constexpr const char* kCudaStepPlanMemorySymbol = "ktune_cuda_step_plan_memory";

// This build has the CUDA backend; the GPUs it can see (0 without a driver or without the backend).
// A plugin named by KTUNE_CUDA_STEP_PLUGIN is asked instead: the emulated step
// (tests/kernels/cuda/emulator) drives one device without a GPU, so that CI runs the recipes' GPU
// path. Without that env nothing is loaded to count: the CUDA runtime answers.
bool cuda_backend_built();
int cuda_devices_visible();
// A worker's GPU (its LOCAL_RANK), before anything is allocated or an NCCL group is joined (through
// the plugin, which a GPU run loads anyway: cuda::set_device).
void select_cuda_device(int index);

}  // namespace ktune::train
