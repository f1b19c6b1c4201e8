// The AWS shared config and credentials files: configparser's syntax, botocore's profile sections
// and precedence (the environment, then the profile's role, the environment's web identity, the
// profile's keys), and the refusals. The S3 tests (s3_test.cpp) use a profile against moto.
#include "hub/aws_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>

#include "core/error.h"

using namespace ktune::hub;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ktune::Error& e) {
    return e.what();
  }
  return "";
}

struct TempFiles {
  std::filesystem::path dir;
  explicit TempFiles(const std::string& name)
      : dir(std::filesystem::temp_directory_path() / ("ktune-aws-config-" + name + "-" + std::to_string(getpid()))) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir / ".aws");
  }
  ~TempFiles() { std::filesystem::remove_all(dir); }
  void write(const std::string& rel, const std::string& text) const { std::ofstream(dir / rel) << text; }
};

const char* kConfig = R"(# written by aws configure
[default]
region = eu-west-2

[profile minio]
region=us-east-1
endpoint_url = http://localhost:9000
services = local

[services local]
s3 =
  endpoint_url = http://127.0.0.1:9001
sts =
  endpoint_url = http://127.0.0.1:9002

[profile deploy]
role_arn = arn:aws:iam::123456789012:role/deploy
source_profile = minio
external_id = ext-42
role_session_name = laptop
Region: ap-south-1

[profile pod]
role_arn = arn:aws:iam::123456789012:role/pod
web_identity_token_file = /var/run/token

[sso-session corp]
sso_start_url = https://corp.awsapps.com/start
)";

const char* kCredentials = R"([default]
aws_access_key_id = AKIADEFAULT
aws_secret_access_key = default-secret

; the keys for the minio profile
[minio]
aws_access_key_id = AKIAMINIO
aws_secret_access_key = minio-secret
aws_session_token = minio-token
)";

// kConfig and kCredentials read through real files, as S3Client reads them.
AwsConfigFiles files() {
  static const TempFiles t("fixture");
  t.write("config", kConfig);
  t.write("credentials", kCredentials);
  AwsConfigFiles f = read_aws_config_files((t.dir / "config").string(), (t.dir / "credentials").string());
  f.config_file = "config";  // as the messages below name them
  f.credentials_file = "credentials";
  return f;
}

const AwsSettings& section(const AwsSections& sections, const std::string& name) {
  for (const auto& [n, settings] : sections)
    if (n == name) return settings;
  throw std::out_of_range("no section " + name);
}

S3Options applied(const std::string& profile, S3Options o = {}, bool asked_for = true) {
  o.region.clear();
  AwsProfileChoice choice;
  choice.name = profile;
  choice.asked_for = asked_for;
  apply_aws_profile(o, files(), choice);
  return o;
}

}  // namespace

TEST(AwsConfig, ParsesConfigparsersSyntax) {
  const AwsSections sections = parse_aws_ini(kConfig, "config");
  ASSERT_EQ(sections.size(), 6u);
  EXPECT_EQ(sections[0].first, "default") << "in file order";
  EXPECT_EQ(section(sections, "default").at("region"), "eu-west-2");
  EXPECT_EQ(section(sections, "profile minio").at("region"), "us-east-1") << "no spaces around '='";
  EXPECT_EQ(section(sections, "profile deploy").at("region"), "ap-south-1") << "'key: value', the key lower-cased";
  EXPECT_EQ(section(sections, "services local").at("s3.endpoint_url"), "http://127.0.0.1:9001") << "a nested setting";
  EXPECT_EQ(section(sections, "services local").at("s3"), "");
  EXPECT_EQ(section(sections, "sso-session corp").at("sso_start_url"), "https://corp.awsapps.com/start");
  const AwsSections windows = parse_aws_ini("[default]\r\nregion = us-west-1\r\n", "config");
  EXPECT_EQ(section(windows, "default").at("region"), "us-west-1");
  const AwsSections multi = parse_aws_ini("[default]\nnote = first line\n  second line\nregion = x\n", "config");
  EXPECT_EQ(section(multi, "default").at("note"), "first line\nsecond line") << "configparser's multi-line value";
  EXPECT_EQ(section(multi, "default").at("region"), "x");
}

// What the files are read into: the credentials file's keys over the config file's for a profile,
// [default] and [profile default] the later one in the file, no profile from other sections.
TEST(AwsConfig, ReadsBothFilesAsBotocoreMergesThem) {
  TempFiles t("case1");
  t.write("config", "[profile default]\nregion = first\n[default]\nregion = second\naws_access_key_id = AKIACONFIG\n"
                    "[sso-session corp]\nsso_region = x\n[profile dev]\nregion = r\n");
  t.write("credentials", "[default]\naws_access_key_id = AKIACREDS\naws_secret_access_key = s\n[ci]\n"
                         "aws_access_key_id = AKIACI\naws_secret_access_key = t\n");
  const AwsConfigFiles f = read_aws_config_files((t.dir / "config").string(), (t.dir / "credentials").string());
  EXPECT_EQ(f.profiles.at("default").at("region"), "second") << "the later of [profile default] and [default]";
  EXPECT_EQ(f.profiles.at("default").at("aws_access_key_id"), "AKIACREDS") << "the credentials file wins";
  EXPECT_EQ(f.profiles.at("ci").at("aws_access_key_id"), "AKIACI") << "a profile only the credentials file has";
  EXPECT_EQ(f.profiles.count("sso-session corp") + f.profiles.count("corp"), 0u);
  EXPECT_EQ(f.profiles.size(), 3u);
  const AwsConfigFiles none = read_aws_config_files((t.dir / "absent").string(), (t.dir / "absent2").string());
  EXPECT_TRUE(none.profiles.empty()) << "missing files: no profile, no error";
}

TEST(AwsConfig, AMalformedLineIsAnErrorNamingFileAndLine) {
  EXPECT_NE(error_of([] { parse_aws_ini("[default]\nregion = a\njust words\n", "/home/u/.aws/config"); })
                .find("/home/u/.aws/config:3"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_aws_ini("region = a\n", "creds"); }).find("creds:1: a setting before any [section]"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_aws_ini("[default\n", "creds"); }).find("creds:1"), std::string::npos);
  EXPECT_NE(error_of([] { parse_aws_ini("[a]\nx = 1\n[a]\n", "creds"); }).find("creds:3: section [a] appears twice"),
            std::string::npos);
}

TEST(AwsConfig, TheProfilesKeysRegionAndEndpoints) {
  const S3Options d = applied("default", {}, /*asked_for=*/false);
  EXPECT_EQ(d.region, "eu-west-2") << "the config file's region";
  EXPECT_EQ(d.credentials.access_key_id, "AKIADEFAULT") << "the credentials file's keys";
  EXPECT_EQ(d.credentials.secret_access_key, "default-secret");
  EXPECT_EQ(d.endpoint, "");
  const S3Options m = applied("minio");
  EXPECT_EQ(m.endpoint, "http://127.0.0.1:9001") << "the services block's s3 endpoint beats the profile's own";
  EXPECT_EQ(m.sts_endpoint, "http://127.0.0.1:9002");
  EXPECT_EQ(m.credentials.session_token, "minio-token");
}

TEST(AwsConfig, TheEnvironmentAndFlagsWin) {
  S3Options set;
  set.endpoint = "http://flag:1";
  set.sts_endpoint = "http://env-sts:2";
  set.role_session_name = "from-env";
  set.credentials = {"AKIAENV", "env-secret", ""};
  S3Options o = applied("deploy", set);
  EXPECT_EQ(o.endpoint, "http://flag:1");
  EXPECT_EQ(o.sts_endpoint, "http://env-sts:2");
  EXPECT_EQ(o.role_session_name, "from-env");
  EXPECT_EQ(o.credentials.access_key_id, "AKIAENV");
  EXPECT_EQ(o.role_arn, "") << "the environment's keys come before the profile's role, as botocore's chain";
  EXPECT_EQ(o.region, "ap-south-1") << "what the environment left unset still comes from the profile";
}

TEST(AwsConfig, AProfilesRoleIsAssumedWithItsSourceProfilesKeys) {
  const S3Options o = applied("deploy");
  EXPECT_EQ(o.role_arn, "arn:aws:iam::123456789012:role/deploy");
  EXPECT_EQ(o.credentials.access_key_id, "AKIAMINIO");
  EXPECT_EQ(o.role_external_id, "ext-42");
  EXPECT_EQ(o.role_session_name, "laptop");
  EXPECT_EQ(o.region, "ap-south-1");
  const S3Options pod = applied("pod");
  EXPECT_EQ(pod.role_arn, "arn:aws:iam::123456789012:role/pod");
  EXPECT_EQ(pod.web_identity_token_file, "/var/run/token");
  EXPECT_TRUE(pod.credentials.access_key_id.empty());
}

TEST(AwsConfig, TheEnvironmentsWebIdentityComesBeforeTheProfilesKeys) {
  S3Options eks;
  eks.web_identity_role_arn = "arn:aws:iam::1:role/irsa";
  eks.web_identity_token_file = "/var/run/secrets/eks/token";
  const S3Options o = applied("default", eks, false);
  EXPECT_TRUE(o.credentials.access_key_id.empty()) << "the pod's role, not ~/.aws/credentials' keys";
  EXPECT_EQ(o.region, "eu-west-2");
}

// botocore asks the environment's web identity before SSO, credential_process or a profile's keys, and
// it overrides a web-identity profile's own role and token; mfa_serial matters only to a role.
TEST(AwsConfig, TheEnvironmentsWebIdentityComesBeforeWhatKtuneWouldRefuse) {
  AwsConfigFiles f = files();
  f.profiles["sso"] = {{"sso_session", "corp"}, {"region", "eu-west-3"}};
  f.profiles["webid"] = {{"role_arn", "arn:profile-role"}, {"web_identity_token_file", "/profile/token"}};
  f.profiles["keys-with-mfa"] = {{"aws_access_key_id", "AKIAMFA"}, {"aws_secret_access_key", "s"},
                                 {"mfa_serial", "arn:aws:iam::1:mfa/u"}};
  S3Options eks;
  eks.web_identity_role_arn = "arn:aws:iam::1:role/irsa";
  eks.web_identity_token_file = "/var/run/secrets/eks/token";
  for (const std::string name : {"sso", "webid"}) {
    S3Options o = eks;
    AwsProfileChoice choice;
    choice.name = name;
    choice.asked_for = true;
    EXPECT_EQ(error_of([&] { apply_aws_profile(o, f, choice); }), "") << name;
    EXPECT_EQ(o.role_arn, "") << name << ": the environment's web identity, not the profile's role";
    EXPECT_EQ(o.web_identity_token_file, "/var/run/secrets/eks/token") << name;
  }
  S3Options o;
  AwsProfileChoice choice;
  choice.name = "keys-with-mfa";
  apply_aws_profile(o, f, choice);
  EXPECT_EQ(o.credentials.access_key_id, "AKIAMFA") << "mfa_serial on a profile with keys and no role is unused";
}

// A profile asked for by name whose role's credential_source is Environment assumes the role with
// the environment's keys; without the name, the environment's keys are used as they are.
TEST(AwsConfig, CredentialSourceEnvironmentAssumesTheRoleWithTheEnvironmentsKeys) {
  AwsConfigFiles f = files();
  f.profiles["from-env"] = {{"role_arn", "arn:aws:iam::1:role/ci"}, {"credential_source", "Environment"}};
  S3Options env_keys;
  env_keys.credentials = {"AKIAENV", "env-secret", ""};
  S3Options o = env_keys;
  apply_aws_profile(o, f, {"from-env", true, "config", "credentials"});
  EXPECT_EQ(o.role_arn, "arn:aws:iam::1:role/ci");
  EXPECT_EQ(o.credentials.access_key_id, "AKIAENV");
  S3Options unnamed = env_keys;
  apply_aws_profile(unnamed, f, {"from-env", false, "config", "credentials"});
  EXPECT_EQ(unnamed.role_arn, "") << "the default profile: the environment's keys come first";
}

TEST(AwsConfig, WhatKtuneCannotHonourIsRefusedNamingTheProfile) {
  EXPECT_NE(error_of([] { applied("nowhere"); }).find("profile 'nowhere' is in neither config nor credentials"),
            std::string::npos);
  EXPECT_EQ(error_of([] { applied("nowhere", {}, false); }), "") << "an unnamed default that is absent: nothing";
  AwsConfigFiles f = files();
  f.profiles["sso"] = {{"sso_session", "corp"}};
  f.profiles["mfa"] = {{"role_arn", "arn:r"}, {"source_profile", "default"}, {"mfa_serial", "arn:mfa"}};
  f.profiles["chain"] = {{"role_arn", "arn:r2"}, {"source_profile", "deploy"}};
  f.profiles["ec2"] = {{"role_arn", "arn:r3"}, {"credential_source", "Ec2InstanceMetadata"}};
  f.profiles["both"] = {{"role_arn", "arn:r4"}, {"source_profile", "default"}, {"web_identity_token_file", "/t"}};
  f.profiles["lost"] = {{"role_arn", "arn:r5"}, {"source_profile", "missing"}};
  const std::map<std::string, std::string> want = {
      {"sso", "AWS profile 'sso': sso_session is not supported"},
      {"mfa", "AWS profile 'mfa': mfa_serial is not supported"},
      {"chain", "AWS profile 'deploy': assumes a role itself"},
      {"ec2", "AWS profile 'ec2': credential_source: 'Ec2InstanceMetadata' is not supported"},
      {"both", "AWS profile 'both': role_arn: needs exactly one of"},
      {"lost", "AWS profile 'lost': source_profile: profile 'missing' is in neither"}};
  for (const auto& [name, message] : want) {
    S3Options o;
    AwsProfileChoice choice;
    choice.name = name;
    const std::string error = error_of([&] { apply_aws_profile(o, f, choice); });
    EXPECT_NE(error.find(message), std::string::npos) << name << ": " << error;
  }
  S3Options explicit_role;
  explicit_role.role_arn = "arn:aws:iam::1:role/other";
  EXPECT_NE(error_of([&] { applied("deploy", explicit_role); }).find("chaining a profile's role into another"),
            std::string::npos);
}

TEST(AwsConfig, TheChoiceAndFilesComeFromTheEnvironment) {
  TempFiles t("case2");
  t.write(".aws/config", "[profile dev]\nregion = sa-east-1\n");
  t.write(".aws/credentials", "[dev]\naws_access_key_id = AKIADEV\naws_secret_access_key = dev-secret\n");
  std::map<std::string, std::string> env = {{"HOME", t.dir.string()}, {"AWS_PROFILE", "dev"}};
  auto lookup = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  S3Options o = s3_options_from_env(lookup);
  EXPECT_EQ(o.profile.name, "dev");
  EXPECT_TRUE(o.profile.asked_for);
  EXPECT_EQ(o.profile.config_file, (t.dir / ".aws/config").string());
  apply_aws_profile(o);
  EXPECT_EQ(o.region, "sa-east-1");
  EXPECT_EQ(o.credentials.access_key_id, "AKIADEV");

  env["AWS_DEFAULT_PROFILE"] = "legacy";
  EXPECT_EQ(s3_options_from_env(lookup).profile.name, "legacy") << "botocore reads AWS_DEFAULT_PROFILE first";
  env.erase("AWS_DEFAULT_PROFILE");
  env["AWS_SHARED_CREDENTIALS_FILE"] = "~/creds";
  EXPECT_EQ(s3_options_from_env(lookup).profile.credentials_file, (t.dir / "creds").string()) << "~ is HOME";
  env.erase("AWS_SHARED_CREDENTIALS_FILE");
  env["AWS_CONFIG_FILE"] = (t.dir / "elsewhere").string();
  env["AWS_PROFILE"] = "gone";
  S3Options missing = s3_options_from_env(lookup);
  EXPECT_NE(error_of([&] { apply_aws_profile(missing); }).find("profile 'gone' is in neither " + (t.dir / "elsewhere").string()),
            std::string::npos);
  t.write("broken", "[default]\nthis line is wrong\n");
  env["AWS_CONFIG_FILE"] = (t.dir / "broken").string();
  env.erase("AWS_PROFILE");
  S3Options broken = s3_options_from_env(lookup);
  EXPECT_NE(error_of([&] { apply_aws_profile(broken); }).find((t.dir / "broken").string() + ":2"), std::string::npos);
}

// A profile without keys leaves the client with none: the error says where keys may come from.
TEST(AwsConfig, NoKeysAnywhereNamesTheProfileFilesInTheError) {
  TempFiles t("case3");
  t.write(".aws/config", "[default]\nregion = eu-north-1\n");
  S3Options o;
  o.profile = {"default", false, (t.dir / ".aws/config").string(), (t.dir / ".aws/credentials").string()};
  const std::string error = error_of([&] { S3Client client(o); });
  EXPECT_NE(error.find("no credentials"), std::string::npos) << error;
  EXPECT_NE(error.find("AWS_PROFILE; " + (t.dir / ".aws/credentials").string()), std::string::npos) << error;
}
