// Laying a batch into a fixed (B, T) (see fixed_shape_batch.h).
#include "data/fixed_shape_batch.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace ktune {

FixedShapeBatch to_fixed_shape(const Batch& batch, int64_t B, int64_t T, int32_t pad_id, bool packed) {
  if (batch.batch_size > B || batch.seq_len > T)
    throw Error("batch " + std::to_string(batch.index) + " of epoch " + std::to_string(batch.epoch),
                "is (" + std::to_string(batch.batch_size) + ", " + std::to_string(batch.seq_len) +
                    ") tokens; the step was planned for at most (" + std::to_string(B) + ", " + std::to_string(T) + ")");
  FixedShapeBatch out;
  out.batch_size = B;
  out.seq_len = T;
  out.tokens.assign(size_t(B * T), pad_id);
  out.labels.assign(size_t(B * T), -100);
  const int64_t n = batch.seq_len;
  for (int64_t b = 0; b < batch.batch_size; ++b) {
    std::copy_n(batch.tokens.begin() + b * n, n, out.tokens.begin() + b * T);
    std::copy_n(batch.labels.begin() + b * n, n, out.labels.begin() + b * T);
  }
  if (!packed) return out;
  check(int64_t(batch.positions.size()) == batch.batch_size * n && batch.doc_ids.size() == batch.positions.size(),
        "batch " + std::to_string(batch.index) + " of epoch " + std::to_string(batch.epoch),
        "a packed batch needs positions and doc_ids of (batch_size, seq_len)");
  out.positions.assign(size_t(B * T), 0);
  out.doc_ids.assign(size_t(B * T), kFixedShapePaddingDoc);
  for (int64_t b = 0; b < batch.batch_size; ++b) {
    std::copy_n(batch.positions.begin() + b * n, n, out.positions.begin() + b * T);
    std::copy_n(batch.doc_ids.begin() + b * n, n, out.doc_ids.begin() + b * T);
  }
  return out;
}

int64_t step_seq_len(const Batch& batch, int64_t multiple, int64_t max_seq_len) {
  check(multiple > 0, "step_seq_len", "the multiple must be positive, got " + std::to_string(multiple));
  const int64_t rounded = (batch.seq_len + multiple - 1) / multiple * multiple;
  return std::max(batch.seq_len, std::min(rounded, max_seq_len));
}

}  // namespace ktune
