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
#include <optional>
#include <string>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "core/log.h"
#include "hub/exporter.h"
#include "sdk/job_registry.h"
#include "sdk/kubernetes_backend.h"
#include "sdk/local_backend.h"
#include "sdk/process_identity.h"

namespace ktune::cli {

// To stdout with exit 0 when asked for (--help), to stderr with exit 2 on a wrong command line.
static int export_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: ktune export --from OUTPUT_DIR|--job NAME --to file://DIR | s3://bucket/prefix | hf://org/repo[/path]\n"
               "         [--parts adapter|merged|all] [--epoch N] [--hf-token T] [--repo-type model|dataset]\n"
               "         [--revision R] [--s3-endpoint URL] [--s3-region R] [--aws-access-key-id K]\n"
               "         [--aws-secret-access-key S] [--aws-session-token T] [--max-attempts N]\n"
               "         [--backend local|kubernetes [--namespace NS] [--kubeconfig PATH] [--context NAME]]\n"
               "         [--timeout SECONDS] (Kubernetes: how long to wait for the export Job; default 3600)\n"
               "  It exports the latest checkpoint: epoch_N, or a step_N of save_every_n_steps saved after every\n"
               "  epoch's (a run stopped mid-epoch); --epoch N exports epoch_N.\n"
               "  On Kubernetes (--backend kubernetes or KTUNE_BACKEND), --job NAME runs the exporter as a Job\n"
               "  <NAME>-export that mounts the TrainJob's volume, its credentials in a Secret, follows its log\n"
               "  and records the export in the TrainJob (ktune jobs get).\n");
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

// --job NAME on a cluster: the exporter as a Job beside the TrainJob's volume (KubernetesBackend::start_export).
static int export_kubernetes_job(const sdk::BackendConfig& backend_config, const std::string& job, const std::string& to,
                                 hub::ExportParts parts, int epoch, const hub::StorageOptions& options, double timeout) {
  const hub::StorageUri uri = hub::parse_storage_uri(to);
  sdk::KubernetesExport e;
  e.destination = to;
  e.parts = hub::export_parts_name(parts);
  if (parts != hub::ExportParts::Available) e.args.insert(e.args.end(), {"--parts", e.parts});
  if (epoch >= 0) e.args.insert(e.args.end(), {"--epoch", std::to_string(epoch)});
  switch (uri.scheme) {
    case hub::StorageScheme::File:
      throw Error("ktune export --to " + to, "a file:// destination on the cluster would be written inside the export "
                                             "pod and lost with it; export to s3:// or hf://");
    case hub::StorageScheme::HuggingFace:
      if (!options.hf_token.empty()) e.secret_env["HF_TOKEN"] = options.hf_token;
      if (!options.hf_endpoint.empty()) e.env["HF_ENDPOINT"] = options.hf_endpoint;
      if (options.hf_repo_type != hub::HfRepoType::Model) e.args.insert(e.args.end(), {"--repo-type", "dataset"});
      if (options.hf_revision != "main") e.args.insert(e.args.end(), {"--revision", options.hf_revision});
      break;
    case hub::StorageScheme::S3:
      if (!options.s3.credentials.access_key_id.empty()) e.secret_env["AWS_ACCESS_KEY_ID"] = options.s3.credentials.access_key_id;
      if (!options.s3.credentials.secret_access_key.empty())
        e.secret_env["AWS_SECRET_ACCESS_KEY"] = options.s3.credentials.secret_access_key;
      if (!options.s3.credentials.session_token.empty()) e.secret_env["AWS_SESSION_TOKEN"] = options.s3.credentials.session_token;
      if (!options.s3.endpoint.empty()) e.env["AWS_ENDPOINT_URL"] = options.s3.endpoint;
      e.env["AWS_REGION"] = options.s3.region;
      break;
  }
  sdk::KubernetesBackend backend(backend_config);
  const sdk::ExportRecord started = backend.start_export(job, e);
  log_info("export " + std::to_string(started.id) + " of TrainJob " + job + " to " + redact(to) + ": Job " + job +
           "-export in namespace " + backend.kubernetes_namespace());
  const sdk::ExportRecord done = backend.wait_for_export(job, [](const std::string& line) {
    std::fprintf(stderr, "%s\n", redact(line).c_str());
    return true;
  }, timeout);
  if (done.status == sdk::kComplete) {
    std::printf("%s\n", redact(done.summary_json.empty() ? "{}" : done.summary_json).c_str());
    return 0;
  }
  if (done.status == sdk::kFailed) throw Error("export of TrainJob " + job, done.error);
  std::fprintf(stderr, "ktune export: the export Job %s-export still runs after %.0f s; `ktune jobs get %s` shows its end\n",
               job.c_str(), timeout, job.c_str());
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
  if (!job.empty() && !to.empty() && backend.kind == sdk::BackendConfig::Kind::Kubernetes)
    return export_kubernetes_job(backend, job, to, parts, epoch, options, timeout);
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
