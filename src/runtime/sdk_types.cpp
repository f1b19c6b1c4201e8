// Upstream's enum values as strings, both ways (see sdk_types.h). Nothing else lives here.
#include "runtime/sdk_types.h"

namespace ktune::types {

std::string to_string(TrainerType v) { return v == TrainerType::BuiltinTrainer ? "BuiltinTrainer" : "CustomTrainer"; }

std::string to_string(Framework v) {
  switch (v) {
    case Framework::Torch: return "torch";
    case Framework::DeepSpeed: return "deepspeed";
    case Framework::MLX: return "mlx";
    case Framework::TorchTune: return "torchtune";
  }
  return "torch";
}

std::string to_string(RuntimeKind v) {
  return v == RuntimeKind::TrainingRuntime ? "TrainingRuntime" : "ClusterTrainingRuntime";
}

std::string to_string(Loss v) {
  switch (v) {
    case Loss::CEWithChunkedOutputLoss: return "torchtune.modules.loss.CEWithChunkedOutputLoss";
  }
  return "";
}

std::string to_string(DataType v) { return v == DataType::FP32 ? "fp32" : "bf16"; }

std::string to_string(DataFormat v) {
  switch (v) {
    case DataFormat::JSON: return "json";
    case DataFormat::CSV: return "csv";
    case DataFormat::PARQUET: return "parquet";
    case DataFormat::ARROW: return "arrow";
    case DataFormat::TEXT: return "text";
    case DataFormat::XML: return "xml";
  }
  return "";
}

std::optional<Framework> framework_from_string(const std::string& s) {
  for (Framework f : {Framework::Torch, Framework::DeepSpeed, Framework::MLX, Framework::TorchTune})
    if (to_string(f) == s) return f;
  return std::nullopt;
}

std::optional<Loss> loss_from_string(const std::string& s) {
  if (s == to_string(Loss::CEWithChunkedOutputLoss) || s == "CEWithChunkedOutputLoss") return Loss::CEWithChunkedOutputLoss;
  return std::nullopt;
}

std::optional<DataType> data_type_from_string(const std::string& s) {
  if (s == "bf16") return DataType::BF16;
  if (s == "fp32") return DataType::FP32;
  return std::nullopt;
}

std::optional<DataFormat> data_format_from_string(const std::string& s) {
  for (DataFormat f : {DataFormat::JSON, DataFormat::CSV, DataFormat::PARQUET, DataFormat::ARROW, DataFormat::TEXT,
                       DataFormat::XML})
    if (to_string(f) == s) return f;
  return std::nullopt;
}

}  // namespace ktune::types
