// The `ktune` binary (also installed as `tune`, torchtune's name, so the upstream Kubeflow
// runtimes can call it unchanged). Errors from any layer are printed here, once, with their place.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/process_group.h"
#include "dist/worker_error.h"

namespace ktune::cli {

// Add a line per subcommand: {"name", "one-line summary", cmd_name}. Declarations go beside it.
int cmd_download(const Args& args);
int cmd_initializer(const Args& args);
int cmd_export(const Args& args);
int cmd_ls(const Args& args);
int cmd_cp(const Args& args);
int cmd_cat(const Args& args);
int cmd_validate(const Args& args);
int cmd_train(const Args& args);
int cmd_runtimes(const Args& args);
int cmd_jobs(const Args& args);
int cmd_run(const Args& args);
int cmd_generate(const Args& args);
int cmd_init_model(const Args& args);
int cmd_tokenize(const Args& args);
int cmd_plan(const Args& args);
static const Command kCommands[] = {
    {"version", "print the version", nullptr},
    {"tokenize", "text <-> token ids, JSON lines: --tokenizer FILE [--merges F] [--add-bos] [--decode]", cmd_tokenize},
    {"run", "run a recipe: [launcher args] RECIPE --config NAME|FILE key=value...", cmd_run},
    {"generate", "answer prompts with a model directory, greedily or sampled: --model DIR [--adapter DIR] (--prompt TEXT | --prompts FILE [--template alpaca]) [--chat] [--temperature T --top-k K --top-p P --min-p M --seed S] [--repetition-penalty R] [--no-repeat-ngram-size N] [--num-beams N]", cmd_generate},
    {"init-model", "write a freshly initialised HF model from a config.json", cmd_init_model},
    {"download", "fetch a model or dataset (hf://, org/repo, s3://, file://) into a folder", cmd_download},
    {"initializer", "dataset|model initializer step (STORAGE_URI, ACCESS_TOKEN, IGNORE_PATTERNS)", cmd_initializer},
    {"export", "copy a job's adapter/merged model to file://, s3:// or hf://", cmd_export},
    {"ls", "list the recipes and their bundled configs", cmd_ls},
    {"cp", "copy a bundled config to a file to edit", cmd_cp},
    {"cat", "print a config", cmd_cat},
    {"validate", "check a config and overrides against its recipe, loading nothing", cmd_validate},
    {"train", "start a fine-tuning TrainJob on a runtime (local backend by default)", cmd_train},
    {"runtimes", "list the training runtimes (or print one)", cmd_runtimes},
    {"jobs", "list, inspect, follow, wait for and delete TrainJobs", cmd_jobs},
    {"plan", "per-rank memory and traffic of distributed fine-tuning: --model NAME --nnodes N --nproc_per_node P", cmd_plan},
};

static int print_help() {
  std::printf("usage: ktune <command> [args...]   (also callable as `tune`)\n\ncommands:\n");
  for (const Command& c : kCommands) std::printf("  %-10s %s\n", c.name, c.summary);
  return 0;
}

}  // namespace ktune::cli

// The values of the secret flags, once copied into `args`, are overwritten in argv itself, so that
// `ps` and /proc/<pid>/cmdline show "***…" while a transfer runs (the environment variables, HF_TOKEN and
// AWS_SECRET_ACCESS_KEY, never appear there at all and are the better way to pass them).
static void hide_secret_arguments(int argc, char** argv) {
  static const char* kSecretFlags[] = {"--hf-token", "--access-token", "--aws-secret-access-key", "--aws-session-token"};
  for (int i = 2; i < argc; ++i)
    for (const char* flag : kSecretFlags) {
      const size_t n = std::strlen(flag);
      char* value = nullptr;
      if (std::strcmp(argv[i], flag) == 0 && i + 1 < argc) value = argv[i + 1];
      else if (std::strncmp(argv[i], flag, n) == 0 && argv[i][n] == '=') value = argv[i] + n + 1;
      if (value != nullptr) std::memset(value, '*', std::strlen(value));
    }
}

int main(int argc, char** argv) {
  using namespace ktune::cli;
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "help"))
    return print_help();
  Args args(argv + 2, argv + argc);
  hide_secret_arguments(argc, argv);
  // A write past the file-size limit (ulimit -f) fails with EFBIG, which the writer reports naming
  // the file, instead of the default SIGXFSZ killing the process mid-checkpoint (CPython does the same).
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    for (const Command& c : kCommands) {
      if (std::strcmp(c.name, argv[1]) != 0) continue;
      if (c.run == nullptr) {  // version
        if (!args.empty() && is_help_flag(args[0])) std::printf("usage: ktune version\n");
        else std::printf("ktune 0.1.0\n");
        return 0;
      }
      return c.run(args);
    }
    std::fprintf(stderr, "ktune: unknown command '%s' (see `ktune --help`)\n", argv[1]);
    return 2;
  } catch (const std::exception& e) {  // ktune::Errors too: its what() lists every error
    std::string message = ktune::printable(ktune::redact(e.what()));
    std::fprintf(stderr, "error: %s\n", message.c_str());
    // For the launcher, when this is one of its workers (a no-op when the recipe recorded it already).
    ktune::dist::record_worker_error(message, dynamic_cast<const ktune::dist::PeerLostError*>(&e) != nullptr);
    return 1;
  }
}
