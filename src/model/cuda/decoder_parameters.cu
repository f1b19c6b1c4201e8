// cuda::Decoder's parameters by name: their initialisation (bf16, NF4 quantised on the host), upload
// (f32, bf16 or read in chunks; a sharded layer's piece only), download (a sharded layer from its
// gathered slot), the gradient buffer and the AdamW step on this rank's shard.
#include "model/cuda/decoder_impl.h"

namespace ktune::cuda {

using namespace decoder_internal;

namespace {

__global__ void f32_to_bf16_kernel(__nv_bfloat16* y, const float* x, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

// x[i] = bf16(uniform(-bound, bound)) from (key, first + i); bound == 0 fills with `fill`. first: the
// index of x[0] in the whole tensor (an NF4 lm_head is drawn a block of rows at a time).
__global__ void init_kernel(__nv_bfloat16* x, int64_t n, uint64_t key, float bound, float fill, int64_t first) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (bound == 0.0f) {
    x[i] = __float2bfloat16_rn(fill);
    return;
  }
  const uint64_t bits = splitmix64(key ^ (uint64_t(first + i) * 0xd1342543de82ef95ull));
  const float u = float(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  x[i] = __float2bfloat16_rn((2.0f * u - 1.0f) * bound);
}

// x (numel) quantised on the host (the CPU quantiser, in bf16 arithmetic: torchao's NF4 of a bf16
// model, as the GPU step trains): codes (numel / 2) bytes, scales (numel / 64) f32, each a bf16 value.
struct Nf4OnHost {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

// The scales as the device holds them: bf16, each exactly its f32 value (the bf16 arithmetic's
// q / factor + mean is rounded to bf16); refused otherwise, as a scale the device would change.
std::vector<bf16_t> scales_as_bf16(const std::vector<float>& scales) {
  std::vector<bf16_t> held(scales.size());
  for (size_t i = 0; i < scales.size(); ++i) {
    held[i] = ktune::f32_to_bf16(scales[i]);
    const float back = ktune::bf16_to_f32(held[i]);
    check(back == scales[i] || (std::isnan(back) && std::isnan(scales[i])), "cuda decoder: NF4",
          "block scale " + std::to_string(i) + " is not a bf16 value");
  }
  return held;
}
Nf4OnHost quantize_on_host(const float* x, int64_t numel) {
  Nf4OnHost q{std::vector<uint8_t>(size_t(numel / 2)), std::vector<float>(size_t(numel / cpu::kNf4BlockSize))};
  cpu::nf4_quantize(q.codes.data(), q.scales.data(), x, numel, cpu::Nf4Arithmetic::kBf16);
  return q;
}

// The whole of q into codes and scales on the device (p's own, or its layer's slot).
void copy_nf4_to_device(uint8_t* codes, bf16_t* scales, const Nf4OnHost& q) {
  copy_to_device(codes, q.codes.data(), q.codes.size());
  const std::vector<bf16_t> held = scales_as_bf16(q.scales);
  copy_to_device(scales, held.data(), held.size() * sizeof(bf16_t));
}

}  // namespace

namespace decoder_internal {

void convert_to_bf16(bf16_t* y, const float* x, int64_t n) {
  f32_to_bf16_kernel<<<blocks_for(n, 256), 256>>>(dev(y), x, n);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void fill_bf16(bf16_t* x, int64_t n, float value) {
  init_kernel<<<blocks_for(n, 256), 256>>>(dev(x), n, 0, 0.0f, value, 0);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace decoder_internal

void Decoder::init_parameters(uint64_t seed) {
  Impl& s = *impl_;
  const float normal_bound = 0.02f * std::sqrt(3.0f);  // uniform with std 0.02
  std::vector<bool> is_norm(params_.size(), false), is_a(params_.size(), false), is_b(params_.size(), false);
  std::vector<bool> is_bias(params_.size(), false);
  for (auto& layer : s.layers) {
    for (int norm : {layer.norm_attn, layer.norm_mlp, layer.norm_attn_out, layer.norm_mlp_out})
      if (norm >= 0) is_norm[size_t(norm)] = true;
    for (auto& lin : layer.proj) {
      if (lin.bias >= 0) is_bias[size_t(lin.bias)] = true;
      if (lin.lora_a >= 0) is_a[size_t(lin.lora_a)] = true;
      if (lin.lora_b >= 0) is_b[size_t(lin.lora_b)] = true;
    }
  }
  is_norm[size_t(s.final_norm)] = true;
  if (s.output.lora_a >= 0) is_a[size_t(s.output.lora_a)] = is_b[size_t(s.output.lora_b)] = true;
  // Parameter i's elements [first, first + n) (n < 0: all of them) drawn into target.
  auto draw = [&](size_t i, bf16_t* target, float bound, float fill, int64_t first = 0, int64_t n = -1) {
    if (n < 0) n = params_[i].numel;
    init_kernel<<<blocks_for(n, 256), 256>>>(dev(target), n, splitmix64(seed ^ splitmix64(i)), bound, fill, first);
    KTUNE_CUDA_CHECK_LAUNCH();
  };
  // An NF4 base's values (host f32): drawn into the dequantisation scratch (lm_head's a block of rows at
  // a time; into a buffer of its own where the fused GEMM left the scratch smaller than the block, or
  // none), to be quantised on the host as an upload.
  auto nf4_drawn = [&](size_t i, float bound, float fill) {
    const DeviceParameter& p = params_[i];
    std::vector<bf16_t> drawn(size_t(p.numel));
    const int64_t block = int(i) == s.output.weight ? s.head_rows * p.shape[1] : p.numel;
    DeviceBuffer own_scratch;
    bf16_t* scratch = s.nf4_weight;
    if (plan_bytes_.nf4_scratch < size_t(block) * sizeof(bf16_t)) {
      own_scratch = DeviceBuffer(size_t(block) * sizeof(bf16_t));
      scratch = own_scratch.as<bf16_t>();
    }
    for (int64_t first = 0; first < p.numel; first += block) {
      const int64_t n = std::min(block, p.numel - first);
      draw(i, scratch, bound, fill, first, n);
      copy_to_host(drawn.data() + first, scratch, size_t(n) * sizeof(bf16_t));  // synchronous
    }
    std::vector<float> x(drawn.size());
    for (size_t j = 0; j < x.size(); ++j) x[j] = bf16_to_f32(drawn[j]);
    return x;
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    DeviceParameter& p = params_[i];
    float bound = normal_bound, fill = 0.0f;
    if (is_norm[i]) bound = 0.0f, fill = 1.0f - config_.norm_weight_offset;  // the identity: (offset + w) = 1
    if (is_bias[i]) bound = 0.0f, fill = 0.0f;
    if (is_a[i]) bound = 1.0f / std::sqrt(float(p.shape[1]));
    if (is_b[i]) bound = 0.0f, fill = 0.0f;
    if (p.nf4_codes) {  // sharded: this rank's piece of the codes and scales only
      const std::vector<float> x = nf4_drawn(i, bound, fill);
      upload_nf4(p, reader_of(x.data()), kUploadChunk);
      continue;
    }
    draw(i, p.value, bound, fill);
    if (weights_sharded(p)) {  // drawn whole into the slot, this rank's elements kept
      const WeightRange mine = weight_piece_range(p.weight_layer, p.weight_offset, p.numel);
      if (mine.begin < mine.end)
        copy_on_device(piece_value(p.weight_layer, p.weight_offset + mine.begin), p.value + mine.begin,
                       size_t(mine.end - mine.begin) * sizeof(bf16_t));
    }
  }
  // DoRA: m starts at the row norms of W (B = 0, so ‖W + s B A‖ = ‖W‖), as PEFT.
  for (const Impl::Layer& layer : s.layers)
    for (const Impl::Linear& lin : layer.proj) {
      if (lin.magnitude < 0) continue;
      // shard_weights: the slot holds another layer's weights now; this W drawn into it again (NF4:
      // drawn, quantised and copied whole into the slot).
      const DeviceParameter& base = params_[size_t(lin.weight)];
      if (weights_sharded(base) && base.nf4_codes)
        copy_nf4_to_device(base.nf4_codes, base.nf4_scales,
                           quantize_on_host(nf4_drawn(size_t(lin.weight), normal_bound, 0.0f).data(), base.numel));
      else if (weights_sharded(base))
        draw(size_t(lin.weight), base.value, normal_bound, 0.0f);
      const LinearRef w = s.lin(lin);
      s.dora_norms(w, s.base_weight(w));
      convert_to_bf16(params_[size_t(lin.magnitude)].value, w.norm, lin.out);
    }
  if (s.output.magnitude >= 0) {
    const LinearRef w = s.lin(s.output);
    s.head_dora_norms(w);
    convert_to_bf16(params_[size_t(s.output.magnitude)].value, w.norm, w.out);
  }
  s.forget_slots();  // the slots hold the last layers' drawn values, not gathered layers
  zero_grad();
  KTUNE_CUDA_CHECK(cudaMemsetAsync(impl_->optim_arena->data(), 0, impl_->optim_arena->used(), nullptr));
  synchronize();
}

// ---------------------------------------------------------------------------------------------
// Parameters by name

DeviceParameter& Decoder::parameter(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name) return p;
  throw Error("cuda decoder: parameter " + name, "no such parameter");
}

int64_t Decoder::parameter_count(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& p : params_)
    if (!trainable_only || p.grad) n += p.numel;
  return n;
}

Decoder::ValueReader Decoder::reader_of(const float* x) {
  return [x](int64_t first, int64_t count, float* out) { std::memcpy(out, x + first, size_t(count) * sizeof(float)); };
}

void Decoder::upload(const std::string& name, const std::vector<float>& values) {
  const DeviceParameter& p = parameter(name);
  check(int64_t(values.size()) == p.numel, "cuda decoder: parameter " + name,
        "upload of " + std::to_string(values.size()) + " values, the parameter has " + std::to_string(p.numel));
  upload_read(name, reader_of(values.data()));
}

void Decoder::upload_bf16(const std::string& name, const bf16_t* values, int64_t numel) {
  DeviceParameter& p = parameter(name);
  check(numel == p.numel, "cuda decoder: parameter " + name,
        "upload of " + std::to_string(numel) + " values, the parameter has " + std::to_string(p.numel));
  if (p.nf4_codes)  // widened exactly: the codes of the values' f32, as upload() makes them
    return upload_read(name, [values](int64_t first, int64_t count, float* out) {
      for (int64_t i = 0; i < count; ++i) out[i] = ktune::bf16_to_f32(values[first + i]);
    });
  store_bf16(p, values);
}

void Decoder::upload_read(const std::string& name, const ValueReader& read, int64_t chunk) {
  const DeviceParameter& p = parameter(name);
  check(chunk >= 1, "cuda decoder: parameter " + name, "an upload reads at least one value at a time");
  if (p.nf4_codes) return upload_nf4(p, read, chunk);
  const bool sharded = weights_sharded(p);  // ZeRO-3: only this rank's piece is read and stored
  const WeightRange mine = sharded ? weight_piece_range(p.weight_layer, p.weight_offset, p.numel) : WeightRange{0, p.numel};
  std::vector<float> wide;
  std::vector<bf16_t> narrow;
  for (int64_t first = mine.begin; first < mine.end; first += chunk) {
    const int64_t n = std::min(chunk, mine.end - first);
    wide.resize(size_t(n));
    narrow.resize(size_t(n));
    read(first, n, wide.data());
    for (int64_t i = 0; i < n; ++i) narrow[size_t(i)] = ktune::f32_to_bf16(wide[size_t(i)]);
    bf16_t* place = sharded ? piece_value(p.weight_layer, p.weight_offset + first) : p.value + first;
    copy_to_device(place, narrow.data(), size_t(n) * sizeof(bf16_t));
  }
  if (sharded) slot_stale(p.weight_layer);
}

void Decoder::store_bf16(const DeviceParameter& p, const bf16_t* host) {
  if (!weights_sharded(p)) {
    copy_to_device(p.value, host, size_t(p.numel) * sizeof(bf16_t));
    return;
  }
  write_piece(p.weight_layer, p.weight_offset, host, p.numel);  // ZeRO-3: this rank's elements
}

void Decoder::upload_nf4(const DeviceParameter& p, const ValueReader& read, int64_t chunk) {
  const int64_t block = cpu::kNf4BlockSize, blocks_a_read = std::max<int64_t>(1, chunk / block);
  const cpu::Nf4Arithmetic bf16 = cpu::Nf4Arithmetic::kBf16;
  Nf4OnHost q{std::vector<uint8_t>(size_t(p.numel / 2)), std::vector<float>(size_t(p.numel / block))};
  std::vector<float> wide;
  // blocks [first, end): their codes into q and their absmax into q.scales, or (codes false) the absmax alone
  auto read_blocks = [&](int64_t first, int64_t end, bool codes) {
    for (int64_t b = first; b < end; b += blocks_a_read) {
      const int64_t n = std::min(blocks_a_read, end - b) * block;
      wide.resize(size_t(n));
      read(b * block, n, wide.data());
      if (codes)
        cpu::nf4_quantize_blocks(q.codes.data() + b * block / 2, q.scales.data() + b, wide.data(), n, bf16);
      else
        cpu::nf4_block_absmax(q.scales.data() + b, wide.data(), n, bf16);
    }
  };
  const int64_t blocks = p.numel / block;
  if (!weights_sharded(p)) {
    read_blocks(0, blocks, true);
    cpu::nf4_double_quantize_scales(q.scales.data(), blocks, bf16);
    return copy_nf4_to_device(p.nf4_codes, p.nf4_scales, q);
  }
  // ZeRO-3: this rank's part of the codes' and the scales' bytes, counted in bf16 elements as the unit
  // is. Only the 64-value blocks whose codes that part holds are quantised (a bf16 element of the codes
  // is 4 values, of block e / 16): 1/W of the quantising on each GPU. Every block's absmax is read: the
  // scales are double quantised over the whole tensor (their mean, and their groups of 256).
  const int64_t code_elements = p.numel / 4, scale_elements = blocks;
  const WeightRange codes = weight_piece_range(p.weight_layer, p.weight_offset, code_elements);
  const int64_t c0 = std::min(codes.begin / 16, blocks), c1 = std::max(c0, std::min((codes.end + 15) / 16, blocks));
  read_blocks(0, c0, false);
  read_blocks(c0, c1, true);
  read_blocks(c1, blocks, false);
  cpu::nf4_double_quantize_scales(q.scales.data(), blocks, bf16);
  write_piece(p.weight_layer, p.weight_offset, q.codes.data(), code_elements);
  write_piece(p.weight_layer, p.nf4_scales_offset, scales_as_bf16(q.scales).data(), scale_elements);
}

std::vector<float> Decoder::download_value(const std::string& name) {
  DeviceParameter& p = parameter(name);
  synchronize();
  check(!weights_sharded(p) || impl_->slot_layer[impl_->slot_of(p.weight_layer)] == p.weight_layer,
        "cuda decoder: parameter " + name,
        "its layer's weights are sharded (shard_weights) and not gathered: gather_weights(" +
            std::to_string(p.weight_layer) + ") first, on every rank");
  if (p.nf4_codes) {
    std::vector<uint8_t> codes(size_t(p.numel / 2));
    std::vector<bf16_t> held(size_t(p.numel / cpu::kNf4BlockSize));
    std::vector<float> scales(held.size()), out(size_t(p.numel));
    copy_to_host(codes.data(), p.nf4_codes, codes.size());
    copy_to_host(held.data(), p.nf4_scales, held.size() * sizeof(bf16_t));
    for (size_t b = 0; b < held.size(); ++b) scales[b] = ktune::bf16_to_f32(held[b]);
    cpu::nf4_dequantize(out.data(), codes.data(), scales.data(), p.numel, cpu::Nf4Arithmetic::kBf16);
    return out;
  }
  std::vector<bf16_t> host(size_t(p.numel));
  copy_to_host(host.data(), p.value, host.size() * sizeof(bf16_t));
  std::vector<float> out(host.size());
  for (size_t i = 0; i < host.size(); ++i) out[i] = ktune::bf16_to_f32(host[i]);
  return out;
}

std::vector<float> Decoder::download_grad(const std::string& name) {
  DeviceParameter& p = parameter(name);
  check(p.grad != nullptr, "cuda decoder: parameter " + name, "is frozen: it has no gradient");
  check(!setup_.shard_gradients, "cuda decoder: parameter " + name,
        "its gradient is sharded (shard_gradients): this rank holds the reduced sums of its piece only");
  std::vector<float> out(size_t(p.numel));
  synchronize();
  copy_to_host(out.data(), p.grad, out.size() * sizeof(float));
  return out;
}

// The whole arena: the gradients, the gaps between them and the padding to whole shards.
float* Decoder::gradient_buffer(int64_t* count) {
  check(!setup_.shard_gradients, "cuda decoder",
        "with shard_gradients no buffer holds every gradient (gradient_units(), optimizer_shard().grad)");
  DeviceArena& grads = *impl_->grad_arena;
  *count = int64_t(grads.capacity() / sizeof(float));
  return static_cast<float*>(grads.data());
}

void Decoder::zero_grad() {
  DeviceArena& grads = *impl_->grad_arena;
  if (grads.capacity() > 0) KTUNE_CUDA_CHECK(cudaMemsetAsync(grads.data(), 0, grads.capacity(), nullptr));
}

void Decoder::adamw_step(const cpu::AdamWStep& st, uint64_t seed) {
  for (size_t i = 0; i < params_.size(); ++i) {
    DeviceParameter& p = params_[i];
    if (!p.m) continue;  // frozen, or none of it in this rank's shard
    const int64_t first = p.shard_begin;
    cuda::adamw_step_bf16(p.shard_value, p.shard_grad, p.m, p.v, p.shard_end - first, st,
                          splitmix64(seed ^ splitmix64(i + 1)), nullptr, first);
  }
  // ZeRO-3: a full fine-tune's pieces moved on, so the gathered layers are stale; LoRA's sharded base
  // is frozen (its pieces unchanged), so the slots still hold the layers they hold.
  if (setup_.full_finetune) impl_->forget_slots();
}

}  // namespace ktune::cuda
