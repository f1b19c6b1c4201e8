// `ktune export --from OUTPUT_DIR --to URI [--parts adapter|merged|all] [--epoch N] [flags]`:
// copy the adapter and/or merged model of a job's latest checkpoint (epoch_N, or a newer mid-epoch
// step_N; --epoch N for that epoch's) to file://, s3:// or
// hf://, then print a JSON summary (destination, files, bytes) on stdout for the job status.
// With --job NAME (a job that is Complete), the output dir is the job's and the export —
// Running, then Complete with the summary or Failed with the error — is recorded with the job,
// which `ktune jobs get` shows: locally in its registry entry; on Kubernetes the exporter runs as a
// Job beside the TrainJob's volume and the record is the TrainJob's annotation (kubernetes_export.cpp).
// Without --parts, it exports whatever the checkpoint folder has (adapter, merged model, or both).
// It deliberately exports no optimizer or recipe state.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "core/log.h"
#include "hub/exporter.h"
#include "sdk/backend.h"

namespace ktune::cli {

// To stdout with exit 0 when asked for (--help), to stderr with exit 2 on a wrong command line.
static int export_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: ktune export --from OUTPUT_DIR|--job NAME --to file://DIR | s3://bucket/prefix | hf://org/repo[/path]\n"
               "         [--parts adapter|merged|all] [--epoch N] [--hf-token T] [--repo-type model|dataset]\n"
               "         [--revision R] [--s3-endpoint URL] [--s3-region R] [--aws-access-key-id K]\n"
               "         [--aws-secret-access-key S] [--aws-session-token T] [--role-arn ARN] [--aws-profile NAME]\n"
               "         [--max-attempts N]\n"
               "         [--backend local|kubernetes [--namespace NS] [--kubeconfig PATH] [--context NAME]]\n"
               "         [--timeout SECONDS] (Kubernetes: how long to wait for the export Job; default 3600)\n"
               "  It exports the latest checkpoint: epoch_N, or a step_N of save_every_n_steps saved after every\n"
               "  epoch's (a run stopped mid-epoch); --epoch N exports epoch_N.\n"
               "  On Kubernetes (--backend kubernetes or KTUNE_BACKEND), --job NAME runs the exporter as a Job\n"
               "  <NAME>-export that mounts the TrainJob's volume, its credentials in a Secret, follows its log\n"
               "  and records the export in the TrainJob (ktune jobs get).\n");
  return out == stdout ? 0 : 2;
}

// --job NAME: through the job's backend (sdk/job_export.h), which records the export with the job:
// locally in its registry entry; on Kubernetes as a Job beside the TrainJob's volume, in the
// TrainJob's annotation. The exporter's log goes to stderr, the summary to stdout.
static int export_job(const sdk::BackendConfig& backend_config, const std::string& job, const sdk::ExportRequest& request) {
  std::unique_ptr<sdk::Backend> backend = sdk::make_backend(backend_config);
  const sdk::ExportRecord done = backend->export_job(job, request, [](const std::string& line) {
    std::fprintf(stderr, "%s\n", redact(line).c_str());
    return true;
  });
  if (done.status == sdk::kComplete) {
    std::printf("%s\n", redact(done.summary_json.empty() ? "{}" : done.summary_json).c_str());
    return 0;
  }
  std::fprintf(stderr, "ktune export: the export Job %s-export still runs after %.0f s; `ktune jobs get %s` shows its end\n",
               job.c_str(), request.timeout_seconds, job.c_str());
  return 3;
}

int cmd_export(const Args& args) {
  hub::StorageOptions options;
  options.s3 = hub::s3_options_from_env();
  if (const char* t = std::getenv("HF_TOKEN"); t != nullptr && *t) options.hf_token = t;
  register_secret(options.hf_token);
  std::string from, to, job;
  hub::ExportParts parts = hub::ExportParts::Available;
  int epoch = -1;
  double timeout = 3600;
  sdk::BackendConfig backend = sdk::BackendConfig::from_env();
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
    else if (flag == "--timeout") {
      timeout = std::atof(value.c_str());
      if (!(timeout > 0)) throw Error("ktune export --timeout", "expects a positive number of seconds, got '" + value + "'");
    } else if (backend.apply_flag(flag, value)) continue;
    else if (!hub::apply_storage_flag(options, flag, value)) a.unknown("");
  }
  if (!job.empty() && !from.empty()) throw Error("ktune export", "give --from or --job, not both");
  if (!job.empty() && !to.empty()) return export_job(backend, job, {to, parts, epoch, options, timeout});
  if (from.empty() || to.empty()) return export_usage(stderr);
  nlohmann::json summary = hub::run_export(from, to, parts, options, epoch, [](size_t i, size_t n, const hub::TransferredFile& f) {
    log_info("export: [" + std::to_string(i) + "/" + std::to_string(n) + "] " + f.path + " " +
             std::to_string(f.bytes) + " bytes");
  });
  std::printf("%s\n", redact(summary.dump()).c_str());
  return 0;
}

}  // namespace ktune::cli
