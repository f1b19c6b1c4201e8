// Loading the GPU step (the plugin beside the binary, see cuda_trainer.h) and the GPU questions the
// recipe asks before it: is there a backend, how many GPUs, which one is this worker's.
#include "train/cuda_trainer.h"

#include <string>

#include "core/error.h"

#if KTUNE_HAS_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#endif

namespace ktune::train {

#if KTUNE_HAS_CUDA

namespace {

// The plugin sits beside the running binary (bin/ktune and bin/libktune_cuda_step.so); env
// KTUNE_CUDA_STEP_PLUGIN names it for a process that is not ktune (a test, an embedding program).
std::string plugin_path() {
  if (const char* path = std::getenv("KTUNE_CUDA_STEP_PLUGIN"); path && *path) return path;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ((ec ? std::filesystem::path(".") : exe.parent_path()) / kCudaStepPlugin).string();
}

// The plugin's functions, loaded once (never closed: trainers live until exit).
struct Plugin {
  CreateCudaTrainerFn create = nullptr;
  CudaStepDeviceCountFn device_count = nullptr;
  CudaStepSelectDeviceFn select_device = nullptr;
  CudaStepMakeProcessGroupFn make_process_group = nullptr;
  CudaStepPlanMemoryFn plan_memory = nullptr;
};

const Plugin& plugin() {
  static Plugin loaded;
  if (loaded.create) return loaded;
  const std::string path = plugin_path();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw Error(path, std::string("cannot load the GPU step: ") + dlerror());
  auto symbol = [&](const char* name) {
    void* f = dlsym(handle, name);
    if (!f) throw Error(path, std::string("has no ") + name + ": " + dlerror());
    return f;
  };
  Plugin p;
  p.device_count = reinterpret_cast<CudaStepDeviceCountFn>(symbol(kCudaStepDeviceCountSymbol));
  p.select_device = reinterpret_cast<CudaStepSelectDeviceFn>(symbol(kCudaStepSelectDeviceSymbol));
  p.create = reinterpret_cast<CreateCudaTrainerFn>(symbol(kCreateCudaTrainerSymbol));
  p.make_process_group = reinterpret_cast<CudaStepMakeProcessGroupFn>(symbol(kCudaStepMakeProcessGroupSymbol));
  p.plan_memory = reinterpret_cast<CudaStepPlanMemoryFn>(symbol(kCudaStepPlanMemorySymbol));
  loaded = p;
  return loaded;
}

// KTUNE_CUDA_STEP_PLUGIN set: that plugin answers the device questions too.
bool plugin_named() {
  const char* path = std::getenv("KTUNE_CUDA_STEP_PLUGIN");
  return path && *path;
}

}  // namespace

std::unique_ptr<CudaTrainer> make_cuda_trainer(const std::vector<model::Parameter*>& host, const CudaStepPlan& plan,
                                               uint64_t seed, const HostReader& read, dist::ProcessGroup* gpus) {
  const HostReader as_stored = model::read_stored_f32;
  return std::unique_ptr<CudaTrainer>(plugin().create(&host, &plan, seed, read ? &read : &as_stored, gpus));
}

std::unique_ptr<dist::ProcessGroup> make_gpu_process_group(dist::TcpStore& store, const std::string& prefix, int rank,
                                                           int size, std::chrono::milliseconds timeout) {
  return std::unique_ptr<dist::ProcessGroup>(
      plugin().make_process_group(&store, &prefix, rank, size, int64_t(timeout.count())));
}

cuda::Decoder::MemoryPlan plan_cuda_memory(const CudaStepPlan& plan) {
  cuda::Decoder::MemoryPlan memory;
  plugin().plan_memory(&plan, &memory);
  return memory;
}

bool cuda_backend_built() { return true; }

int cuda_devices_visible() {
  if (plugin_named()) return plugin().device_count();
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {  // no driver, no device: not an error here
    cudaGetLastError();
    return 0;
  }
  return n;
}

// Only a run that trains on a GPU selects one, and it loads the plugin next anyway.
void select_cuda_device(int index) { plugin().select_device(index); }

#else  // no CUDA backend in this build

namespace {
constexpr const char* kNoCudaBackend =
    "this build has no CUDA backend (configured with KTUNE_CUDA=OFF or without nvcc)";
}  // namespace

std::unique_ptr<CudaTrainer> make_cuda_trainer(const std::vector<model::Parameter*>&, const CudaStepPlan&, uint64_t,
                                               const HostReader&, dist::ProcessGroup*) {
  throw Error("device=cuda", kNoCudaBackend);
}

std::unique_ptr<dist::ProcessGroup> make_gpu_process_group(dist::TcpStore&, const std::string& prefix, int rank, int,
                                                           std::chrono::milliseconds) {
  throw Error("GPU process group '" + prefix + "' rank " + std::to_string(rank), "this build has no CUDA backend");
}

cuda::Decoder::MemoryPlan plan_cuda_memory(const CudaStepPlan&) {
  throw Error("device=cuda", kNoCudaBackend);
}

bool cuda_backend_built() { return false; }
int cuda_devices_visible() { return 0; }
void select_cuda_device(int index) { throw Error("GPU " + std::to_string(index), "this build has no CUDA backend"); }

#endif

}  // namespace ktune::train
