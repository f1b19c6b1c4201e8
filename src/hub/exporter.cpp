#include "hub/exporter.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>

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

ExportSelection select_export(const std::string& output_dir, ExportParts parts, int epoch) {
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) throw Error(output_dir, "output_dir does not exist or is not a folder");
  ExportSelection sel;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("epoch_", 0) != 0 || name.size() == 6) continue;
    if (!std::all_of(name.begin() + 6, name.end(), [](unsigned char c) { return std::isdigit(c); })) continue;
    int n = std::atoi(name.c_str() + 6);
    if (epoch >= 0 ? n == epoch : n > sel.epoch) {
      sel.epoch = n;
      sel.epoch_dir = fs::absolute(entry.path()).lexically_normal().string();
    }
  }
  if (sel.epoch < 0)
    throw Error(output_dir, epoch >= 0 ? "no epoch_" + std::to_string(epoch) + " folder"
                                       : "no epoch_N folder: is this a torchtune/ktune output_dir?");
  std::vector<std::string> rels;
  for (auto it = fs::recursive_directory_iterator(sel.epoch_dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file()) rels.push_back(fs::relative(it->path(), sel.epoch_dir).generic_string());
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
      throw Error(sel.epoch_dir, "neither an adapter (adapter_model.safetensors + adapter_config.json) nor a merged "
                                 "model (weights + config.json) to export");
    parts = has_adapter && has_merged ? ExportParts::All : has_adapter ? ExportParts::Adapter : ExportParts::Merged;
  }
  sel.parts = parts;
  bool want_adapter = parts != ExportParts::Merged, want_merged = parts != ExportParts::Adapter;
  for (const std::string& rel : rels) {
    bool take = is_adapter_file(rel) ? want_adapter : !is_training_state(rel) && want_merged;
    if (take) sel.files.push_back({sel.epoch_dir + "/" + rel, rel});
  }
  if (want_adapter && adapter_found < 2)
    throw Error(sel.epoch_dir, "no adapter to export: adapter_model.safetensors and adapter_config.json are needed "
                               "(was this a full fine-tune? use --parts merged)");
  if (want_merged && (!merged_weights || !merged_config))
    throw Error(sel.epoch_dir, std::string("no merged model to export: ") +
                                   (!merged_weights ? "no model*.safetensors/*.bin weights" : "no config.json") +
                                   " (use --parts adapter)");
  return sel;
}

nlohmann::json run_export(const std::string& output_dir, const std::string& destination_uri, ExportParts parts,
                          const StorageOptions& options, int epoch, const ProgressFn& progress) {
  ExportSelection sel = select_export(output_dir, parts, epoch);
  StorageUri uri = parse_storage_uri(destination_uri);
  log_info("export: " + std::string(export_parts_name(sel.parts)) + " of " + sel.epoch_dir + " (" +
           std::to_string(sel.files.size()) + " files) -> " + uri.display());
  TransferReport report = upload_to_uri(uri, sel.files, options, progress);
  nlohmann::json files = nlohmann::json::array();
  for (const TransferredFile& f : report.files) files.push_back({{"path", f.path}, {"bytes", f.bytes}});
  nlohmann::json summary = {{"destination", uri.display()},
                            {"source", sel.epoch_dir},
                            {"epoch", sel.epoch},
                            {"parts", export_parts_name(sel.parts)},
                            {"files", files},
                            {"file_count", report.files.size()},
                            {"bytes", report.total_bytes()},
                            {"seconds", report.seconds}};
  if (!report.revision.empty()) summary["revision"] = report.revision;
  return summary;
}

}  // namespace ktune::hub
