// `ktune download SOURCE --output-dir DIR [--hf-token T] [--ignore-patterns P] [--allow-patterns P]
//  [--repo-type model|dataset] [--revision R] [S3 flags]`: fetch a model or dataset once, by hand.
// SOURCE is hf://org/repo[/subpath], torchtune's bare org/repo, s3://bucket/prefix or file://path.
// The token comes from --hf-token, else HF_TOKEN, else ACCESS_TOKEN, and is never printed.
// It deliberately applies no default allow list (that is the model initializer's policy); like
// torchtune, it fetches everything the ignore patterns leave.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "core/log.h"
#include "hub/storage.h"

namespace ktune::cli {

// To stdout with exit 0 when asked for (--help), to stderr with exit 2 on a wrong command line.
static int download_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: ktune download hf://org/repo[/path] | org/repo | s3://bucket/prefix | file://path\n"
               "         --output-dir DIR [--hf-token T] [--ignore-patterns P] [--allow-patterns P]\n"
               "         [--repo-type model|dataset] [--revision R] [--hf-endpoint URL]\n"
               "         [--s3-endpoint URL] [--s3-region R] [--aws-access-key-id K] [--aws-secret-access-key S]\n"
               "         [--aws-session-token T] [--role-arn ARN] [--aws-profile NAME]\n"
               "         [--max-attempts N]\n"
               "  patterns are comma-separated fnmatch globs; HF_ENDPOINT sets the Hub's address; S3 settings\n"
               "  not given come from AWS_* and then the AWS profile (AWS_PROFILE / --aws-profile, in ~/.aws)\n");
  return out == stdout ? 0 : 2;
}

int cmd_download(const Args& args) {
  hub::StorageOptions options;
  options.s3 = hub::s3_options_from_env();
  if (const char* t = std::getenv("HF_TOKEN"); t != nullptr && *t) options.hf_token = t;
  else if (const char* a = std::getenv("ACCESS_TOKEN"); a != nullptr && *a) options.hf_token = a;
  register_secret(options.hf_token);
  std::string source, output_dir;
  FlagArgs a("ktune download", args);
  while (a.next()) {
    if (a.help()) return download_usage(stdout);
    if (a.positional()) {
      if (!source.empty()) throw Error("ktune download", "more than one source: '" + source + "' and '" + a.arg() + "'");
      source = a.arg();
      continue;
    }
    const std::string flag = a.arg(), value = a.value();
    if (flag == "--output-dir") output_dir = value;
    else if (!hub::apply_storage_flag(options, flag, value)) a.unknown("");
  }
  if (source.empty()) return download_usage(stderr);
  hub::StorageUri uri = hub::parse_storage_uri(source);
  if (output_dir.empty()) {
    if (uri.scheme != hub::StorageScheme::HuggingFace) throw Error("ktune download", "--output-dir is required");
    output_dir = "/tmp/" + uri.repo_id.substr(uri.repo_id.rfind('/') + 1);  // torchtune's default
  }
  hub::TransferReport report =
      hub::download_uri(uri, output_dir, options, [](size_t i, size_t n, const hub::TransferredFile& f) {
        char count[48];  // "[i/n]" (a literal + a temporary string trips GCC 12's -Wrestrict, a false alarm)
        std::snprintf(count, sizeof count, "[%zu/%zu] ", i, n);
        log_info(count + f.path + " " + std::to_string(f.bytes) + " bytes (" + hub::fetch_outcome_name(f.outcome) + ")");
      });
  std::printf("Downloaded %zu files (%llu bytes, %llu over the network) from %s%s to %s in %.1f s\n",
              report.files.size(), (unsigned long long)report.total_bytes(),
              (unsigned long long)report.bytes_transferred, report.source.c_str(),
              report.revision.empty() ? "" : ("@" + report.revision).c_str(), report.destination.c_str(),
              report.seconds);
  return 0;
}

}  // namespace ktune::cli
