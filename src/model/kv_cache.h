// The keys and values generation keeps per layer, so that each new token runs through the model
// alone instead of the whole prefix again (Decoder::forward_cached). Keys are kept after rotary
// embedding, as attention reads them. Allocated once, for a capacity of tokens (prompt + answer),
// f32: a layer holds (capacity, Hkv * D) keys and as many values.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace ktune::model {

class KvCache {
 public:
  KvCache(const ModelConfig& config, int64_t capacity);

  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }  // tokens whose keys and values are held
  int64_t num_layers() const { return int64_t(keys_.size()); }
  int64_t row_floats() const { return row_floats_; }  // Hkv * D

  // (capacity, Hkv * D) of layer l; rows [0, length) hold tokens so far.
  float* keys(int64_t layer) { return keys_[size_t(layer)].f32(); }
  float* values(int64_t layer) { return values_[size_t(layer)].f32(); }
  // Copies n tokens' keys and values, k and v (n, Hkv * D), into layer l at rows [length, length + n).
  // The length itself moves on only with advance(), once every layer has its rows.
  void write(int64_t layer, const float* k, const float* v, int64_t n);
  // Throws an Error unless n more tokens fit.
  void reserve(int64_t n) const;
  void advance(int64_t n);
  void clear() { length_ = 0; }
  // Holds what `other` holds (its length and rows), as a beam that continues another's prefix
  // (model/beam_search.h). Throws an Error unless both have the same layers, row size and room.
  void copy_from(const KvCache& other);

 private:
  int64_t capacity_ = 0, length_ = 0, row_floats_ = 0;
  std::vector<Tensor> keys_, values_;
};

}  // namespace ktune::model
