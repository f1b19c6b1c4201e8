// `ktune init-model --config config.json --output-dir DIR [--seed N] [--copy FILE…]`: a model
// with freshly initialised weights (normal(0, 0.02), norms at identity) in HF format, from an HF
// config.json — for the quickstart and for benchmarks, where no pretrained checkpoint is at hand.
#include <cstdio>
#include <filesystem>
#include <limits>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/decoder.h"

namespace fs = std::filesystem;

namespace ktune::cli {

int cmd_init_model(const Args& args) {
  std::string config_path, output_dir;
  uint64_t seed = 0;
  std::vector<std::string> copies;
  FlagArgs a("ktune init-model", args);
  constexpr const char* kUsage = "usage: ktune init-model --config FILE --output-dir DIR [--seed N] [--copy FILE]";
  while (a.next()) {
    if (a.help()) {
      std::printf("%s\n  writes DIR/model.safetensors (weights normal(0, 0.02) drawn from --seed, default 0; norms at\n"
                  "  identity) and DIR/config.json; each --copy FILE (a tokenizer, a generation_config.json) goes beside them\n", kUsage);
      return 0;
    }
    if (a.is("--config")) config_path = a.value();
    else if (a.is("--output-dir")) output_dir = a.value();
    else if (a.is("--seed")) seed = uint64_t(a.int_value(0, std::numeric_limits<long long>::max()));
    else if (a.is("--copy")) copies.push_back(a.value());
    else a.unknown(kUsage);
  }
  if (config_path.empty() || output_dir.empty()) throw Error("init-model", "--config and --output-dir are required");
  model::ModelConfig config = model::ModelConfig::from_file(config_path);
  model::Decoder decoder(config, seed);
  fs::create_directories(output_dir);
  std::vector<io::NamedTensor> tensors;
  for (model::Parameter* p : decoder.parameters()) tensors.push_back({p->name, p->value});
  io::write_safetensors((fs::path(output_dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  fs::copy_file(config_path, fs::path(output_dir) / "config.json", fs::copy_options::overwrite_existing);
  for (const std::string& f : copies)
    fs::copy_file(f, fs::path(output_dir) / fs::path(f).filename(), fs::copy_options::overwrite_existing);
  std::printf("wrote %s (%lld parameters, seed %llu)\n", output_dir.c_str(), (long long)config.num_parameters(),
              (unsigned long long)seed);
  return 0;
}

}  // namespace ktune::cli
