// Checking a resolved config against a recipe before anything loads: every key must be one the
// recipe or the named component accepts, with the right type and range, and the combination
// must be possible (a LoRA builder on a full recipe, fp16, packing without max_seq_len, a
// tokenizer of another model family, …). Each problem names its key, what was expected, and the
// nearest valid name; all problems are reported together.
// It checks; it does not fill defaults or build anything (recipe_config.h gives the typed view).
#pragma once

#include <vector>

#include "core/error.h"
#include "train/config.h"
#include "train/recipe_registry.h"

namespace ktune::train {

// Every problem of `tree` (already overridden and interpolated) for `recipe`; empty when valid.
std::vector<Error> check_config(const ConfigNode& tree, const RecipeSpec& recipe);

// Throws ktune::Errors with every problem, or returns.
void validate_config(const ConfigNode& tree, const RecipeSpec& recipe);

// The top-level keys `recipe` accepts (for suggestions and documentation).
std::vector<std::string> recipe_top_level_keys(const RecipeSpec& recipe);

}  // namespace ktune::train
