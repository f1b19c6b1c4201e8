// `ktune cat CONFIG|FILE [--sort]`: prints a config so a user sees which keys to override: the bundled
// text with its comments (torchtune's `tune cat` prints a yaml.dump of the parsed config, comments
// lost), or with --sort the parsed tree with keys sorted. It prints the config as written (no
// overrides, no interpolation).
#include <algorithm>
#include <cstdio>
#include <string>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "train/config.h"
#include "train/recipe_registry.h"

namespace ktune::cli {

// To stdout with exit 0 when asked for (--help), to stderr with exit 2 when no config is named.
static int cat_usage(std::FILE* out) {
  std::fprintf(out, "usage: ktune cat CONFIG|FILE [--sort]\n\nPrint a config (see `ktune ls`).\n");
  return out == stdout ? 0 : 2;
}

int cmd_cat(const Args& args) {
  bool sort = false;
  std::string name;
  for (const std::string& a : args) {
    if (a == "--sort") {
      sort = true;
    } else if (is_help_flag(a)) {
      return cat_usage(stdout);
    } else if (a.rfind("-", 0) == 0) {
      throw Error("ktune cat", "unknown option `" + a + "` (option: --sort)");
    } else if (!name.empty()) {
      throw Error("ktune cat", "takes one config, got `" + name + "` and `" + a + "`");
    } else {
      name = a;
    }
  }
  if (name.empty()) return cat_usage(stderr);
  if (train::find_recipe(name) != nullptr)
    throw Error("ktune cat " + name, "'" + name + "' is a recipe, not a config: name a config (see `ktune ls`)");
  train::ConfigSource source = train::find_config(name);
  if (!sort) {
    std::fputs(source.text.c_str(), stdout);
    return 0;
  }
  train::ConfigNode tree = train::load_config_yaml(source.text, source.name);
  tree.sort_keys();
  std::fputs(tree.to_yaml().c_str(), stdout);
  return 0;
}

}  // namespace ktune::cli
