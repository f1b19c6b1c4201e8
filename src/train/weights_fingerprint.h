// Every rank of a distributed run starts from the same weights: each loads the same checkpoint files
// and seeds its adapters alike, so instead of sending the weights from rank 0 (a broadcast of the
// whole model, for a full fine-tune) the ranks compare fingerprints, 64-bit hashes of their
// parameters, and stop with an Error naming the rank and the parameter that differ.
// A fingerprint is not a cryptographic hash: it catches a rank that loaded other files, another
// dtype or another seed, not a rank built to collide.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/process_group.h"
#include "model/linear.h"  // Parameter

namespace ktune::train {

// A parameter's name, dtype, shape and value bytes hashed (a released or empty value: its name and
// shape only). The value's bytes go in blocks hashed in parallel and combined in order, so the
// fingerprint is the same for any thread count.
uint64_t parameter_fingerprint(const model::Parameter& p);

// Collective over `group`: every rank passes its parameters in the same order. Each rank's
// fingerprints are gathered (16 bytes a rank; per parameter only when they differ) and compared
// with rank 0's; throws ktune::Error naming `what`, the ranks that differ from rank 0 and the
// first parameter where they do, on every rank alike. A group of one: nothing to compare.
void check_same_parameters(const std::vector<model::Parameter*>& params, dist::ProcessGroup& group,
                           const std::string& what);

}  // namespace ktune::train
