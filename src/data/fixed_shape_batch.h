// An unpacked batch laid into one fixed (B, T) shape, for a step whose memory is planned once for
// that shape (the GPU step, model/cuda/decoder.h): each row's tokens and (already shifted) labels
// copied to the front of its row, the rest padding (token pad_id, label -100), and rows beyond the
// batch's own all padding. Causal attention keeps the padding after a row's tokens from reaching
// them, and its labels are ignored, so the loss and gradients are those of the batch as collated.
// It deliberately takes no packed batch: packed rows need document masking, which the padding
// here cannot give (their doc ids would be lost).
#pragma once

#include <cstdint>
#include <vector>

#include "data/data_loader.h"

namespace ktune {

struct FixedShapeBatch {
  int64_t batch_size = 0, seq_len = 0;  // B, T
  std::vector<int32_t> tokens, labels;  // each (B, T)
};

// batch: unpacked, labels shifted (shift_labels). Throws ktune::Error when it does not fit (B, T).
FixedShapeBatch to_fixed_shape(const Batch& batch, int64_t B, int64_t T, int32_t pad_id);

}  // namespace ktune
