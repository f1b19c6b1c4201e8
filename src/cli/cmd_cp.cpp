// `ktune cp CONFIG DEST [-n|--no-clobber] [--make-parents]`: copies a bundled config to a file to
// edit, as torchtune's `tune cp` (DEST gets the .yaml suffix; a directory DEST gets the config's
// file name). Recipes are native C++ in ktune, so `cp RECIPE` is refused with that reason.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "train/config_suggest.h"
#include "train/recipe_registry.h"

namespace ktune::cli {

int cmd_cp(const Args& args) {
  namespace fs = std::filesystem;
  bool no_clobber = false, make_parents = false;
  std::vector<std::string> positional;
  for (const std::string& a : args) {
    if (a == "-n" || a == "--no-clobber") {
      no_clobber = true;
    } else if (a == "--make-parents") {
      make_parents = true;
    } else if (is_help_flag(a)) {
      std::printf("usage: ktune cp CONFIG DEST [-n|--no-clobber] [--make-parents]\n\n"
                  "Copy a bundled config (see `ktune ls`) to DEST to edit it.\n");
      return 0;
    } else if (a.rfind("-", 0) == 0) {
      throw Error("ktune cp", "unknown option `" + a + "` (options: -n/--no-clobber, --make-parents)");
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 2) throw Error("ktune cp", "usage: ktune cp CONFIG DEST [-n|--no-clobber] [--make-parents]");
  const std::string& name = positional[0];
  if (train::find_recipe(name) != nullptr)
    throw Error("ktune cp " + name, "ktune's recipes are native C++ compiled into ktune, not Python files: there is "
                                    "nothing to copy. Copy one of its configs instead (see `ktune ls`) and pass your "
                                    "changes as key=value overrides or in that config");
  const std::string* text = train::bundled_config_text(name);
  if (text == nullptr)
    throw Error("ktune cp " + name, "invalid config name; try `ktune ls` to see all configs" +
                                        train::did_you_mean(name, train::bundled_config_names()));

  fs::path dest = positional[1];
  if (fs::is_directory(dest)) {
    std::string base = name.substr(name.rfind('/') == std::string::npos ? 0 : name.rfind('/') + 1);
    if (base.size() > 5 && base.compare(base.size() - 5, 5, ".yaml") == 0) base.resize(base.size() - 5);
    dest /= base + ".yaml";
  } else {
    // A folder that does not exist names a file, as torchtune's (`tune cp C sub/` writes sub.yaml).
    std::string path = dest.string();
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    dest = path;
    if (dest.extension() != ".yaml") dest.replace_extension(".yaml");
  }
  if (no_clobber && fs::exists(dest)) {
    std::printf("File already exists at %s, not overwriting.\n", fs::absolute(dest).string().c_str());
    return 0;
  }
  if (make_parents && dest.has_parent_path()) fs::create_directories(dest.parent_path());
  if (dest.has_parent_path() && !fs::is_directory(dest.parent_path()))
    throw Error("ktune cp", "cannot create regular file '" + dest.string() +
                                "': no such directory. Use --make-parents to create it");
  std::ofstream out(dest, std::ios::binary);
  out << *text;
  out.close();
  if (!out) throw Error(dest.string(), "cannot write the copy");
  std::printf("Copied file to %s\n", dest.string().c_str());
  return 0;
}

}  // namespace ktune::cli
