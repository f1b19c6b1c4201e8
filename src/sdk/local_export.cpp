// LocalBackend::export_job: the exporter over a Complete job's <workspace>/output, in this
// process, recorded in the job's registry entry (Running, then Complete with the summary or
// Failed with the error), which `ktune jobs get` and get_job show.
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "hub/exporter.h"
#include "hub/http_client.h"
#include "sdk/job_registry.h"
#include "sdk/local_backend.h"
#include "sdk/process_identity.h"

namespace ktune::sdk {

ExportRecord LocalBackend::export_job(const std::string& name, const ExportRequest& request, const LogLineSink& sink) {
  const TrainJobRecord job = get_job(name);
  if (job.status != kComplete)
    throw Error("TrainJob " + name, "is " + job.status + "; only a Complete job's outputs are exported");
  const std::string output_dir = job.workspace + "/output";
  ExportRecord record;
  record.destination = redact(request.destination);
  record.parts = hub::export_parts_name(request.parts);
  record.started_at = unix_now();
  record.id = registry().begin_export(name, record.destination, record.parts, record.started_at);
  try {
    const hub::TransferInterrupt interrupt(request.while_waiting);  // asked between the pieces of each file
    const nlohmann::json summary = hub::run_export(
        output_dir, request.destination, request.parts, request.storage, request.epoch,
        [&](size_t i, size_t n, const hub::TransferredFile& f) {
          if (sink) sink("export: [" + std::to_string(i) + "/" + std::to_string(n) + "] " + f.path + " " +
                         std::to_string(f.bytes) + " bytes");
        });
    record.status = kComplete;
    record.summary_json = redact(summary.dump());
  } catch (const std::exception& e) {
    // Recorded as Failed, and the error itself goes on (a caller's own, such as a Ctrl-C raised in
    // its sink, stays what it was).
    registry().finish_export(record.id, kFailed, "", redact(e.what()), unix_now());
    throw;
  }
  record.finished_at = unix_now();
  registry().finish_export(record.id, record.status, record.summary_json, record.error, record.finished_at);
  return record;
}

}  // namespace ktune::sdk
