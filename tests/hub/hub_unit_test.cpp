// Unit tests of the hub layer's pure parts: fnmatch patterns, safe target names, storage URIs,
// digests, SigV4 against AWS's published example, retry delays, XML fields, export selection.
#include <gtest/gtest.h>
#include <ctime>
#include <fstream>
#include <map>
#include <filesystem>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "hub/digest.h"
#include "hub/exporter.h"
#include "hub/file_download.h"
#include "hub/http_client.h"
#include "hub/initializer.h"
#include "hub/patterns.h"
#include "hub/s3_client.h"
#include "hub/sigv4.h"
#include "hub/storage_uri.h"
#include "hub/target_dir.h"
#include "test_processes.h"

using namespace ktune::hub;
using namespace ktune::hub::testing;

TEST(Patterns, FnmatchFollowsPythonRules) {
  EXPECT_TRUE(fnmatch_match("*.json", "config.json"));
  EXPECT_TRUE(fnmatch_match("*.model", "original/tokenizer.model"));  // '*' crosses '/'
  EXPECT_FALSE(fnmatch_match("*.json", "config.jsonl"));
  EXPECT_TRUE(fnmatch_match("model-0000?-of-*.safetensors", "model-00001-of-00002.safetensors"));
  EXPECT_TRUE(fnmatch_match("[!a]" "*.txt", "merges.txt"));
  EXPECT_FALSE(fnmatch_match("[a-l]*.txt", "merges.txt"));
  EXPECT_TRUE(fnmatch_match("[a-m]*.txt", "merges.txt"));
  EXPECT_TRUE(fnmatch_match("original/*", "original/params.json"));
  EXPECT_TRUE(fnmatch_match("*", ""));
  EXPECT_FALSE(fnmatch_match("?", ""));
  EXPECT_TRUE(fnmatch_match("a[b", "a[b"));  // unterminated bracket is literal
}

TEST(Patterns, AllowThenIgnoreAndFolderPatterns) {
  PatternFilter f{default_model_allow_patterns(), {"original/"}};
  EXPECT_TRUE(f.keeps("model.safetensors"));
  EXPECT_TRUE(f.keeps("merges.txt"));
  EXPECT_FALSE(f.keeps("pytorch_model.bin"));
  EXPECT_FALSE(f.keeps("original/tokenizer.model"));  // "original/" means everything under it
  PatternFilter all{{}, {"*.bin"}};
  EXPECT_TRUE(all.keeps("README.md"));
  EXPECT_FALSE(all.keeps("pytorch_model.bin"));
  // Upstream's rule: commas separate, whitespace around each is stripped, a space inside is kept.
  EXPECT_EQ(split_pattern_list("*.bin, *.pth ,  original/*"), (std::vector<std::string>{"*.bin", "*.pth", "original/*"}));
  EXPECT_EQ(split_pattern_list("sub dir/*,original/*,,"), (std::vector<std::string>{"sub dir/*", "original/*"}));
}

TEST(TargetDirNames, EscapingNamesAreRefused) {
  for (const char* bad : {"../escape.txt", "a/../../x", "/etc/passwd", "a//b", "./a", "a\\b", "", "..",
                          ".ktune-download/x"}) {
    EXPECT_THROW(check_relative_name(bad, "hf://org/evil"), ktune::Error) << bad;
  }
  for (const char* good : {"config.json", "original/tokenizer.model", "a..b/c", "..hidden"}) {
    EXPECT_NO_THROW(check_relative_name(good, "hf://org/ok")) << good;
  }
  try {
    check_relative_name("../escape.txt", "hf://org/evil");
    FAIL();
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("hf://org/evil: file '../escape.txt'"), std::string::npos) << e.what();
  }
}

TEST(TargetDirNames, SymlinkedFolderLeadingOutsideIsRefused) {
  TempDir tmp;
  TargetDir target(tmp / "out");
  std::filesystem::create_directories(tmp / "outside");
  ASSERT_EQ(symlink((tmp / "outside").c_str(), (tmp / "out/original").c_str()), 0);
  EXPECT_THROW(target.resolve("original/tokenizer.model", "hf://org/x"), ktune::Error);
  // A symlink that stays inside the root is fine.
  std::filesystem::create_directories(tmp / "out/real");
  ASSERT_EQ(symlink((tmp / "out/real").c_str(), (tmp / "out/alias").c_str()), 0);
  EXPECT_NO_THROW(target.resolve("alias/file.json", "hf://org/x"));
}

TEST(TargetDirNames, PartialFilesLiveApartFromRealNames) {
  TempDir tmp;
  TargetDir target(tmp / "out");
  std::string p = target.partial_path("original/tokenizer.model", "abc123");
  EXPECT_NE(p.find("/.ktune-download/"), std::string::npos);
  EXPECT_NE(p.find(".incomplete"), std::string::npos);
  EXPECT_NE(target.partial_path("a/x.bin", "t"), target.partial_path("b/x.bin", "t"));
  EXPECT_NE(target.partial_path("x.bin", "v1"), target.partial_path("x.bin", "v2"));
}

// A download refused before its first byte (a listing that fails, nothing passing the patterns, a bad
// name) leaves no empty output folder behind: the folders its TargetDir made are removed while empty,
// innermost first, and never a folder that was there before or one holding a (resumable) partial file.
TEST(TargetDirCleanup, ARefusedTransferRemovesOnlyTheEmptyFoldersItMade) {
  TempDir tmp;
  const std::string out = tmp / "a/b/out";
  try {
    TargetDir target(out);
    RemoveCreatedDirsOnThrow cleanup(target);
    target.resolve("../escape", "s3://bucket");
    FAIL() << "the escaping name was taken";
  } catch (const ktune::Error&) {
  }
  EXPECT_FALSE(std::filesystem::exists(tmp / "a"));  // a, a/b and a/b/out were all made by it
  EXPECT_TRUE(std::filesystem::exists(tmp.path));

  std::filesystem::create_directories(tmp / "kept");
  try {
    TargetDir target(tmp / "kept/out");
    RemoveCreatedDirsOnThrow cleanup(target);
    throw ktune::Error("test", "refused");
  } catch (const ktune::Error&) {
  }
  EXPECT_FALSE(std::filesystem::exists(tmp / "kept/out"));
  EXPECT_TRUE(std::filesystem::exists(tmp / "kept"));  // there before: left alone

  try {
    TargetDir target(tmp / "partial/out");
    RemoveCreatedDirsOnThrow cleanup(target);
    std::string partial = target.partial_path("model.safetensors", "etag");
    std::filesystem::create_directories(std::filesystem::path(partial).parent_path());
    std::ofstream(partial) << "half";
    throw ktune::Error("test", "connection reset");
  } catch (const ktune::Error&) {
  }
  EXPECT_TRUE(std::filesystem::exists(tmp / "partial/out/.ktune-download"));  // resumes next time

  {
    TargetDir target(tmp / "done/out");  // no exception: the folder stays, empty or not
    RemoveCreatedDirsOnThrow cleanup(target);
  }
  EXPECT_TRUE(std::filesystem::exists(tmp / "done/out"));
}

// A transfer checks its room before the first byte: what it counts (a file in place at its size,
// nothing; a partial, the rest; a size unknown, nothing) against the filesystem's free space, an
// Error naming the origin, the root, the bytes and the files when more than that; nothing to write
// is never refused.
TEST(TargetDirRoom, ATransferLargerThanTheFreeSpaceIsRefusedCountingOnlyWhatIsLeftToWrite) {
  TempDir tmp;
  TargetDir target(tmp / "out");
  EXPECT_NO_THROW(target.check_room({}, "hf://org/x"));
  EXPECT_NO_THROW(target.check_room({0, 1}, "hf://org/x"));
  const uint64_t huge = uint64_t(1) << 62;  // more than any disk
  try {
    target.check_room({huge - 2, 0, 1, 1}, "hf://org/x");  // three files to write, one in place
    FAIL() << "a transfer of 4 EiB fitted";
  } catch (const ktune::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("hf://org/x"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(huge) + " bytes (3 files) to write into " + target.root()), std::string::npos) << m;
    EXPECT_NE(m.find("bytes free"), std::string::npos) << m;
  }

  auto job = [](const std::string& name, int64_t size) {
    DownloadJob j;
    j.origin = "s3://bucket";
    j.name = name;
    j.version_tag = "v1";
    j.expected.size = size;
    return j;
  };
  const int64_t big = int64_t(huge);
  write_file(target.root() + "/in-place.bin", std::string(100, 'x'));
  std::filesystem::create_directories(target.root() + "/.ktune-download");
  write_file(target.partial_path("half.bin", "v1"), std::string(1000, 'x'));
  auto counted = [&](const std::vector<DownloadJob>& jobs) -> std::string {
    try {
      check_room_for(target, jobs, "s3://bucket");
      return "fits";
    } catch (const ktune::Error& e) {
      const std::string m = e.what();
      return m.substr(m.find("s3://bucket: ") + 13, m.find(" to write") - m.find("s3://bucket: ") - 13);
    }
  };
  EXPECT_EQ(counted({job("in-place.bin", 100), job("unknown.bin", -1)}), "fits");
  EXPECT_EQ(counted({job("in-place.bin", 100), job("half.bin", big)}), std::to_string(big - 1000) + " bytes (1 file)");
  // A file of another size than the store's is fetched again, whole.
  EXPECT_EQ(counted({job("in-place.bin", big), job("half.bin", big)}),
            std::to_string(2 * huge - 1000) + " bytes (2 files)");
}

TEST(StorageUris, ParsesEveryForm) {
  StorageUri hf = parse_storage_uri("hf://tatsu-lab/alpaca/data");
  EXPECT_EQ(hf.scheme, StorageScheme::HuggingFace);
  EXPECT_EQ(hf.repo_id, "tatsu-lab/alpaca");
  EXPECT_EQ(hf.subpath, "data");
  StorageUri bare = parse_storage_uri("meta-llama/Llama-3.2-1B-Instruct");
  EXPECT_EQ(bare.repo_id, "meta-llama/Llama-3.2-1B-Instruct");
  EXPECT_EQ(bare.subpath, "");
  StorageUri s3 = parse_storage_uri("s3://bucket/models/llama/");
  EXPECT_EQ(s3.scheme, StorageScheme::S3);
  EXPECT_EQ(s3.bucket, "bucket");
  EXPECT_EQ(s3.subpath, "models/llama/");
  StorageUri file = parse_storage_uri("file:///data/model");
  EXPECT_EQ(file.scheme, StorageScheme::File);
  EXPECT_EQ(file.path, "/data/model");
  EXPECT_EQ(parse_storage_uri("file://localhost/data/x.parquet").path, "/data/x.parquet");  // RFC 8089
  EXPECT_THROW(parse_storage_uri("gs://bucket/x"), ktune::Error);
  EXPECT_THROW(parse_storage_uri("hf://org/../x"), ktune::Error);
  EXPECT_THROW(parse_storage_uri("hf:///tmp/model"), ktune::Error);  // no org: a local path
  EXPECT_THROW(parse_storage_uri("s3://"), ktune::Error);
}

TEST(Digests, MatchKnownAnswers) {
  // sha256("abc") from FIPS 180-2; git's id of "hello\n" (`git hash-object`).
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  TempDir tmp;
  write_file(tmp / "hello", "hello\n");
  EXPECT_EQ(git_blob_sha1_file_hex(tmp / "hello"), "ce013625030ba8dba906f756967f9e9ca394464a");
  EXPECT_EQ(md5_file_hex(tmp / "hello"), "b1946ac92492d2347c6235b4d2611184");
  EXPECT_EQ(sha256_file_range_hex(tmp / "hello", 0, 3), sha256_hex("hel"));
  EXPECT_EQ(base64_encode("hello"), "aGVsbG8=");
}

TEST(SigV4, MatchesAwsPublishedGetVanillaExample) {
  // AWS SigV4 test suite, "get-vanilla": the signature AWS documents for these inputs.
  SigV4Input in;
  in.method = "GET";
  in.host = "example.amazonaws.com";
  in.canonical_uri = "/";
  in.payload_sha256 = sha256_hex("");
  in.region = "us-east-1";
  in.service = "service";
  in.amz_date = "20150830T123600Z";
  AwsCredentials creds{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
  EXPECT_EQ(sigv4_signature(in, creds), "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
  Headers h = sigv4_sign(in, creds);
  std::string auth;
  for (auto& [k, v] : h)
    if (k == "Authorization") auth = v;
  EXPECT_EQ(auth,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
            "SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}

TEST(SigV4, CanonicalQueryIsSortedAndEncoded) {
  EXPECT_EQ(sigv4_canonical_query({{"prefix", "a b/c"}, {"list-type", "2"}, {"continuation-token", "x+y="}}),
            "continuation-token=x%2By%3D&list-type=2&prefix=a%20b%2Fc");
}

TEST(SigV4, MatchesBotocoreForS3RequestsWithSessionToken) {
  if (!python_has("botocore")) GTEST_SKIP() << "botocore (Python) is not installed: no independent SigV4 reference";
  struct Case {
    std::string method, host, path, query_text;
    std::vector<std::pair<std::string, std::string>> query;
    std::string token;
  };
  std::vector<Case> cases = {
      {"GET", "127.0.0.1:9000", "/bucket", "list-type=2&prefix=models%2Fa%20b", {{"list-type", "2"}, {"prefix", "models/a b"}}, ""},
      {"GET", "127.0.0.1:9000", "/bucket/a%20b/c%2Bd.json", "-", {}, "sessiontoken123"},
      {"GET", "s3.eu-west-1.amazonaws.com", "/bkt/x.bin", "-", {}, ""},
  };
  for (const Case& c : cases) {
    SigV4Input in;
    in.method = c.method;
    in.host = c.host;
    in.canonical_uri = c.path;
    in.query = c.query;
    in.payload_sha256 = sha256_hex("");
    in.region = c.host.find("eu-west-1") != std::string::npos ? "eu-west-1" : "us-east-1";
    in.service = "s3";
    in.amz_date = "20240102T030405Z";
    AwsCredentials creds{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", c.token};
    std::string ours;
    for (auto& [k, v] : sigv4_sign(in, creds))
      if (k == "Authorization") ours = v;
    std::string cmd = "python3 " + source_dir() + "/tests/hub/s3_reference.py sign " + c.method + " " + c.host + " '" +
                      c.path + "' '" + c.query_text + "' " + in.amz_date + " " + in.region + " s3 " +
                      creds.access_key_id + " " + creds.secret_access_key + (c.token.empty() ? "" : " " + c.token);
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[1024] = {0};
    std::string theirs = fgets(buf, sizeof buf, p) ? buf : "";
    pclose(p);
    while (!theirs.empty() && theirs.back() == '\n') theirs.pop_back();
    EXPECT_EQ(ours, theirs) << c.path;
  }
}

TEST(Retry, DelaysDoubleAndHonourRetryAfter) {
  RetryPolicy p;
  p.base_delay_s = 0.5;
  p.max_delay_s = 3;
  EXPECT_DOUBLE_EQ(retry_delay_seconds(p, 1, nullptr), 0.5);
  EXPECT_DOUBLE_EQ(retry_delay_seconds(p, 2, nullptr), 1.0);
  EXPECT_DOUBLE_EQ(retry_delay_seconds(p, 5, nullptr), 3.0);
  HttpResponse r;
  r.headers["retry-after"] = "7";
  EXPECT_DOUBLE_EQ(retry_delay_seconds(p, 1, &r), 7.0);
  r.headers["retry-after"] = "Wed, 21 Oct 2015 07:28:00 GMT";  // in the past: no wait
  EXPECT_DOUBLE_EQ(retry_delay_seconds(p, 1, &r), 0.0);
  EXPECT_TRUE(is_retryable_status(429));
  EXPECT_TRUE(is_retryable_status(503));
  EXPECT_FALSE(is_retryable_status(404));
  EXPECT_FALSE(is_retryable_status(401));
}

TEST(S3Xml, ElementsAreExtractedAndEntitiesDecoded) {
  std::string xml = "<R><Contents><Key>a&amp;b &lt;c&gt;.txt</Key><Size>3</Size></Contents>"
                    "<Contents><Key>caf&#233;</Key></Contents><IsTruncated>false</IsTruncated></R>";
  auto keys = xml_elements(xml, "Key");
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0], "a&b <c>.txt");
  EXPECT_EQ(keys[1], "caf\xC3\xA9");
  EXPECT_EQ(xml_elements(xml, "IsTruncated")[0], "false");
}

// A torchtune-layout output dir: two epochs, adapter + merged model + training state.
static void make_output_dir(const std::string& root) {
  for (int e : {0, 1, 10}) {
    std::string d = root + "/epoch_" + std::to_string(e) + "/";
    write_file(d + "adapter_model.safetensors", "adapter" + std::to_string(e));
    write_file(d + "adapter_config.json", "{\"r\": 8}");
    write_file(d + "adapter_model.pt", "torch pickle");
    write_file(d + "model-00001-of-00002.safetensors", "shard1");
    write_file(d + "model-00002-of-00002.safetensors", "shard2");
    write_file(d + "model.safetensors.index.json", "{}");
    write_file(d + "config.json", "{}");
    write_file(d + "tokenizer.json", "{}");
    write_file(d + "original/tokenizer.model", "tok");
  }
  write_file(root + "/recipe_state/recipe_state.pt", "state");
  write_file(root + "/epoch_x/config.json", "not an epoch");
}

static std::vector<std::string> remote_paths(const ExportSelection& s) {
  std::vector<std::string> out;
  for (const UploadItem& f : s.files) out.push_back(f.remote_path);
  return out;
}

TEST(ExportSelection, PicksTheLatestEpochAndTheRequestedParts) {
  TempDir tmp;
  make_output_dir(tmp.path);
  ExportSelection a = select_export(tmp.path, ExportParts::Adapter);
  EXPECT_EQ(a.epoch, 10);  // numeric, not lexical, order
  EXPECT_EQ(a.checkpoint, "epoch_10");
  EXPECT_EQ(remote_paths(a), (std::vector<std::string>{"adapter_config.json", "adapter_model.safetensors"}));
  ExportSelection m = select_export(tmp.path, ExportParts::Merged);
  EXPECT_EQ(remote_paths(m), (std::vector<std::string>{"config.json", "model-00001-of-00002.safetensors",
                                                       "model-00002-of-00002.safetensors",
                                                       "model.safetensors.index.json", "original/tokenizer.model",
                                                       "tokenizer.json"}));
  ExportSelection all = select_export(tmp.path, ExportParts::All, 1);
  EXPECT_EQ(all.epoch, 1);
  EXPECT_EQ(all.files.size(), 8u);
  EXPECT_EQ(select_export(tmp.path, ExportParts::Available).parts, ExportParts::All);
}

// ktune's folders record their global step: a mid-epoch step_N saved after the last epoch's end
// (a run stopped by its deadline) is the latest; torchtune's record none, and an epoch wins.
TEST(ExportSelection, AStepFolderSavedAfterEveryEpochIsTheLatest) {
  TempDir tmp;
  double now = 1796217000;  // each checkpoint saved a minute after the one before
  const auto checkpoint = [&](const std::string& name, int64_t global_step, int epoch) {
    write_file(tmp / (name + "/adapter_config.json"), "{}");
    write_file(tmp / (name + "/adapter_model.safetensors"), name);
    now += 60;
    if (global_step >= 0)
      write_file(tmp / (name + "/recipe_state/recipe_state.json"),
                 nlohmann::json{{"global_step", global_step}, {"epoch", epoch}, {"step_in_epoch", 5}, {"saved_at", now}}.dump());
  };
  checkpoint("step_50", 50, 0);
  checkpoint("epoch_0", 100, 1);
  checkpoint("step_150", 150, 1);
  ExportSelection s = select_export(tmp.path, ExportParts::Available);
  EXPECT_EQ(s.checkpoint, "step_150");
  EXPECT_EQ(s.global_step, 150);
  EXPECT_EQ(s.epoch, 1);  // saved in the second epoch
  EXPECT_EQ(std::filesystem::path(s.checkpoint_dir).filename(), "step_150");
  EXPECT_EQ(s.parts, ExportParts::Adapter);
  checkpoint("epoch_1", 200, 2);
  EXPECT_EQ(select_export(tmp.path, ExportParts::Adapter).checkpoint, "epoch_1");
  EXPECT_EQ(select_export(tmp.path, ExportParts::Adapter, 0).checkpoint, "epoch_0");  // --epoch: epoch folders only
  EXPECT_THROW(select_export(tmp.path, ExportParts::Adapter, 150), ktune::Error);
  // A fresh run in the same output_dir (no resume): its epoch_0 at step 60 was saved after the first
  // run's step_150 and epoch_1, still there (it replaced only that run's epoch_0).
  checkpoint("epoch_0", 60, 1);
  EXPECT_EQ(select_export(tmp.path, ExportParts::Adapter).checkpoint, "epoch_0");
  EXPECT_EQ(select_export(tmp.path, ExportParts::Adapter).global_step, 60);

  TempDir torchtune;  // no recipe_state.json: the highest epoch, steps only without one
  for (const std::string name : {"step_900", "step_20"}) {
    write_file(torchtune / (name + "/adapter_config.json"), "{}");
    write_file(torchtune / (name + "/adapter_model.safetensors"), "w");
  }
  EXPECT_EQ(select_export(torchtune.path, ExportParts::Adapter).checkpoint, "step_900");
  write_file(torchtune / "epoch_0/adapter_config.json", "{}");
  write_file(torchtune / "epoch_0/adapter_model.safetensors", "w");
  EXPECT_EQ(select_export(torchtune.path, ExportParts::Adapter).checkpoint, "epoch_0");
  EXPECT_EQ(select_export(torchtune.path, ExportParts::Adapter).global_step, -1);
}

TEST(ExportSelection, MissingPartsAndEpochsAreClearErrors) {
  TempDir tmp;
  write_file(tmp / "epoch_0/config.json", "{}");
  write_file(tmp / "epoch_0/model.safetensors", "w");
  EXPECT_EQ(select_export(tmp.path, ExportParts::Available).parts, ExportParts::Merged);
  try {
    select_export(tmp.path, ExportParts::Adapter);
    FAIL();
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no adapter to export"), std::string::npos);
  }
  TempDir empty;
  EXPECT_THROW(select_export(empty.path, ExportParts::All), ktune::Error);
  EXPECT_THROW(select_export(tmp.path, ExportParts::All, 3), ktune::Error);
}

// A role's credentials are fetched at once and again five minutes before they expire; fixed ones
// never.
TEST(CredentialSource, FetchesARolesCredentialsAgainNearTheirExpiry) {
  int fetches = 0;
  int64_t lifetime = 3600;
  const std::function<TemporaryCredentials()> fetch = [&] {
    ++fetches;
    TemporaryCredentials t;
    t.credentials = {"ASIA" + std::to_string(fetches), "secret", "token"};
    t.expires_at = int64_t(std::time(nullptr)) + lifetime;
    return t;
  };
  CredentialSource role(fetch);
  EXPECT_EQ(fetches, 1);
  EXPECT_EQ(role.current().access_key_id, "ASIA1");
  EXPECT_EQ(fetches, 1);  // an hour left
  lifetime = 200;         // the next ones expire within five minutes
  CredentialSource short_lived(fetch);
  EXPECT_EQ(short_lived.current().access_key_id, "ASIA3");
  EXPECT_EQ(fetches, 3);
  CredentialSource fixed(AwsCredentials{"AKIA", "s", ""});
  EXPECT_EQ(fixed.current().access_key_id, "AKIA");
}

// The initializer's role settings: upstream's ROLE_ARN, EKS's web identity, the STS endpoint.
TEST(InitializerEnv, RoleArnAndWebIdentityAreRead) {
  std::map<std::string, std::string> vars = {{"STORAGE_URI", "s3://b/p"},
                                             {"ROLE_ARN", "arn:aws:iam::1:role/r"},
                                             {"AWS_ROLE_ARN", "arn:aws:iam::1:role/irsa"},
                                             {"AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/secrets/token"},
                                             {"AWS_ENDPOINT_URL_STS", "http://127.0.0.1:9"},
                                             {"AWS_ROLE_SESSION_NAME", "job-7"}};
  const InitializerConfig c = initializer_config_from_env(InitializerKind::Model, [&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
  EXPECT_EQ(c.storage.s3.role_arn, "arn:aws:iam::1:role/r");
  EXPECT_EQ(c.storage.s3.web_identity_role_arn, "arn:aws:iam::1:role/irsa");
  EXPECT_EQ(c.storage.s3.web_identity_token_file, "/var/run/secrets/token");
  EXPECT_EQ(c.storage.s3.sts_endpoint, "http://127.0.0.1:9");
  EXPECT_EQ(c.storage.s3.role_session_name, "job-7");
}
