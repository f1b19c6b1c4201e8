// Parsing `ktune run [launcher args] RECIPE --config X overrides…`. See run_command_line.h.
#include "train/run_command_line.h"

#include "core/error.h"
#include "train/config_suggest.h"

namespace ktune::train {

namespace {

class Parser {
 public:
  Parser(const std::vector<std::string>& args, const EnvLookup& env) : args_(args), env_(env) {}

  RunCommandLine run() {
    std::size_t i = 0;
    for (; i < args_.size(); ++i) {
      const std::string& a = args_[i];
      if (a.rfind("--", 0) != 0) break;
      std::string body = a.substr(2);
      std::size_t eq = body.find('=');
      std::string name = body.substr(0, eq);
      const dist::LauncherOption* option = dist::find_launcher_option(name);
      if (option == nullptr) {
        if (name == "config") {
          error("--config", "comes after the recipe: ktune run [launcher args] RECIPE --config NAME");
          if (eq == std::string::npos) ++i;
          continue;
        }
        std::vector<std::string> known;
        for (const dist::LauncherOption& o : dist::launcher_options()) known.push_back(std::string("--") + o.name);
        std::string underscored = name;
        for (char& c : underscored)
          if (c == '-') c = '_';
        error(a, "unknown launcher option" + did_you_mean("--" + underscored, known));
        continue;
      }
      std::string value;
      if (option->is_switch) {
        value = eq == std::string::npos ? "1" : body.substr(eq + 1);
      } else if (eq != std::string::npos) {
        value = body.substr(eq + 1);
      } else if (i + 1 < args_.size()) {
        value = args_[++i];
      } else {
        error(a, "needs a value");
        continue;
      }
      launcher_args_[option->name] = {value, a};  // given twice: the last wins, as in torchrun
    }

    if (i < args_.size()) {
      out_.recipe = args_[i++];
      if (out_.recipe.size() > 3 && out_.recipe.compare(out_.recipe.size() - 3, 3, ".py") == 0)
        error("recipe " + out_.recipe, "ktune's recipes are native (full_finetune_single_device, "
                                       "full_finetune_distributed, lora_finetune_single_device, "
                                       "lora_finetune_distributed); a Python recipe file cannot run");
    } else {
      error("ktune run", "missing RECIPE: ktune run [launcher args] RECIPE --config NAME|FILE [key=value ...]");
    }

    bool have_config = false;
    for (; i < args_.size(); ++i) {
      const std::string& a = args_[i];
      if (a == "--config" || a.rfind("--config=", 0) == 0) {
        std::string value;
        if (a == "--config") {
          if (i + 1 >= args_.size()) {
            error("--config", "needs a config name or a YAML file");
            continue;
          }
          value = args_[++i];
        } else {
          value = a.substr(9);
        }
        if (have_config) error("--config " + value, "given twice (first: " + out_.config + ")");
        out_.config = value;
        have_config = true;
      } else if (a.rfind("--", 0) == 0) {
        error(a, "additional flag arguments are not supported after the recipe: use --config and key=value "
                 "overrides (launcher options go before the recipe)");
      } else {
        out_.overrides.push_back(a);
      }
    }
    if (!have_config && !out_.recipe.empty()) error("ktune run " + out_.recipe, "--config NAME|FILE is required");

    out_.launch = dist::resolve_launch_plan(launcher_args_, env_, errors_);
    if (!errors_.empty()) throw Errors(std::move(errors_));
    return out_;
  }

 private:
  void error(const std::string& where, const std::string& what) { errors_.emplace_back(where, what); }

  const std::vector<std::string>& args_;
  const EnvLookup& env_;
  dist::LauncherArgs launcher_args_;
  RunCommandLine out_;
  std::vector<Error> errors_;
};

}  // namespace

RunCommandLine parse_run_command_line(const std::vector<std::string>& args, const EnvLookup& env) {
  return Parser(args, env).run();
}

}  // namespace ktune::train
