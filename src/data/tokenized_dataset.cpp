// The flat sample store (see tokenized_dataset.h).
#include "data/tokenized_dataset.h"

#include "core/error.h"

namespace ktune {

void TokenizedDataset::add(std::span<const int32_t> tokens, std::span<const uint8_t> trained) {
  check(tokens.size() == trained.size(), "TokenizedDataset::add", "tokens and mask differ in length");
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  for (uint8_t t : trained) trained_.push_back(t ? 1 : 0);
  offsets_.push_back((int64_t)tokens_.size());
}

std::vector<int32_t> TokenizedDataset::labels(int64_t i) const {
  auto t = tokens(i);
  auto m = trained(i);
  std::vector<int32_t> out(t.size());
  for (size_t k = 0; k < t.size(); ++k) out[k] = m[k] ? t[k] : kIgnoreIndex;
  return out;
}

int64_t TokenizedDataset::num_targets() const {
  int64_t n = 0;
  for (int64_t i = 0; i < size(); ++i)
    for (int64_t k = offsets_[i] + 1; k < offsets_[i + 1]; ++k) n += trained_[size_t(k)] != 0;
  return n;
}

void TokenizedDataset::shrink_to_fit() {
  tokens_.shrink_to_fit();
  trained_.shrink_to_fit();
  offsets_.shrink_to_fit();
}

size_t TokenizedDataset::memory_bytes() const {
  return tokens_.capacity() * sizeof(int32_t) + trained_.capacity() + offsets_.capacity() * sizeof(int64_t);
}

}  // namespace ktune
