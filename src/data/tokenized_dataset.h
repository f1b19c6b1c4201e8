// A tokenized dataset held as compactly as it can be: every sample's token ids in one flat int32
// buffer, a parallel byte per token saying whether it is trained on (label = token) or not
// (label = -100), and offsets. Memory is 5 bytes a token plus 8 a sample, whatever the source;
// no per-sample allocations. The dataset is immutable once built and may be shared by loaders.
//
// Deliberately not here: how samples were made (dataset_builders.h), order, packing, batches
// (data_loader.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ktune {

inline constexpr int32_t kIgnoreIndex = -100;  // CROSS_ENTROPY_IGNORE_IDX

class TokenizedDataset {
 public:
  TokenizedDataset() : offsets_{0} {}

  // Appends one sample. trained[i] != 0 where tokens[i] is a target (sizes must match).
  void add(std::span<const int32_t> tokens, std::span<const uint8_t> trained);

  int64_t size() const { return (int64_t)offsets_.size() - 1; }
  int64_t num_tokens() const { return (int64_t)tokens_.size(); }
  int64_t length(int64_t i) const { return offsets_[i + 1] - offsets_[i]; }
  std::span<const int32_t> tokens(int64_t i) const {
    return {tokens_.data() + offsets_[i], (size_t)length(i)};
  }
  std::span<const uint8_t> trained(int64_t i) const {
    return {trained_.data() + offsets_[i], (size_t)length(i)};
  }
  // Labels as torchtune's SFTTransform makes them: the token where trained, -100 elsewhere.
  // Unshifted: the recipe shifts them by one position, as torchtune's recipes do.
  std::vector<int32_t> labels(int64_t i) const;
  // Tokens a step has a loss on: the trained ones after each sample's first (the shifted labels
  // predict token k from the tokens before it, so a sample's first token is never a target).
  int64_t num_targets() const;

  // Build statistics: samples longer than max_seq_len that were cut, rows read.
  int64_t num_truncated = 0;
  int64_t num_rows_read = 0;
  int64_t max_seq_len = 0;  // the limit samples were cut to (0: none)
  // Samples of no token (empty text, which Llama 3's tokenizer encodes as nothing; torchtune keeps
  // them, and a step of only such samples fails): how many, and the first's row ("file: row 3 (line 4)").
  int64_t num_empty = 0;
  std::string first_empty;

  void shrink_to_fit();
  size_t memory_bytes() const;  // bytes held by the buffers

 private:
  std::vector<int32_t> tokens_;
  std::vector<uint8_t> trained_;
  std::vector<int64_t> offsets_;  // (size + 1)
};

}  // namespace ktune
