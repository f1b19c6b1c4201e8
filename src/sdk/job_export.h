// Exporting a finished job's outputs from the SDK (upstream has no exporter): the adapter and/or
// merged model of the job's latest checkpoint (hub/exporter.h) to file://, s3:// or hf://. The
// local backend runs the exporter in this process and records the export in the job's registry
// entry; the Kubernetes backend runs it as a Job beside the TrainJob's volume and records it in
// the TrainJob's annotation (kubernetes_export.cpp). `ktune export --job` and the Python
// TrainerClient.export_job both come here.
#pragma once

#include <functional>
#include <string>

#include "hub/exporter.h"
#include "hub/storage.h"

namespace ktune::sdk {

struct ExportRequest {
  std::string destination;                               // file://DIR, s3://bucket/prefix, hf://org/repo[/path]
  hub::ExportParts parts = hub::ExportParts::Available;  // what the checkpoint holds, by default
  int epoch = -1;                                        // epoch_N; -1: the latest checkpoint
  hub::StorageOptions storage;                           // the destination's credentials and endpoints
  double timeout_seconds = 3600;                         // Kubernetes: how long to wait for the export Job
  // Called while the export waits, so that a caller can end it (an exception it throws, such as a
  // Ctrl-C, ends it): Kubernetes, between the waits for the export Job (its pod pending, its image
  // pulled); local, between the pieces of each file sent or copied (hub::TransferInterrupt).
  std::function<void()> while_waiting;
};

}  // namespace ktune::sdk
