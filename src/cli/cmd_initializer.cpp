// `ktune initializer dataset|model [--storage-uri U] [--output-dir DIR] [flags]`: the
// dataset-initializer and model-initializer steps of a plan, reading upstream Kubeflow
// Trainer's env contract (STORAGE_URI, ACCESS_TOKEN, IGNORE_PATTERNS, AWS_*) so the upstream
// TrainJob/runtime objects can run ktune's image unchanged. Flags override the environment.
// Prints one line per file and a summary; exits non-zero with the reason on any failure.
// It deliberately keeps no state between runs beyond the files (a rerun resumes or skips).
#include <cstdio>
#include <string>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "core/log.h"
#include "hub/initializer.h"

namespace ktune::cli {

// To stdout with exit 0 when asked for (--help), to stderr with exit 2 on a wrong command line.
static int initializer_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: ktune initializer dataset|model [--storage-uri URI] [--output-dir DIR]\n"
               "         [--access-token T] [--ignore-patterns P] [--allow-patterns P] [--revision R]\n"
               "         [--hf-endpoint URL] [--s3-endpoint URL] [--s3-region R] [--aws-access-key-id K]\n"
               "         [--aws-secret-access-key S] [--aws-session-token T] [--role-arn ARN] [--aws-profile NAME]\n"
               "         [--max-attempts N]\n"
               "  env: STORAGE_URI, ACCESS_TOKEN, IGNORE_PATTERNS (comma-separated), HF_ENDPOINT,\n"
               "       S3 as upstream's S3 initializer sets it (ENDPOINT, ACCESS_KEY_ID, SECRET_ACCESS_KEY, REGION), else\n"
               "       AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL,\n"
               "       else the AWS profile (AWS_PROFILE / --aws-profile) in ~/.aws/config and ~/.aws/credentials,\n"
               "       KTUNE_WORKSPACE (default /workspace: files go to /workspace/dataset or /workspace/model)\n");
  return out == stdout ? 0 : 2;
}

int cmd_initializer(const Args& args) {
  if (args.empty()) return initializer_usage(stderr);
  if (is_help_flag(args[0])) return initializer_usage(stdout);
  hub::InitializerKind kind = hub::parse_initializer_kind(args[0]);
  hub::InitializerConfig config = hub::initializer_config_from_env(kind);
  FlagArgs a("ktune initializer", args, 1);
  while (a.next()) {
    if (a.help()) return initializer_usage(stdout);
    const std::string flag = a.arg(), value = a.value();
    if (flag == "--storage-uri") config.storage_uri = value;
    else if (flag == "--output-dir") config.output_dir = value;
    else if (flag == "--ignore-patterns") config.ignore_patterns = hub::split_pattern_list(value);
    else if (flag == "--allow-patterns") config.allow_patterns = hub::split_pattern_list(value);
    else if (!hub::apply_storage_flag(config.storage, flag, value))
      a.unknown("");
  }
  const std::string step = std::string(hub::initializer_kind_name(kind)) + "-initializer";
  hub::TransferReport report =
      hub::run_initializer(config, [&](size_t i, size_t n, const hub::TransferredFile& f) {
        log_info(step + ": [" + std::to_string(i) + "/" + std::to_string(n) + "] " + f.path + " " +
                 std::to_string(f.bytes) + " bytes (" + hub::fetch_outcome_name(f.outcome) + ")");
      });
  std::printf("%s: %zu files, %llu bytes (%llu downloaded) from %s%s into %s in %.1f s\n", step.c_str(),
              report.files.size(), (unsigned long long)report.total_bytes(),
              (unsigned long long)report.bytes_transferred, report.source.c_str(),
              report.revision.empty() ? "" : ("@" + report.revision).c_str(), report.destination.c_str(),
              report.seconds);
  return 0;
}

}  // namespace ktune::cli
