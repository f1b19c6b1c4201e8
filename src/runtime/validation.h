// Validation of a TrainJob against the runtime catalog: every problem found together, each with its
// field path (`spec.trainer.numNodes: must be 1 for qwen2_5/1.5B: ...`). The checks are upstream's
// webhook checks plus the ones upstream-compat.md lists where upstream falls short.
//
// It changes nothing; the plan builder calls it first and refuses to plan on any error.
#pragma once

#include <vector>

#include "core/error.h"
#include "runtime/runtime_catalog.h"
#include "runtime/v1alpha1.h"

namespace ktune {

// All problems, in a stable order (field path order of the checks). Empty when valid.
std::vector<Error> validate(const v1alpha1::TrainJob& job, const RuntimeCatalog& catalog);
// Throws Errors (all of them at once) unless valid.
void validate_or_throw(const v1alpha1::TrainJob& job, const RuntimeCatalog& catalog);

// RFC 1035 label, at most 63 characters: ^[a-z]([-a-z0-9]*[a-z0-9])?$
bool is_rfc1035_label(const std::string& name);

}  // namespace ktune
