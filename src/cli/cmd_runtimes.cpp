// `ktune runtimes [NAME]`: the runtimes a TrainJob may name, as the design's table (Runtime,
// Trainer Type, Framework, Pretrained Model, Accelerator, Count); with NAME, that runtime's
// ClusterTrainingRuntime object as YAML. It lists what TrainerClient::list_runtimes() returns: the
// runtimes compiled from manifests/ plus any in $KTUNE_HOME/runtimes. It changes nothing.
#include <cstdio>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "runtime/v1alpha1.h"
#include "sdk/trainer_client.h"

namespace ktune::cli {

int cmd_runtimes(const Args& args) {
  if (!args.empty() && is_help_flag(args[0])) {
    std::printf("usage: ktune runtimes [NAME]\n"
                "  without NAME: the table of runtimes; with NAME: the runtime object as YAML\n");
    return 0;
  }
  sdk::TrainerClient client;
  if (args.size() == 1) {
    std::fputs(v1alpha1::to_yaml(client.catalog().get(args[0])).c_str(), stdout);
    return 0;
  }
  if (args.size() > 1) {
    std::fprintf(stderr, "usage: ktune runtimes [NAME]\n");
    return 2;
  }
  std::fputs(sdk::format_runtimes_table(client.list_runtimes()).c_str(), stdout);
  return 0;
}

}  // namespace ktune::cli
