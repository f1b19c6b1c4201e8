#include "model/adapters/frozen_nf4_adapter.h"

#include "core/error.h"
#include "model/decoder.h"

namespace ktune::model {

FrozenNf4Adapter::FrozenNf4Adapter(Linear& base, cpu::Nf4Arithmetic arithmetic, bool on_demand)
    : module_(base.name), nf4_(base, arithmetic, on_demand) {
  check(!base.bias || !base.bias->trainable, module_, "a frozen NF4 projection's bias must be frozen too");
}

void FrozenNf4Adapter::forward(float* y, const float* x, int64_t N, const Linear& base, float* saved) {
  nf4_.forward(y, x, N, base.bias ? base.bias->value.f32() : nullptr);  // (N, out)
}

void FrozenNf4Adapter::backward(float* dx, const float* dy, const float* x, int64_t N, const Linear& base,
                                const float* saved, float* scratch) {
  if (dx) nf4_.backward_input(dx, dy, N);  // dx (N, in) += dy (N, out) W; nothing trains
}

bool qlora_quantizes_unadapted(Family family) { return family != Family::Qwen2; }

std::vector<std::shared_ptr<FrozenNf4Adapter>> attach_frozen_nf4(Decoder& decoder, cpu::Nf4Arithmetic arithmetic,
                                                                 bool on_demand) {
  std::vector<std::shared_ptr<FrozenNf4Adapter>> frozen;
  for (Linear* linear : decoder.linears()) {
    if (linear->adapter || linear->name.rfind("model.layers.", 0) != 0) continue;
    auto adapter = std::make_shared<FrozenNf4Adapter>(*linear, arithmetic, on_demand);
    linear->adapter = adapter;
    frozen.push_back(adapter);
  }
  decoder.adapters_changed();
  return frozen;
}

}  // namespace ktune::model
