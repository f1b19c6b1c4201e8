// LoRA dropout on the GPU with the CPU LoraAdapter's masks (src/model/adapters/lora_adapter.cpp),
// ported to the device: element `index` of an adapter's input x (N, in), flattened row-major over
// the micro-batch, is dropped when uniform01(seed, index) < p, where
//   uniform01(seed, i) = float(splitmix64(seed ^ splitmix64(i)) >> 40) / 2^24
//   seed = splitmix64(lora_seed ^ splitmix64(key) ^ fnv1a64(module))   (per module and micro-batch)
// with module the HF module name ("model.layers.0.self_attn.q_proj"), lora_seed the CPU
// LoraOptions::seed and key the trainer's dropout key (LoraAdapter::set_dropout_key). Kept elements
// are scaled by 1/(1 - p) (PEFT: dropout on the adapter's input only). The masks are redrawn, never
// stored: the backward recomputes the forward's from the same (seed, index).
// It deliberately does not draw from cuRAND or any stateful generator (the CPU masks are the contract).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "kernels/cuda/gemm.h"  // Stream

namespace ktune::cuda {

// The mask seed of one module for one micro-batch (host).
uint64_t lora_dropout_seed(uint64_t lora_seed, uint64_t key, const std::string& module);

// keep (n) = 1 where element i is kept, 0 where dropped (the tests compare it with the CPU's).
void lora_dropout_mask(uint8_t* keep, int64_t n, uint64_t seed, float p, Stream stream = nullptr);
// xd (n) = dropped ? 0 : x * 1/(1 - p), rounded to bf16. first: the index of x[0] in the whole input
// (a slice of rows starting at row r of an (N, in) input: r * in), so a slice gets its rows' masks.
void lora_dropout_forward(bf16_t* xd, const bf16_t* x, int64_t n, uint64_t seed, float p, int64_t first = 0,
                          Stream stream = nullptr);
// Undoes it for the input: dx (n) += dropped ? 0 : d * 1/(1 - p) (added in f32, rounded to bf16 once).
void lora_dropout_backward_add(bf16_t* dx, const bf16_t* d, int64_t n, uint64_t seed, float p, int64_t first = 0,
                               Stream stream = nullptr);
// The same into an f32 dx (the fused loss's dhidden, LoRA on lm_head): dx (n) += dropped ? 0 : d * 1/(1 - p).
void lora_dropout_backward_add(float* dx, const bf16_t* d, int64_t n, uint64_t seed, float p, int64_t first = 0,
                               Stream stream = nullptr);
// d f32 too (DoRA on lm_head with dropout: the fused loss's f32 gradient of the dropped rows).
void lora_dropout_backward_add(float* dx, const float* d, int64_t n, uint64_t seed, float p, int64_t first = 0,
                               Stream stream = nullptr);

}  // namespace ktune::cuda
