#include "model/kv_cache.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace ktune::model {

KvCache::KvCache(const ModelConfig& config, int64_t capacity)
    : capacity_(capacity), row_floats_(config.num_kv_heads * config.head_dim) {
  if (capacity <= 0) throw Error("KvCache", "capacity must be positive, not " + std::to_string(capacity));
  for (int64_t l = 0; l < config.num_layers; ++l) {
    keys_.push_back(Tensor::empty({capacity, row_floats_}));
    values_.push_back(Tensor::empty({capacity, row_floats_}));
  }
}

void KvCache::reserve(int64_t n) const {
  if (n <= 0 || length_ + n > capacity_)
    throw Error("KvCache", std::to_string(n) + " more tokens do not fit: " + std::to_string(length_) + " of " +
                               std::to_string(capacity_) + " held");
}

void KvCache::write(int64_t layer, const float* k, const float* v, int64_t n) {
  reserve(n);
  const size_t offset = size_t(length_ * row_floats_), floats = size_t(n * row_floats_);
  std::memcpy(keys(layer) + offset, k, floats * sizeof(float));
  std::memcpy(values(layer) + offset, v, floats * sizeof(float));
}

void KvCache::copy_from(const KvCache& other) {
  if (&other == this) return;
  if (other.keys_.size() != keys_.size() || other.row_floats_ != row_floats_ || other.length_ > capacity_)
    throw Error("KvCache", "cannot hold another cache of " + std::to_string(other.length_) + " tokens, " +
                               std::to_string(other.keys_.size()) + " layers, rows of " + std::to_string(other.row_floats_));
  const size_t floats = size_t(other.length_ * row_floats_);
  for (size_t l = 0; l < keys_.size(); ++l) {
    std::memcpy(keys_[l].f32(), other.keys_[l].f32(), floats * sizeof(float));
    std::memcpy(values_[l].f32(), other.values_[l].f32(), floats * sizeof(float));
  }
  length_ = other.length_;
}

void KvCache::advance(int64_t n) {
  reserve(n);
  length_ += n;
}

}  // namespace ktune::model
