// `ktune ls`: the recipes and their bundled configs, in torchtune's two-column table
// (RECIPE padded to 40, CONFIG; the recipe name only on its first row).
// It lists what the binary carries; it does not look at configs on disk.
#include <cstdio>
#include <string>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "train/recipe_registry.h"

namespace ktune::cli {

int cmd_ls(const Args& args) {
  if (!args.empty() && !is_help_flag(args[0]))
    throw Error("ktune ls", "takes no arguments, got `" + args[0] + "`");
  if (!args.empty()) {
    std::printf("usage: ktune ls\n\nList the recipes and the configs bundled with ktune.\n");
    return 0;
  }
  std::printf("%-40s %-40s\n", "RECIPE", "CONFIG");
  for (const train::RecipeSpec& recipe : train::all_recipes()) {
    if (recipe.configs.empty()) std::printf("%-40s %-40s\n", recipe.name.c_str(), "-");
    for (std::size_t i = 0; i < recipe.configs.size(); ++i)
      std::printf("%-40s %-40s\n", i == 0 ? recipe.name.c_str() : "", recipe.configs[i].c_str());
  }
  return 0;
}

}  // namespace ktune::cli
