// `ktune runtimes [NAME]`: the runtimes a TrainJob may name, as the design's table (Runtime,
// Trainer Type, Framework, Pretrained Model, Accelerator, Count); with NAME, that runtime's
// ClusterTrainingRuntime object as YAML. It lists what TrainerClient::list_runtimes() returns: the
// runtimes compiled from manifests/ plus any in $KTUNE_HOME/runtimes. It changes nothing.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "runtime/v1alpha1.h"
#include "sdk/backend.h"
#include "sdk/trainer_client.h"

namespace ktune::cli {

int cmd_runtimes(const Args& args) {
  const std::string usage =
      "usage: ktune runtimes [NAME] [--backend local|kubernetes] [--namespace NS] [--kubeconfig PATH] [--context NAME]";
  sdk::BackendConfig backend = sdk::BackendConfig::from_env();
  std::vector<std::string> names;
  FlagArgs a("ktune runtimes", args);
  while (a.next()) {
    if (a.help()) {
      std::printf("%s\n  without NAME: the table of runtimes; with NAME: the runtime object as YAML\n"
                  "  (the backend's: the cluster's ClusterTrainingRuntimes with --backend kubernetes)\n",
                  usage.c_str());
      return 0;
    }
    if (sdk::BackendConfig::is_flag(a.arg())) {
      backend.apply_flag(a.arg(), a.value());
    } else if (a.positional()) {
      names.push_back(a.arg());
    } else {
      a.unknown(usage);
    }
  }
  if (names.size() > 1) {
    std::fprintf(stderr, "%s\n", usage.c_str());
    return 2;
  }
  sdk::TrainerClient client(backend);
  if (names.size() == 1) {
    std::fputs(v1alpha1::to_yaml(client.catalog().get(names[0])).c_str(), stdout);
    return 0;
  }
  std::fputs(sdk::format_runtimes_table(client.list_runtimes()).c_str(), stdout);
  return 0;
}

}  // namespace ktune::cli
