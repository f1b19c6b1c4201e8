// The AWS shared config and credentials files (~/.aws/config, ~/.aws/credentials), read as the AWS
// CLI and SDKs (botocore) read them, so that S3 works on a laptop with the profile `aws configure`
// wrote:
//   files    AWS_CONFIG_FILE (else ~/.aws/config), AWS_SHARED_CREDENTIALS_FILE (else
//            ~/.aws/credentials); a missing file is no profile, a malformed one an Error naming
//            its file and line;
//   sections [default] and [profile NAME] in the config file, [NAME] in the credentials file (its
//            keys win over the config file's for the same profile); [services NAME] blocks hold
//            per-service settings (`s3 =` followed by indented `endpoint_url = ...`);
//   syntax   Python configparser's: `key = value` or `key: value`, keys case-insensitive, `#` and
//            `;` comment lines, indented lines continue the value above (settings of their own
//            under a key with no value), a section given twice refused; in the config file
//            [default] and [profile default] both name the default, the later one winning.
// The profile is AWS_DEFAULT_PROFILE, else AWS_PROFILE (botocore's order; the AWS CLI v2 reads
// AWS_PROFILE first), else "default"; one asked for by name that neither file holds is an Error.
// Whatever the environment or a flag sets wins (apply_aws_profile).
// It deliberately does not do: SSO, credential_process, MFA, credential_source other than
// Environment, or a role whose source_profile assumes a role itself; each is refused naming the
// profile and its key, so a profile never silently yields other credentials than the CLI's.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hub/s3_client.h"

namespace ktune::hub {

// A section's settings: keys lower-cased; a nested one (`s3 =` then `  endpoint_url = x`) as "s3.endpoint_url".
using AwsSettings = std::map<std::string, std::string>;

struct AwsConfigFiles {
  std::map<std::string, AwsSettings> profiles;  // by profile name, the two files merged
  std::map<std::string, AwsSettings> services;  // [services NAME] blocks
  std::string config_file, credentials_file;    // the paths read (for messages)
};

// A file's sections in their order: (section name, settings).
using AwsSections = std::vector<std::pair<std::string, AwsSettings>>;

// Parses one file in configparser's syntax. Throws an Error naming path:line for a line that is
// neither a section, a setting, a continuation nor a comment, and for a section given twice.
AwsSections parse_aws_ini(const std::string& text, const std::string& path);

// Reads both files (a missing one contributes nothing).
AwsConfigFiles read_aws_config_files(const std::string& config_file, const std::string& credentials_file);

// Fills what `options` leaves unset from the profile `choice` names (a profile asked for that
// neither file holds is an Error), in botocore's order: the region; the S3 endpoint (the profile's
// services block's s3 endpoint_url, else its endpoint_url) and the STS one; role_session_name;
// then the credentials, when no access key is set: the profile's role (role_arn with a
// source_profile's keys or its web_identity_token_file; with its external_id), else the
// environment's web identity when one is set (it also overrides a web-identity profile's role),
// else the profile's own keys (aws_access_key_id, aws_secret_access_key, aws_session_token). A
// profile asked for by name whose role has credential_source = Environment assumes it with the
// environment's keys. Secrets read are registered.
void apply_aws_profile(S3Options& options, const AwsConfigFiles& files, const AwsProfileChoice& choice);
// The same with the files options.profile names, read now (S3Client's constructor: once any
// flags are in, and only where S3 is used). No file named: nothing.
void apply_aws_profile(S3Options& options);

// AWS_PROFILE (else AWS_DEFAULT_PROFILE, else default), AWS_CONFIG_FILE and
// AWS_SHARED_CREDENTIALS_FILE (else ~/.aws/config and ~/.aws/credentials under HOME).
AwsProfileChoice aws_profile_choice_from_env(const EnvLookup& env);

}  // namespace ktune::hub
