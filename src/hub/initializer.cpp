#include "hub/initializer.h"

#include <initializer_list>

#include "core/error.h"
#include "core/log.h"

namespace ktune::hub {

InitializerKind parse_initializer_kind(const std::string& text) {
  if (text == "dataset") return InitializerKind::Dataset;
  if (text == "model") return InitializerKind::Model;
  throw Error("ktune initializer " + text, "expected 'dataset' or 'model'");
}

const char* initializer_kind_name(InitializerKind kind) {
  return kind == InitializerKind::Dataset ? "dataset" : "model";
}

InitializerConfig initializer_config_from_env(InitializerKind kind, const EnvLookup& env) {
  InitializerConfig c;
  c.kind = kind;
  c.storage_uri = env_value(env, "STORAGE_URI");
  std::string token = env_value(env, "ACCESS_TOKEN");
  if (token.empty()) token = env_value(env, "HF_TOKEN");
  c.storage.hf_token = token;
  if (!token.empty()) register_secret(token);
  c.ignore_patterns = split_pattern_list(env_value(env, "IGNORE_PATTERNS"));
  c.storage.hf_endpoint = env_value(env, "HF_ENDPOINT");
  c.storage.hf_repo_type = kind == InitializerKind::Dataset ? HfRepoType::Dataset : HfRepoType::Model;
  // S3: upstream's initializer env (the S3 initializer's fields upper-cased: ENDPOINT, ACCESS_KEY_ID,
  // SECRET_ACCESS_KEY, REGION, as the SDK and TrainJobs set them) first, then the AWS SDKs' own names.
  auto first_of = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (std::string v = env_value(env, n); !v.empty()) return v;
    return std::string();
  };
  S3Options& s3 = c.storage.s3;
  s3.endpoint = first_of({"ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"});
  s3.region = first_of({"REGION", "AWS_REGION", "AWS_DEFAULT_REGION"});
  s3.credentials.access_key_id = first_of({"ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"});
  s3.credentials.secret_access_key = first_of({"SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"});
  s3.credentials.session_token = env_value(env, "AWS_SESSION_TOKEN");
  s3.role_arn = env_value(env, "ROLE_ARN");  // upstream's S3 initializer's role_arn
  s3_roles_from_env(s3, env);                 // EKS's web identity, the STS endpoint
  register_secret(s3.credentials.secret_access_key);
  register_secret(s3.credentials.session_token);
  std::string workspace = env_value(env, "KTUNE_WORKSPACE");
  if (workspace.empty()) workspace = "/workspace";
  while (workspace.size() > 1 && workspace.back() == '/') workspace.pop_back();
  c.output_dir = workspace + "/" + initializer_kind_name(kind);
  return c;
}

TransferReport run_initializer(const InitializerConfig& config, const ProgressFn& progress) {
  const std::string step = std::string(initializer_kind_name(config.kind)) + "-initializer";
  if (config.storage_uri.empty())
    throw Error(step, "STORAGE_URI is not set (hf://org/repo[/path], s3://bucket/prefix or file://path)");
  StorageUri uri;
  try {
    uri = parse_storage_uri(config.storage_uri);
  } catch (const Error& e) {
    throw Error(step + ": STORAGE_URI", e.what());
  }
  StorageOptions options = config.storage;
  options.filter.ignore = config.ignore_patterns;
  options.filter.allow = config.allow_patterns;
  if (options.filter.allow.empty() && config.kind == InitializerKind::Model)
    options.filter.allow = default_model_allow_patterns();
  if (uri.scheme == StorageScheme::HuggingFace)
    options.hf_repo_type = config.kind == InitializerKind::Dataset ? HfRepoType::Dataset : HfRepoType::Model;
  log_info(step + ": " + uri.display() + " -> " + config.output_dir);
  return download_uri(uri, config.output_dir, options, progress);
}

}  // namespace ktune::hub
