#include "hub/aws_config.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/error.h"
#include "core/log.h"

namespace ktune::hub {

namespace {

std::string trimmed(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace((unsigned char)s[b])) ++b;
  while (e > b && std::isspace((unsigned char)s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower((unsigned char)c));
  return s;
}

// "key = value" or "key: value" (the first delimiter of either): key lower-cased, both trimmed.
bool split_setting(const std::string& line, std::string* key, std::string* value) {
  const size_t at = line.find_first_of("=:");
  if (at == std::string::npos || trimmed(line.substr(0, at)).empty()) return false;
  *key = lower(trimmed(line.substr(0, at)));
  *value = trimmed(line.substr(at + 1));
  return true;
}

std::string read_text(const std::string& path, bool* found) {
  std::ifstream in(path, std::ios::binary);
  *found = bool(in);
  if (!in) return {};
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

const std::string* setting(const AwsSettings& s, const std::string& key) {
  auto it = s.find(key);
  return it == s.end() || it->second.empty() ? nullptr : &it->second;
}

// A profile's key that ktune cannot honour as the CLI would: refused rather than ignored, where the
// profile's credentials are needed (mfa_serial matters only to a profile that assumes a role).
void refuse_unsupported(const AwsSettings& profile, const std::string& where, bool assumes_role) {
  for (const char* key : {"sso_session", "sso_start_url", "credential_process", "mfa_serial"}) {
    if (std::string(key) == "mfa_serial" && !assumes_role) continue;
    if (setting(profile, key))
      throw Error(where, std::string(key) + " is not supported by ktune's S3 client: set an access key or a role "
                                            "(role_arn with source_profile or web_identity_token_file) instead");
  }
}

AwsCredentials static_keys(const AwsSettings& profile) {
  AwsCredentials c;
  if (const std::string* v = setting(profile, "aws_access_key_id")) c.access_key_id = *v;
  if (const std::string* v = setting(profile, "aws_secret_access_key")) c.secret_access_key = *v;
  if (const std::string* v = setting(profile, "aws_session_token")) c.session_token = *v;
  return c;
}

// The endpoint a profile names for a service: its services block's, else the profile's own endpoint_url.
std::string endpoint_for(const AwsConfigFiles& files, const AwsSettings& profile, const std::string& service) {
  if (const std::string* block = setting(profile, "services")) {
    auto it = files.services.find(*block);
    if (it != files.services.end())
      if (const std::string* url = setting(it->second, service + ".endpoint_url")) return *url;
  }
  const std::string* url = setting(profile, "endpoint_url");
  return url ? *url : std::string();
}

// The profile's role, assumed from what it names: a source_profile's keys, a web identity token
// file, or the environment's keys (credential_source = Environment).
void apply_role(S3Options& o, const AwsConfigFiles& files, const AwsSettings& profile, const std::string& where) {
  const std::string role = *setting(profile, "role_arn");
  if (!o.role_arn.empty() && o.role_arn != role)
    throw Error(where, "assumes role " + role + " and role " + o.role_arn +
                           " was asked for too (ROLE_ARN / --role-arn): chaining a profile's role into another is "
                           "not supported; drop one of them");
  o.role_arn = role;
  if (const std::string* v = setting(profile, "external_id")) o.role_external_id = *v;
  const std::string* source = setting(profile, "source_profile");
  const std::string* token_file = setting(profile, "web_identity_token_file");
  const std::string* credential_source = setting(profile, "credential_source");
  if (int(source != nullptr) + int(token_file != nullptr) + int(credential_source != nullptr) != 1)
    throw Error(where + ": role_arn",
                "needs exactly one of source_profile, web_identity_token_file or credential_source");
  if (token_file) {
    o.web_identity_token_file = *token_file;
    return;
  }
  if (credential_source) {
    if (*credential_source != "Environment")
      throw Error(where + ": credential_source", "'" + *credential_source +
                                                     "' is not supported by ktune's S3 client (only Environment)");
    return;  // the environment's keys, which o holds (none: sts_assume_role names what is missing)
  }
  auto it = files.profiles.find(*source);
  if (it == files.profiles.end())
    throw Error(where + ": source_profile", "profile '" + *source + "' is in neither " + files.config_file + " nor " +
                                                files.credentials_file);
  const std::string source_where = "AWS profile '" + *source + "'";
  refuse_unsupported(it->second, source_where, /*assumes_role=*/false);
  if (setting(it->second, "role_arn") && &it->second != &profile)
    throw Error(source_where, "assumes a role itself (a source_profile chain): not supported by ktune's S3 client");
  o.credentials = static_keys(it->second);
  if (o.credentials.access_key_id.empty() || o.credentials.secret_access_key.empty())
    throw Error(source_where, "has no aws_access_key_id and aws_secret_access_key to assume " + role + " with");
}

}  // namespace

AwsSections parse_aws_ini(const std::string& text, const std::string& path) {
  AwsSections sections;
  std::istringstream in(text);
  std::string line, last_key;
  bool nested = false;  // last_key's value was empty: indented lines under it are settings of its own
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string where = path + ":" + std::to_string(number);
    const std::string content = trimmed(line);
    if (content.empty() || content[0] == '#' || content[0] == ';') continue;
    const bool indented = std::isspace((unsigned char)line[0]);
    if (indented && !sections.empty() && !last_key.empty()) {  // a continuation of last_key
      AwsSettings& settings = sections.back().second;
      if (!nested) {
        settings[last_key] += "\n" + content;  // configparser's multi-line value
        continue;
      }
      std::string key, value;
      if (!split_setting(content, &key, &value))
        throw Error(where, "expected 'key = value' under '" + last_key + " ='");
      settings[last_key + "." + key] = value;
      continue;
    }
    if (content.front() == '[') {
      if (content.back() != ']') throw Error(where, "a section header must end in ']'");
      const std::string name = trimmed(content.substr(1, content.size() - 2));
      for (const auto& [seen, settings] : sections)
        if (seen == name) throw Error(where, "section [" + name + "] appears twice (configparser refuses it)");
      sections.emplace_back(name, AwsSettings());
      last_key.clear();
      continue;
    }
    if (sections.empty()) throw Error(where, "a setting before any [section] header");
    std::string key, value;
    if (!split_setting(content, &key, &value)) throw Error(where, "expected 'key = value' or a [section] header");
    sections.back().second[key] = value;
    last_key = key;
    nested = value.empty();
  }
  return sections;
}

AwsConfigFiles read_aws_config_files(const std::string& config_file, const std::string& credentials_file) {
  AwsConfigFiles files;
  files.config_file = config_file;
  files.credentials_file = credentials_file;
  bool found = false;
  const std::string config_text = read_text(config_file, &found);
  if (found) {
    for (auto& [name, settings] : parse_aws_ini(config_text, config_file)) {  // in file order: [default] and
      if (name == "default") {                                                  // [profile default], the later wins
        files.profiles["default"] = settings;
      } else if (name.rfind("profile ", 0) == 0) {
        files.profiles[trimmed(name.substr(8))] = settings;
      } else if (name.rfind("services ", 0) == 0) {
        files.services[trimmed(name.substr(9))] = settings;
      }  // other sections (sso-session ...) name no profile
    }
  }
  const std::string credentials_text = read_text(credentials_file, &found);
  if (found)
    for (auto& [name, settings] : parse_aws_ini(credentials_text, credentials_file))
      for (auto& [key, value] : settings) files.profiles[name][key] = value;  // the credentials file's win
  return files;
}

void apply_aws_profile(S3Options& o, const AwsConfigFiles& files, const AwsProfileChoice& choice) {
  auto it = files.profiles.find(choice.name);
  if (it == files.profiles.end()) {
    if (choice.asked_for)
      throw Error("AWS profile (AWS_PROFILE, AWS_DEFAULT_PROFILE or --aws-profile)",
                  "profile '" + choice.name + "' is in neither " + files.config_file + " nor " + files.credentials_file);
    return;
  }
  const AwsSettings& profile = it->second;
  const std::string where = "AWS profile '" + choice.name + "'";
  if (o.region.empty())
    if (const std::string* v = setting(profile, "region")) o.region = *v;
  if (o.endpoint.empty()) o.endpoint = endpoint_for(files, profile, "s3");
  if (o.sts_endpoint.empty()) o.sts_endpoint = endpoint_for(files, profile, "sts");
  if (o.role_session_name.empty())
    if (const std::string* v = setting(profile, "role_session_name")) o.role_session_name = *v;
  // botocore's chain: the environment's keys; a profile's role (assumed from the environment's keys
  // only for a profile asked for by name with credential_source = Environment); the environment's web
  // identity (which also overrides a web-identity profile's role and token); the profile's keys.
  const bool env_keys = !o.credentials.access_key_id.empty();
  const bool env_web_identity = !o.web_identity_role_arn.empty() && !o.web_identity_token_file.empty();
  const std::string* role = setting(profile, "role_arn");
  const std::string* credential_source = setting(profile, "credential_source");
  const bool role_from_env_keys = role && credential_source && *credential_source == "Environment" && choice.asked_for;
  if (env_keys && !role_from_env_keys) return;
  if (role && !(env_web_identity && setting(profile, "web_identity_token_file"))) {
    refuse_unsupported(profile, where, /*assumes_role=*/true);
    apply_role(o, files, profile, where);
  } else if (!env_web_identity) {
    refuse_unsupported(profile, where, /*assumes_role=*/false);
    o.credentials = static_keys(profile);
  }
  register_secret(o.credentials.secret_access_key);
  register_secret(o.credentials.session_token);
}

void apply_aws_profile(S3Options& options) {
  const AwsProfileChoice& choice = options.profile;
  if (choice.config_file.empty() && choice.credentials_file.empty()) return;
  apply_aws_profile(options, read_aws_config_files(choice.config_file, choice.credentials_file), choice);
}

AwsProfileChoice aws_profile_choice_from_env(const EnvLookup& env) {
  auto value = [&](const char* name) { return env_value(env, name); };
  std::string home = value("HOME");
  if (home.empty())
    if (const passwd* user = ::getpwuid(::getuid()); user != nullptr && user->pw_dir != nullptr) home = user->pw_dir;
  auto expanded = [&](std::string path) {  // botocore's os.path.expanduser
    if (path == "~" || path.rfind("~/", 0) == 0) path = home + path.substr(1);
    return path;
  };
  AwsProfileChoice choice;
  choice.config_file = expanded(value("AWS_CONFIG_FILE"));
  choice.credentials_file = expanded(value("AWS_SHARED_CREDENTIALS_FILE"));
  if (choice.config_file.empty()) choice.config_file = home + "/.aws/config";
  if (choice.credentials_file.empty()) choice.credentials_file = home + "/.aws/credentials";
  choice.name = value("AWS_DEFAULT_PROFILE");  // botocore's order (boto3, upstream's initializers)
  if (choice.name.empty()) choice.name = value("AWS_PROFILE");
  choice.asked_for = !choice.name.empty();
  if (!choice.asked_for) choice.name = "default";
  return choice;
}

}  // namespace ktune::hub
