// The S3 client against a real S3-compatible server on loopback: moto in server mode with SigV4
// checking on (tests/hub/s3_server.py), and boto3 (tests/hub/s3_reference.py) as the independent
// side that writes what ktune reads and reads what ktune writes. Skips visibly without moto.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "hub/s3_client.h"
#include "test_processes.h"

using namespace ktune::hub;
using namespace ktune::hub::testing;

namespace {

// S3 refuses the listing with HTTP 403: `who` holds no right to it, so the request carried its credentials.
void expect_listing_refused(const S3Options& options, const std::string& bucket, const std::string& prefix,
                            const std::string& who) {
  try {
    S3Client(options).list(bucket, prefix);
    ADD_FAILURE() << who << " listed the bucket";
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("HTTP 403"), std::string::npos) << who << ": " << e.what();
  }
}

}  // namespace

class S3 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!python_has("moto") || !python_has("boto3")) return;
    server_ = new ServerProcess(source_dir() + "/tests/hub/s3_server.py", {"--max-seconds", "300"}, 90);
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    if (server_ == nullptr) GTEST_SKIP() << "Python packages moto and boto3 are needed for the S3 server";
    ASSERT_TRUE(server_->ready()) << "tests/hub/s3_server.py did not start";
  }
  static std::string endpoint() { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  static std::string bucket() { return server_->info()["bucket"]; }
  static S3Options options() {
    S3Options o;
    o.endpoint = endpoint();
    o.region = "us-east-1";
    o.credentials.access_key_id = server_->info()["access_key_id"];
    o.credentials.secret_access_key = server_->info()["secret_access_key"];
    o.retry.base_delay_s = 0.05;
    return o;
  }
  // boto3 as the reference client: "put BUCKET KEY FILE", "get BUCKET KEY FILE", "list BUCKET PREFIX".
  static std::string reference(const std::string& args) {
    std::string cmd = "python3 " + source_dir() + "/tests/hub/s3_reference.py " + endpoint() + " " +
                      std::string(server_->info()["access_key_id"]) + " " +
                      std::string(server_->info()["secret_access_key"]) + " " + args;
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    EXPECT_EQ(pclose(p), 0) << cmd;
    return out;
  }
  // Puts every (key, content) pair with one reference process (Python starts slowly).
  static void reference_put(const std::vector<std::pair<std::string, std::string>>& objects) {
    TempDir tmp;
    std::string args = "put " + bucket();
    for (size_t i = 0; i < objects.size(); ++i) {
      std::string f = tmp / std::to_string(i);
      write_file(f, objects[i].second);
      args += " '" + objects[i].first + "' " + f;
    }
    reference(args);
  }
  static std::string reference_get(const std::string& key) {
    TempDir tmp;
    reference("get " + bucket() + " '" + key + "' " + (tmp / "f"));
    return read_file(tmp / "f");
  }
  static ServerProcess* server_;
};
ServerProcess* S3::server_ = nullptr;

TEST_F(S3, ListFollowsContinuationTokensAcrossPages) {
  std::vector<std::pair<std::string, std::string>> puts;
  for (int i = 0; i < 7; ++i) puts.emplace_back("paged/file-" + std::to_string(i) + ".txt", std::string(i + 1, 'a'));
  reference_put(puts);
  S3Options o = options();
  o.max_keys = 3;  // 3 pages
  S3Client s3(o);
  std::vector<S3Object> objects = s3.list(bucket(), "paged/");
  ASSERT_EQ(objects.size(), 7u);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(objects[i].key, "paged/file-" + std::to_string(i) + ".txt");
    EXPECT_EQ(objects[i].size, uint64_t(i + 1));
  }
}

TEST_F(S3, DownloadsAPrefixFolderAtomicallyAndByteForByte) {
  // (No '+' in keys: moto decodes it as a space in paths and then refuses even boto3's signature.)
  reference_put({{"models/tiny/config.json", "{\"a\": 1}"},
                 {"models/tiny/sub dir/model-1.safetensors", std::string(70000, '\x07')},
                 {"models/tiny/pytorch_model.bin", "bin"},
                 {"models/tiny-other/config.json", "other"}});  // same characters, not the folder
  TempDir out;
  S3Client s3(options());
  TransferReport r = s3.download(bucket(), "models/tiny", PatternFilter{{}, {"*.bin"}}, out.path);
  std::set<std::string> got;
  for (const auto& f : r.files) got.insert(f.path);
  EXPECT_EQ(got, (std::set<std::string>{"config.json", "sub dir/model-1.safetensors"}));
  EXPECT_EQ(read_file(out / "config.json"), "{\"a\": 1}");
  EXPECT_TRUE(read_file(out / "sub dir/model-1.safetensors") == std::string(70000, '\x07'));
  EXPECT_FALSE(std::filesystem::exists(out / ".ktune-download"));
  // Again: already there, nothing transferred.
  TransferReport again = s3.download(bucket(), "models/tiny/", PatternFilter{{}, {"*.bin"}}, out.path);
  EXPECT_EQ(again.bytes_transferred, 0u);
  // One object named exactly by the URI lands under its own name.
  TempDir one;
  TransferReport single = s3.download(bucket(), "models/tiny/config.json", PatternFilter{}, one.path);
  ASSERT_EQ(single.files.size(), 1u);
  EXPECT_EQ(read_file(one / "config.json"), "{\"a\": 1}");
}

TEST_F(S3, PutIsReadBackByTheReferenceClient) {
  TempDir tmp;
  std::string data(123457, '\0');
  std::mt19937 rng(1);
  for (char& c : data) c = char(rng());
  write_file(tmp / "blob", data);
  S3Client s3(options());
  s3.put_file(bucket(), "exports/a b~c/blob.bin", tmp / "blob");
  EXPECT_TRUE(reference_get("exports/a b~c/blob.bin") == data);
}

TEST_F(S3, LargeFilesGoUpInPartsAndArriveWhole) {
  TempDir tmp;
  size_t size = (std::getenv("KTUNE_SANITIZED") ? 11u : 12u) << 20;
  std::string data(size, '\0');
  std::mt19937 rng(2);
  for (size_t i = 0; i < size; i += 4) *reinterpret_cast<uint32_t*>(&data[i]) = rng();
  write_file(tmp / "big", data);
  S3Options o = options();
  o.multipart_threshold = 5u << 20;
  o.part_size = 5u << 20;  // 3 parts: 5 + 5 + rest
  S3Client s3(o);
  s3.put_file(bucket(), "exports/big.safetensors", tmp / "big");
  EXPECT_TRUE(reference_get("exports/big.safetensors") == data);
  std::string listing = reference("list " + bucket() + " exports/big");
  EXPECT_EQ(listing, "exports/big.safetensors\t" + std::to_string(size) + "\n");
}

// A caller's interrupt (TransferInterrupt: a notebook's Ctrl-C) ends a multipart upload mid-way, and
// its abort still goes out: no upload is left in progress (S3 keeps, and bills, an unaborted one's
// parts). The check keeps throwing once it has, as a caller that wants out would.
TEST_F(S3, AnInterruptedMultipartUploadIsAbortedNotLeftBehind) {
  TempDir tmp;
  write_file(tmp / "big", std::string(12u << 20, 'u'));
  S3Options o = options();
  o.multipart_threshold = 5u << 20;
  o.part_size = 5u << 20;
  S3Client s3(o);
  struct Interrupted {};
  int checks = 0;
  {
    const TransferInterrupt interrupt([&] {
      if (++checks >= 2) throw Interrupted{};  // the first: CreateMultipartUpload's own
    });
    EXPECT_THROW(s3.put_file(bucket(), "interrupted/big.safetensors", tmp / "big"), Interrupted);
  }
  EXPECT_GE(checks, 2);
  EXPECT_EQ(reference("uploads " + bucket() + " interrupted/"), "") << "the multipart upload was left in progress";
  EXPECT_EQ(reference("list " + bucket() + " interrupted/"), "");
}

TEST_F(S3, WrongSecretIsRejectedWithAClearErrorThatHidesIt) {
  S3Options o = options();
  o.credentials.secret_access_key = "wrongSecretValue12345";
  S3Client s3(o);
  try {
    s3.list(bucket(), "");
    FAIL() << "moto accepted a wrong secret";
  } catch (const ktune::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("SignatureDoesNotMatch"), std::string::npos) << msg;
    EXPECT_NE(msg.find("secret key does not match"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("wrongSecretValue12345"), std::string::npos);
  }
  S3Options unknown = options();
  unknown.credentials.access_key_id = "AKIANOTAKEY000000000";
  expect_listing_refused(unknown, bucket(), "", "an unknown access key");
  try {
    S3Client(options()).list("no-such-bucket-here", "");
    FAIL();
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("NoSuchBucket"), std::string::npos) << e.what();
  }
  // A download refused at its listing, or with nothing passing the patterns, makes no output folder.
  TempDir out;
  try {
    S3Client(options()).download("no-such-bucket-here", "", PatternFilter{}, out / "model", nullptr);
    FAIL();
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("NoSuchBucket"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(out / "model"));
  try {
    S3Client(options()).download(bucket(), "", PatternFilter{{"*.nothing-has-this"}, {}}, out / "model/sub", nullptr);
    FAIL();
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("passes the allow/ignore patterns"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(out / "model"));
}

// upstream's role_arn (ROLE_ARN): the role is assumed through STS (moto checks the AssumeRole
// call's signature) and S3 is asked with the role's temporary credentials, session token included.
// A role allowed nothing in S3 is refused there, so the requests did carry the role's credentials.
TEST_F(S3, ARoleIsAssumedWithTheKeyAndS3IsAskedWithItsCredentials) {
  TempDir tmp;
  write_file(tmp / "a.txt", "through a role");
  S3Options o = options();
  o.role_arn = server_->info()["role_arn"];
  o.sts_endpoint = endpoint();
  S3Client(o).put_file(bucket(), "role/a.txt", tmp / "a.txt");
  EXPECT_EQ(reference_get("role/a.txt"), "through a role");
  S3Client(o).download(bucket(), "role", PatternFilter{}, tmp / "out", nullptr);
  EXPECT_EQ(read_file(tmp / "out/a.txt"), "through a role");

  S3Options powerless = o;
  powerless.role_arn = server_->info()["powerless_role_arn"];
  expect_listing_refused(powerless, bucket(), "role", "a role allowed nothing");
  S3Options wrong = o;
  wrong.credentials.secret_access_key = "wrongSecretValue12345";
  try {
    S3Client c(wrong);
    FAIL() << "STS accepted a wrongly signed AssumeRole";
  } catch (const ktune::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("assuming role " + std::string(server_->info()["role_arn"])), std::string::npos) << msg;
    EXPECT_NE(msg.find("STS refused"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("wrongSecretValue12345"), std::string::npos) << msg;
  }
}

// A laptop's ~/.aws files as `aws configure` and a role profile leave them: the keys from the
// credentials file, the endpoints from the config file's services block, and a profile's role
// assumed with its source_profile's keys (with its external_id); a role allowed nothing is refused
// by S3, so the requests did carry the profile's role's credentials.
TEST_F(S3, AnAwsProfileGivesTheKeysTheEndpointsAndARole) {
  TempDir tmp;
  reference_put({{"profile/c.txt", "by profile"}});
  const std::string services = "services = moto\n";
  write_file(tmp / "config", "[profile store]\nregion = us-east-1\n" + services +
                                 "[services moto]\ns3 =\n  endpoint_url = " + endpoint() + "\nsts =\n  endpoint_url = " +
                                 endpoint() + "\n[profile reader]\nrole_arn = " + std::string(server_->info()["role_arn"]) +
                                 "\nsource_profile = store\nexternal_id = ktune-test\n" + services +
                                 "[profile powerless]\nrole_arn = " + std::string(server_->info()["powerless_role_arn"]) +
                                 "\nsource_profile = store\n" + services);
  write_file(tmp / "credentials", "[store]\naws_access_key_id = " + std::string(server_->info()["access_key_id"]) +
                                      "\naws_secret_access_key = " + std::string(server_->info()["secret_access_key"]) +
                                      "\n");
  auto with_profile = [&](const std::string& name) {
    S3Options o;  // nothing from the environment
    o.retry.base_delay_s = 0.05;
    o.profile = {name, true, tmp / "config", tmp / "credentials"};
    return o;
  };
  EXPECT_EQ(S3Client(with_profile("store")).list(bucket(), "profile").size(), 1u);
  S3Client(with_profile("reader")).download(bucket(), "profile", PatternFilter{}, tmp / "out", nullptr);
  EXPECT_EQ(read_file(tmp / "out/c.txt"), "by profile");
  expect_listing_refused(with_profile("powerless"), bucket(), "profile", "the profile's role, allowed nothing");
}

// A pod's web identity (EKS's IAM roles for service accounts): no key, AWS_ROLE_ARN and the
// projected token file; or role_arn with the token file and no key.
TEST_F(S3, AWebIdentityTokenAssumesTheRoleWithoutAKey) {
  TempDir tmp;
  reference_put({{"web/b.txt", "by web identity"}});
  write_file(tmp / "token", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6a3R1bmUifQ.c2ln\n");
  S3Options o = options();
  o.credentials = {};
  o.web_identity_role_arn = server_->info()["role_arn"];
  o.web_identity_token_file = tmp / "token";
  o.sts_endpoint = endpoint();
  S3Client(o).download(bucket(), "web", PatternFilter{}, tmp / "out", nullptr);
  EXPECT_EQ(read_file(tmp / "out/b.txt"), "by web identity");
  S3Options explicit_role = o;
  explicit_role.web_identity_role_arn.clear();
  explicit_role.role_arn = server_->info()["role_arn"];
  EXPECT_EQ(S3Client(explicit_role).list(bucket(), "web").size(), 1u);

  // The pod's role first, then the role asked for with the pod role's credentials (the AWS SDKs'
  // chain): a role allowed nothing in S3 is refused there.
  S3Options chained = o;
  chained.role_arn = server_->info()["powerless_role_arn"];
  expect_listing_refused(chained, bucket(), "web", "the chained role, allowed nothing");

  o.web_identity_token_file = tmp / "no-such-token";
  try {
    S3Client c(o);
    FAIL();
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-token"), std::string::npos) << e.what();
  }
  S3Options none = options();
  none.credentials = {};
  EXPECT_THROW(S3Client{none}, ktune::Error);
}
