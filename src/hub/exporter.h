// The exporter (upstream Kubeflow Trainer has none): after a job, copy the chosen parts of a
// torchtune-layout output_dir — the adapter (`adapter_model.safetensors`, `adapter_config.json`),
// the merged model (`model*.safetensors` or `*.bin` shards, their index, `config.json`,
// generation config, tokenizer files), or both — of the latest checkpoint folder (`epoch_N/`, or a
// mid-epoch `step_N/` of save_every_n_steps newer than every epoch's) to a file://, s3:// or hf://
// destination, keeping their paths relative to that folder so the destination loads as a
// Hugging Face / PEFT repo. Returns a JSON summary for the job status.
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
  std::string checkpoint_dir;  // absolute path of the chosen epoch_N or step_N
  std::string checkpoint;      // its name: "epoch_2", "step_120"
  int epoch = -1;              // the epoch it was saved in (0-based); -1 when a step folder does not say
  int64_t global_step = -1;    // from its recipe_state/recipe_state.json; -1 when it has none
  ExportParts parts = ExportParts::All;  // what was taken (never Available)
  std::vector<UploadItem> files;  // local path, path relative to checkpoint_dir
};

// Picks the checkpoint to export and its files for `parts`: epoch_<epoch> when `epoch` >= 0;
// otherwise the latest, by the save time and then the global step each folder's recipe_state.json
// records (ktune's outputs), or, where a folder has none (torchtune's), the highest epoch_N (step_N only when there
// is no epoch folder). Throws an Error naming the folder when there is none, or when a requested
// part is missing.
ExportSelection select_export(const std::string& output_dir, ExportParts parts, int epoch = -1);

// Runs the export; the summary: {destination, source, epoch, parts, files:[{path,bytes}],
// file_count, bytes, revision (hf commit), seconds}.
nlohmann::json run_export(const std::string& output_dir, const std::string& destination_uri, ExportParts parts,
                          const StorageOptions& options, int epoch = -1, const ProgressFn& progress = nullptr);

}  // namespace ktune::hub
