// FlatShardLayout: the arithmetic of sharded data parallelism, kept pure so that it can be tested
// (and printed by `ktune plan`) without a process group. The parameters of one unit (a decoder
// layer, or the rest of the model) are laid end to end in one flat f32 buffer; each parameter
// starts at a multiple of kAlignFloats (64 bytes, so a gathered parameter is as aligned as an
// allocated one), and the buffer is padded with zeros to a multiple of kAlignFloats · W, so that
// rank r owns the contiguous, aligned shard [r · S, (r+1) · S) with S = padded / W.
// A parameter may straddle shards; param_in_shard() says which part of it a rank owns.
//
//   flat:   | p0 ....... |pad| p1 ...... |pad| p2 .. |pad ... pad|     padded = W · S
//   ranks:  |<--- rank 0: S --->|<--- rank 1: S --->|<-- rank 2: S -->|
//
// It deliberately knows nothing of tensors, names or collectives: sizes in, offsets out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ktune::train {

struct FlatShardLayout {
  static constexpr int64_t kAlignFloats = 16;

  int world_size = 1;
  std::vector<int64_t> numel;   // per parameter
  std::vector<int64_t> offset;  // per parameter, into the flat buffer (multiples of kAlignFloats)
  int64_t padded = 0;           // flat length: a multiple of kAlignFloats · world_size (0 when empty)

  // Lays out parameters of these sizes for world_size ranks (numel ≥ 0, world_size ≥ 1).
  static FlatShardLayout plan(const std::vector<int64_t>& numels, int world_size);

  int64_t shard_size() const { return padded / world_size; }
  int64_t shard_begin(int rank) const { return int64_t(rank) * shard_size(); }
  int64_t payload() const;  // Σ numel: the floats that are not padding
  // The part of parameter i that rank owns, in flat coordinates [first, second); empty when
  // first == second.
  std::pair<int64_t, int64_t> param_in_shard(size_t i, int rank) const;
};

// Which unit a parameter belongs to: its decoder layer ("model.layers.7.…" and the PEFT-named
// adapter "base_model.model.model.layers.7.…" → 7), or -1 for the rest (embeddings, final norm,
// output projection).
int64_t layer_of_parameter(const std::string& name);

}  // namespace ktune::train
