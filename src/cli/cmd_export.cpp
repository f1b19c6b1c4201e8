// `ktune export --from OUTPUT_DIR --to URI [--parts adapter|merged|all] [--epoch N] [flags]`:
// copy the adapter and/or merged model of a finished job's latest epoch to file://, s3:// or
// hf://, then print a JSON summary (destination, files, bytes) on stdout for the job status.
// With --job NAME (a local job that is Complete), the output dir is the job's and the export —
// Running, then Complete with the summary or Failed with the error — is recorded in its registry
// entry, which `ktune jobs get` shows.
// Without --parts, it exports whatever the epoch folder has (adapter, merged model, or both).
// It deliberately exports no optimizer or recipe state.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "core/log.h"
#include "hub/exporter.h"
#include "sdk/job_registry.h"
#include "sdk/local_backend.h"
#include "sdk/process_identity.h"

namespace ktune::cli {

// To stdout with exit 0 when asked for (--help), to stderr with exit 2 on a wrong command line.
static int export_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: ktune export --from OUTPUT_DIR|--job NAME --to file://DIR | s3://bucket/prefix | hf://org/repo[/path]\n"
               "         [--parts adapter|merged|all] [--epoch N] [--hf-token T] [--repo-type model|dataset]\n"
               "         [--revision R] [--s3-endpoint URL] [--s3-region R] [--aws-access-key-id K]\n"
               "         [--aws-secret-access-key S] [--aws-session-token T] [--max-attempts N]\n");
  return out == stdout ? 0 : 2;
}

// --job NAME: the output dir of a local job, and the export recorded in its registry entry.
static int export_job(const std::string& job, const std::string& to, hub::ExportParts parts, int epoch,
                      const hub::StorageOptions& options) {
  sdk::JobRegistry registry(sdk::default_ktune_home() + "/registry.db");
  std::optional<sdk::TrainJobRecord> record = registry.find(job);
  if (!record) throw Error("TrainJob " + job, "not found in " + registry.path() + " (ktune export --job reads local jobs)");
  if (record->status != sdk::kComplete)
    throw Error("TrainJob " + job, "is " + record->status + "; only a Complete job's outputs are exported");
  const std::string output_dir = record->workspace + "/output";
  const int id = registry.begin_export(job, redact(to), hub::export_parts_name(parts), sdk::unix_now());
  try {
    nlohmann::json summary = hub::run_export(output_dir, to, parts, options, epoch, [](size_t i, size_t n, const hub::TransferredFile& f) {
      log_info("export: [" + std::to_string(i) + "/" + std::to_string(n) + "] " + f.path + " " + std::to_string(f.bytes) + " bytes");
    });
    const std::string text = redact(summary.dump());
    registry.finish_export(id, sdk::kComplete, text, "", sdk::unix_now());
    std::printf("%s\n", text.c_str());
    return 0;
  } catch (const std::exception& e) {
    registry.finish_export(id, sdk::kFailed, "", redact(e.what()), sdk::unix_now());
    throw;
  }
}

int cmd_export(const Args& args) {
  hub::StorageOptions options;
  options.s3 = hub::s3_options_from_env();
  if (const char* t = std::getenv("HF_TOKEN"); t != nullptr && *t) options.hf_token = t;
  register_secret(options.hf_token);
  std::string from, to, job;
  hub::ExportParts parts = hub::ExportParts::Available;
  int epoch = -1;
  FlagArgs a("ktune export", args);
  while (a.next()) {
    if (a.help()) return export_usage(stdout);
    if (a.is("--epoch")) {
      epoch = int(a.int_value(0, 1 << 20));
      continue;
    }
    const std::string flag = a.arg(), value = a.value();
    if (flag == "--from") from = value;
    else if (flag == "--job") job = value;
    else if (flag == "--to") to = value;
    else if (flag == "--parts") parts = hub::parse_export_parts(value);
    else if (!hub::apply_storage_flag(options, flag, value)) a.unknown("");
  }
  if (!job.empty() && !from.empty()) throw Error("ktune export", "give --from or --job, not both");
  if (!job.empty() && !to.empty()) return export_job(job, to, parts, epoch, options);
  if (from.empty() || to.empty()) return export_usage(stderr);
  nlohmann::json summary = hub::run_export(from, to, parts, options, epoch, [](size_t i, size_t n, const hub::TransferredFile& f) {
    log_info("export: [" + std::to_string(i) + "/" + std::to_string(n) + "] " + f.path + " " +
             std::to_string(f.bytes) + " bytes");
  });
  std::printf("%s\n", redact(summary.dump()).c_str());
  return 0;
}

}  // namespace ktune::cli
