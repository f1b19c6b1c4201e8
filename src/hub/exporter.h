// The exporter (upstream Kubeflow Trainer has none): after a job, copy the chosen parts of a
// torchtune-layout output_dir — the adapter (`adapter_model.safetensors`, `adapter_config.json`),
// the merged model (`model*.safetensors` or `*.bin` shards, their index, `config.json`,
// generation config, tokenizer files), or both — of the latest `epoch_N/` folder to a file://,
// s3:// or hf:// destination, keeping their paths relative to the epoch folder so the
// destination loads as a Hugging Face / PEFT repo. Returns a JSON summary for the job status.
// It deliberately does not export optimizer or recipe state (`*.pt`, `recipe_state*`), which
// only a resumed run of the same recipe can use, and does not convert formats.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hub/storage.h"

namespace ktune::hub {

// Available: whichever of the adapter and the merged model the epoch folder holds (at least one).
enum class ExportParts { Adapter, Merged, All, Available };
ExportParts parse_export_parts(const std::string& text);  // "adapter" | "merged" | "all" | "available"
const char* export_parts_name(ExportParts parts);

struct ExportSelection {
  std::string epoch_dir;  // absolute path of the chosen epoch_N
  int epoch = -1;
  ExportParts parts = ExportParts::All;  // what was taken (never Available)
  std::vector<UploadItem> files;  // local path, path relative to epoch_dir
};

// Picks epoch `epoch` (or the highest N when -1) and its files for `parts`. Throws an Error
// naming the folder when there is no epoch_N, or when a requested part is missing.
ExportSelection select_export(const std::string& output_dir, ExportParts parts, int epoch = -1);

// Runs the export; the summary: {destination, source, epoch, parts, files:[{path,bytes}],
// file_count, bytes, revision (hf commit), seconds}.
nlohmann::json run_export(const std::string& output_dir, const std::string& destination_uri, ExportParts parts,
                          const StorageOptions& options, int epoch = -1, const ProgressFn& progress = nullptr);

}  // namespace ktune::hub
