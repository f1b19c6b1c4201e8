// A batch laid into one fixed (B, T) shape, for a step whose memory is planned once for that shape
// (the GPU step, model/cuda/decoder.h): each row's tokens and (already shifted) labels copied to the
// front of its row, the rest padding (token pad_id, label -100), and rows beyond the batch's own all
// padding. Unpacked, causal attention keeps the padding after a row's tokens from reaching them, and
// its labels are ignored, so the loss and gradients are those of the batch as collated. Packed, the
// rows' positions and doc ids come along too, the added padding at position 0 in a document of its
// own (kFixedShapePaddingDoc), so that attention keeps every packed sample, and the padding, apart.
// step_seq_len() picks a T per batch for a step that takes any T up to its planned one.
#pragma once

#include <cstdint>
#include <vector>

#include "data/data_loader.h"

namespace ktune {

// The doc id of the padding to_fixed_shape adds to a packed batch: no pack uses it (theirs count from 0).
inline constexpr int32_t kFixedShapePaddingDoc = -1;

struct FixedShapeBatch {
  int64_t batch_size = 0, seq_len = 0;  // B, T
  std::vector<int32_t> tokens, labels;  // each (B, T)
  // Packed batches only (empty otherwise): RoPE positions and document ids, each (B, T).
  std::vector<int32_t> positions, doc_ids;
  bool packed() const { return !doc_ids.empty(); }
};

// batch: labels shifted (shift_labels); packed: keep its positions and doc ids (a packed batch's
// rows hold several samples). Throws ktune::Error when it does not fit (B, T).
FixedShapeBatch to_fixed_shape(const Batch& batch, int64_t B, int64_t T, int32_t pad_id, bool packed = false);

// The T to lay `batch` into for a step planned for at most max_seq_len: the batch's own longest row
// (its collated seq_len: an unpacked batch is padded to its longest sample) rounded up to a multiple
// of `multiple` (> 0), capped at max_seq_len, so that a batch of short samples pays for its own
// length and not for the longest of the dataset, while the steps see few distinct shapes. A batch
// longer than max_seq_len keeps its length (to_fixed_shape then refuses it, naming it).
int64_t step_seq_len(const Batch& batch, int64_t multiple, int64_t max_seq_len);

}  // namespace ktune
