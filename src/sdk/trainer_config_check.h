// The trainer's config, checked before a job starts: a torchtune job's node runs
// `tune run RECIPE --config CONFIG <overrides>`; the same ktune binary the trainer image runs
// checks that config now, as `ktune validate CONFIG --recipe RECIPE <overrides>` (everything
// `ktune run` does before loading anything: overrides, interpolation, the recipe's schema). So a
// config the trainer would refuse (a dataset builder ktune lacks, such as the multimodal one; a
// data format it cannot read; a misspelt key in the trainer's args) fails train() and
// `ktune train --dry-run` with the trainer's own words, before the initializers fetch a model.
//
// Only bundled configs are checked: a config file a runtime's image holds is not on this machine.
// A real process, as the trainer is: the SDK never links the engine's config code.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runtime/plan.h"
#include "runtime/runtime_catalog.h"

namespace ktune::sdk {

// `ktune validate` for the plan's trainer ({exe, "validate", CONFIG, "--recipe", RECIPE,
// overrides...}), or nullopt where there is nothing to check: not a torchtune plan, no recipe or
// config, a config the catalog's set does not hold, no node step naming `--config`.
std::optional<std::vector<std::string>> trainer_config_check_command(const TrainJobPlan& plan,
                                                                     const RuntimeCatalog& catalog,
                                                                     const std::string& ktune_exe);

// Runs the check; throws Error("trainer config CONFIG", the validator's report) when it refuses the
// config, and Error when the validator cannot be run (or runs past timeout_seconds).
void check_trainer_config(const TrainJobPlan& plan, const RuntimeCatalog& catalog, const std::string& ktune_exe,
                          double timeout_seconds = 60);

}  // namespace ktune::sdk
