#include "hub/exporter.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/log.h"

namespace ktune::hub {

namespace fs = std::filesystem;

ExportParts parse_export_parts(const std::string& text) {
  if (text == "adapter") return ExportParts::Adapter;
  if (text == "merged") return ExportParts::Merged;
  if (text == "all" || text == "both") return ExportParts::All;
  if (text == "available" || text == "auto") return ExportParts::Available;
  throw Error("--parts " + text, "expected 'adapter', 'merged' or 'all'");
}

const char* export_parts_name(ExportParts parts) {
  switch (parts) {
    case ExportParts::Adapter: return "adapter";
    case ExportParts::Merged: return "merged";
    case ExportParts::All: return "all";
    case ExportParts::Available: return "available";
  }
  return "?";
}

static bool is_adapter_file(const std::string& rel) {
  return rel == "adapter_model.safetensors" || rel == "adapter_config.json";
}

// Training state, never part of an export.
static bool is_training_state(const std::string& rel) {
  std::string base = fs::path(rel).filename().string();
  return base.rfind("adapter_", 0) == 0 || base.rfind("recipe_state", 0) == 0 || rel.rfind("recipe_state/", 0) == 0 ||
         fnmatch_match("*.pt", base) || fnmatch_match("*.pth", base) || base.rfind(".", 0) == 0;
}

static bool is_weight_file(const std::string& rel) {
  return fnmatch_match("*.safetensors", rel) || fnmatch_match("*.bin", rel);
}

namespace {

// A checkpoint folder of an output_dir: epoch_N or step_N.
struct CheckpointFolder {
  fs::path path;
  std::string name;
  bool is_epoch = false;
  int64_t number = -1;       // the N of its name
  int64_t global_step = -1;  // from recipe_state/recipe_state.json, -1 when absent or unreadable
  double saved_at = -1;      // the same file's save time (unix seconds), -1 when absent
  int epoch = -1;
};

// "epoch_12" -> 12 after `prefix`; -1 when the name is not the prefix and digits.
int64_t numbered(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.rfind(prefix, 0) != 0) return -1;
  if (!std::all_of(name.begin() + (ptrdiff_t)prefix.size(), name.end(), [](unsigned char c) { return std::isdigit(c); }))
    return -1;
  return std::atoll(name.c_str() + prefix.size());
}

// The step and epoch a ktune checkpoint's recipe state records (torchtune's folders have none).
void read_recipe_state(CheckpointFolder& f) {
  std::ifstream in(f.path / "recipe_state" / "recipe_state.json");
  if (!in) return;
  const nlohmann::json state = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!state.is_object()) return;
  if (state.contains("global_step") && state["global_step"].is_number_integer()) f.global_step = state["global_step"].get<int64_t>();
  if (state.contains("saved_at") && state["saved_at"].is_number()) f.saved_at = state["saved_at"].get<double>();
  // An epoch folder's state names the epoch to come; a step folder's the one it was saved in.
  if (!f.is_epoch && state.contains("epoch") && state["epoch"].is_number_integer()) f.epoch = state["epoch"].get<int>();
}

std::vector<CheckpointFolder> checkpoint_folders(const std::string& output_dir) {
  std::vector<CheckpointFolder> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    if (!entry.is_directory()) continue;
    CheckpointFolder f;
    f.path = entry.path();
    f.name = entry.path().filename().string();
    const int64_t epoch_n = numbered(f.name, "epoch_"), step_n = numbered(f.name, "step_");
    if (epoch_n < 0 && step_n < 0) continue;
    f.is_epoch = epoch_n >= 0;
    f.number = f.is_epoch ? epoch_n : step_n;
    if (f.is_epoch) f.epoch = int(epoch_n);
    read_recipe_state(f);
    out.push_back(std::move(f));
  }
  return out;
}

// Whether `a` was saved after `b` (see select_export): by the save time and then the global step
// their recipe states record (as the checkpointer finds the latest to resume from: a fresh run in an
// output_dir that holds an earlier run's step_300 saves its epoch_0 at step 150, later).
bool later(const CheckpointFolder& a, const CheckpointFolder& b, bool by_recipe_state) {
  if (by_recipe_state && a.saved_at != b.saved_at) return a.saved_at > b.saved_at;
  if (by_recipe_state && a.global_step != b.global_step) return a.global_step > b.global_step;
  if (a.is_epoch != b.is_epoch) return a.is_epoch;  // an epoch's end is saved after its last step's
  return a.number > b.number;
}

}  // namespace

ExportSelection select_export(const std::string& output_dir, ExportParts parts, int epoch) {
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) throw Error(output_dir, "output_dir does not exist or is not a folder");
  std::vector<CheckpointFolder> folders = checkpoint_folders(output_dir);
  if (epoch >= 0)
    std::erase_if(folders, [&](const CheckpointFolder& f) { return !f.is_epoch || f.number != epoch; });
  if (folders.empty())
    throw Error(output_dir, epoch >= 0 ? "no epoch_" + std::to_string(epoch) + " folder"
                                       : "no epoch_N or step_N folder: is this a torchtune/ktune output_dir?");
  const bool by_recipe_state =
      std::all_of(folders.begin(), folders.end(), [](const CheckpointFolder& f) { return f.global_step >= 0; });
  const CheckpointFolder& chosen = *std::max_element(
      folders.begin(), folders.end(), [&](const CheckpointFolder& a, const CheckpointFolder& b) { return later(b, a, by_recipe_state); });
  ExportSelection sel;
  sel.checkpoint_dir = fs::absolute(chosen.path).lexically_normal().string();
  sel.checkpoint = chosen.name;
  sel.epoch = chosen.epoch;
  sel.global_step = chosen.global_step;
  std::vector<std::string> rels;
  for (auto it = fs::recursive_directory_iterator(sel.checkpoint_dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file()) rels.push_back(fs::relative(it->path(), sel.checkpoint_dir).generic_string());
  std::sort(rels.begin(), rels.end());
  int adapter_found = 0;
  bool merged_weights = false, merged_config = false;
  for (const std::string& rel : rels) {
    if (is_adapter_file(rel)) ++adapter_found;
    else if (!is_training_state(rel) && is_weight_file(rel)) merged_weights = true;
    else if (rel == "config.json") merged_config = true;
  }
  if (parts == ExportParts::Available) {
    bool has_adapter = adapter_found == 2, has_merged = merged_weights && merged_config;
    if (!has_adapter && !has_merged)
      throw Error(sel.checkpoint_dir, "neither an adapter (adapter_model.safetensors + adapter_config.json) nor a merged "
                                 "model (weights + config.json) to export");
    parts = has_adapter && has_merged ? ExportParts::All : has_adapter ? ExportParts::Adapter : ExportParts::Merged;
  }
  sel.parts = parts;
  bool want_adapter = parts != ExportParts::Merged, want_merged = parts != ExportParts::Adapter;
  for (const std::string& rel : rels) {
    bool take = is_adapter_file(rel) ? want_adapter : !is_training_state(rel) && want_merged;
    if (take) sel.files.push_back({sel.checkpoint_dir + "/" + rel, rel});
  }
  if (want_adapter && adapter_found < 2)
    throw Error(sel.checkpoint_dir, "no adapter to export: adapter_model.safetensors and adapter_config.json are needed "
                               "(was this a full fine-tune? use --parts merged)");
  if (want_merged && (!merged_weights || !merged_config))
    throw Error(sel.checkpoint_dir, std::string("no merged model to export: ") +
                                   (!merged_weights ? "no model*.safetensors/*.bin weights" : "no config.json") +
                                   " (use --parts adapter)");
  return sel;
}

nlohmann::json run_export(const std::string& output_dir, const std::string& destination_uri, ExportParts parts,
                          const StorageOptions& options, int epoch, const ProgressFn& progress) {
  ExportSelection sel = select_export(output_dir, parts, epoch);
  StorageUri uri = parse_storage_uri(destination_uri);
  log_info("export: " + std::string(export_parts_name(sel.parts)) + " of " + sel.checkpoint_dir + " (" +
           std::to_string(sel.files.size()) + " files) -> " + uri.display());
  TransferReport report = upload_to_uri(uri, sel.files, options, progress);
  nlohmann::json files = nlohmann::json::array();
  for (const TransferredFile& f : report.files) files.push_back({{"path", f.path}, {"bytes", f.bytes}});
  nlohmann::json summary = {{"destination", uri.display()},
                            {"source", sel.checkpoint_dir},
                            {"checkpoint", sel.checkpoint},
                            {"epoch", sel.epoch},
                            {"parts", export_parts_name(sel.parts)},
                            {"files", files},
                            {"file_count", report.files.size()},
                            {"bytes", report.total_bytes()},
                            {"seconds", report.seconds}};
  if (sel.global_step >= 0) summary["global_step"] = sel.global_step;
  if (!report.revision.empty()) summary["revision"] = report.revision;
  return summary;
}

}  // namespace ktune::hub
