// The Hugging Face Hub client against tests/hub/hub_server.py, a local server that answers the
// Hub's API shapes from tests/hub/fixtures/hub/ (revision API, resolve with CDN redirects, Range,
// gated/invalid-token/missing-repo errors, injected 503/429/cut-body faults, an escaping sibling,
// and the upload endpoints). Each test compares the downloaded bytes with the fixture files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "hub/digest.h"
#include "hub/hf_hub.h"
#include "hub/target_dir.h"
#include "test_processes.h"

using namespace ktune::hub;
using namespace ktune::hub::testing;

static const std::string kGood = "hf_goodtoken1234567890";
static const std::string kOther = "hf_otheruser1234567890";

class HfHub : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    upload_dir_ = new TempDir();
    server_ = new ServerProcess(source_dir() + "/tests/hub/hub_server.py",
                                {"--root", source_dir() + "/tests/hub/fixtures/hub", "--upload-dir", upload_dir_->path,
                                 "--max-seconds", "300"});
  }
  static void TearDownTestSuite() {
    delete server_;
    delete upload_dir_;
  }
  void SetUp() override {
    ASSERT_TRUE(server_->ready()) << "tests/hub/hub_server.py did not start";
    HttpClient http;
    http.perform({"POST", endpoint() + "/_reset"});
  }
  static std::string endpoint() { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  static HfOptions options(const std::string& token = "") {
    HfOptions o;
    o.endpoint = endpoint();
    o.token = token;
    o.retry.base_delay_s = 0.05;
    return o;
  }
  static nlohmann::json request_log() {
    HttpClient http;
    return nlohmann::json::parse(http.perform({"GET", endpoint() + "/_log"}).body);
  }
  static std::string fixture(const std::string& repo_path) {
    return read_file(source_dir() + "/tests/hub/fixtures/hub/" + repo_path);
  }
  static std::set<std::string> paths(const TransferReport& r) {
    std::set<std::string> out;
    for (const auto& f : r.files) out.insert(f.path);
    return out;
  }
  static ServerProcess* server_;
  static TempDir* upload_dir_;
};
ServerProcess* HfHub::server_ = nullptr;
TempDir* HfHub::upload_dir_ = nullptr;

TEST_F(HfHub, RepoInfoListsSiblingsWithSizesAndLfsDigests) {
  HfHubClient hub(options());
  HfRepoInfo info = hub.repo_info("org/tiny-model", HfRepoType::Model);
  EXPECT_EQ(info.sha.size(), 40u);
  bool saw_lfs = false;
  for (const HfSibling& s : info.siblings) {
    std::string data = fixture("models/org/tiny-model/" + s.path);
    EXPECT_EQ(s.size, int64_t(data.size())) << s.path;
    if (s.path == "model.safetensors") {
      saw_lfs = true;
      EXPECT_EQ(s.lfs_sha256, sha256_hex(data));
    }
  }
  EXPECT_TRUE(saw_lfs);
}

TEST_F(HfHub, ModelDownloadTakesDefaultPatternsAndMatchesTheFixtures) {
  TempDir out;
  HfHubClient hub(options());
  size_t progress_calls = 0;
  TransferReport r = hub.download("org/tiny-model", HfRepoType::Model, "main", "",
                                  PatternFilter{default_model_allow_patterns(), {}}, out.path,
                                  [&](size_t i, size_t n, const TransferredFile&) {
                                    ++progress_calls;
                                    EXPECT_LE(i, n);
                                  });
  std::set<std::string> want = {"config.json", "generation_config.json", "merges.txt", "model.safetensors",
                                "original/tokenizer.model", "tokenizer_config.json"};
  EXPECT_EQ(paths(r), want);
  EXPECT_EQ(progress_calls, want.size());
  for (const std::string& p : want) EXPECT_EQ(read_file(out / p), fixture("models/org/tiny-model/" + p)) << p;
  EXPECT_FALSE(std::filesystem::exists(out / "pytorch_model.bin"));
  EXPECT_FALSE(std::filesystem::exists(out / ".ktune-download"));  // no partial left behind
  EXPECT_EQ(r.revision.size(), 40u);
  EXPECT_EQ(r.bytes_transferred, r.total_bytes());
  // Every file was fetched at the resolved commit, not at "main".
  for (const auto& entry : request_log()) {
    if (entry["path"].get<std::string>().find("/resolve/") != std::string::npos) {
      EXPECT_NE(entry["path"].get<std::string>().find("/resolve/" + r.revision + "/"), std::string::npos);
    }
  }
}

TEST_F(HfHub, LfsRedirectToAnotherHostDropsTheToken) {
  TempDir out;
  HfHubClient hub(options(kGood));
  hub.download("org/tiny-model", HfRepoType::Model, "main", "", PatternFilter{{"*.safetensors"}, {}}, out.path);
  EXPECT_EQ(read_file(out / "model.safetensors"), fixture("models/org/tiny-model/model.safetensors"));
  bool saw_resolve = false, saw_cdn = false;
  for (const auto& e : request_log()) {
    std::string path = e["path"];
    if (path.find("/resolve/") != std::string::npos) {
      saw_resolve = true;
      EXPECT_TRUE(e["has_auth"].get<bool>());
    }
    if (path.rfind("/_cdn/", 0) == 0) {
      saw_cdn = true;
      EXPECT_FALSE(e["has_auth"].get<bool>()) << "the token was sent to the CDN host";
      EXPECT_EQ(e["host"].get<std::string>().rfind("localhost:", 0), 0u);
    }
  }
  EXPECT_TRUE(saw_resolve && saw_cdn);
}

TEST_F(HfHub, IgnorePatternsAndDatasetSubpath) {
  TempDir out;
  HfHubClient hub(options());
  TransferReport r = hub.download("org/tiny-model", HfRepoType::Model, "main", "",
                                  PatternFilter{{}, {"*.bin", "*.msgpack", "original/"}}, out.path);
  EXPECT_EQ(paths(r), (std::set<std::string>{"README.md", "config.json", "generation_config.json", "merges.txt",
                                             "model.safetensors", "tokenizer_config.json"}));
  TempDir data;
  TransferReport d = hub.download("org/tiny-data", HfRepoType::Dataset, "main", "data", PatternFilter{}, data.path);
  EXPECT_EQ(paths(d), (std::set<std::string>{"data/test.jsonl", "data/train.jsonl"}));
  EXPECT_EQ(read_file(data / "data/train.jsonl"), fixture("datasets/org/tiny-data/data/train.jsonl"));
  // The same name as a model repo does not exist: the error says so and hints at --repo-type.
  try {
    hub.download("org/tiny-data", HfRepoType::Model, "main", "", PatternFilter{}, data.path);
    FAIL();
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no such model repo 'org/tiny-data'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--repo-type dataset"), std::string::npos) << e.what();
  }
}

static std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ktune::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(HfHub, GatedWrongTokenAndMissingRepoEachSayWhich) {
  TempDir out;
  auto fetch = [&](const std::string& token, const std::string& repo) {
    return error_of([&] {
      HfHubClient(options(token)).download(repo, HfRepoType::Model, "main", "", PatternFilter{{"config.json"}, {}},
                                           out.path);
    });
  };
  std::string no_token = fetch("", "org/gated-model");
  EXPECT_NE(no_token.find("gated model"), std::string::npos) << no_token;
  EXPECT_NE(no_token.find("needs an access token"), std::string::npos) << no_token;
  EXPECT_NE(no_token.find("HTTP 401"), std::string::npos) << no_token;

  std::string not_granted = fetch(kOther, "org/gated-model");
  EXPECT_NE(not_granted.find("has not been granted access"), std::string::npos) << not_granted;
  EXPECT_NE(not_granted.find("HTTP 403"), std::string::npos) << not_granted;
  EXPECT_EQ(not_granted.find(kOther), std::string::npos) << "token leaked into the error";

  std::string bad_token = "hf_wrongtoken99999999";
  std::string wrong = fetch(bad_token, "org/gated-model");
  EXPECT_NE(wrong.find("rejected the access token"), std::string::npos) << wrong;
  EXPECT_EQ(wrong.find(bad_token), std::string::npos) << "token leaked into the error";

  std::string missing = fetch(kGood, "org/no-such-model");
  EXPECT_NE(missing.find("no such model repo 'org/no-such-model'"), std::string::npos) << missing;

  std::string no_rev = error_of([&] {
    HfHubClient(options()).download("org/tiny-model", HfRepoType::Model, "v9.9", "", PatternFilter{}, out.path);
  });
  EXPECT_NE(no_rev.find("no such revision"), std::string::npos) << no_rev;

  EXPECT_FALSE(std::filesystem::exists(out / "config.json"));  // nothing was written by the failures

  TransferReport ok = HfHubClient(options(kGood)).download("org/gated-model", HfRepoType::Model, "main", "",
                                                           PatternFilter{default_model_allow_patterns(), {}}, out.path);
  EXPECT_EQ(read_file(out / "model.safetensors"), fixture("models/org/gated-model/model.safetensors"));
  EXPECT_EQ(ok.files.size(), 6u);
}

TEST_F(HfHub, ServerErrorsRateLimitsAndCutBodiesAreRetriedAndResumed) {
  TempDir out;
  auto t0 = std::chrono::steady_clock::now();
  TransferReport r = HfHubClient(options()).download("org/flaky-model", HfRepoType::Model, "main", "",
                                                     PatternFilter{}, out.path);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(seconds, 1.0) << "Retry-After: 1 was not honoured";
  for (const char* p : {"config.json", "tokenizer.json", "model.safetensors"})
    EXPECT_EQ(read_file(out / p), fixture(std::string("models/org/flaky-model/") + p)) << p;
  int config_gets = 0, tokenizer_gets = 0, cdn_gets = 0;
  std::string resume_range;
  for (const auto& e : request_log()) {
    std::string path = e["path"];
    if (path.find("/resolve/") != std::string::npos && path.find("config.json") != std::string::npos) ++config_gets;
    if (path.find("/resolve/") != std::string::npos && path.find("tokenizer.json") != std::string::npos) ++tokenizer_gets;
    if (path.rfind("/_cdn/", 0) == 0) {
      ++cdn_gets;
      if (!e["range"].is_null()) resume_range = e["range"];
    }
  }
  EXPECT_EQ(config_gets, 3);     // 503, 503, 200
  EXPECT_EQ(tokenizer_gets, 2);  // 429, 200
  EXPECT_EQ(cdn_gets, 2);        // cut body, then the rest
  size_t size = fixture("models/org/flaky-model/model.safetensors").size();
  EXPECT_EQ(resume_range, "bytes=" + std::to_string(size / 2) + "-");
  bool resumed = false;
  for (const auto& f : r.files)
    if (f.path == "model.safetensors") resumed = f.outcome == FetchOutcome::Resumed;
  EXPECT_TRUE(resumed);
}

TEST_F(HfHub, AFailedDownloadLeavesOnlyAPartialNeverTheRealName) {
  TempDir out;
  HfOptions o = options();
  o.retry.max_attempts = 1;
  std::string err = error_of([&] {
    HfHubClient(o).download("org/flaky-model", HfRepoType::Model, "main", "", PatternFilter{{"*.safetensors"}, {}},
                            out.path);
  });
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(out / "model.safetensors"));
  auto partials = all_files(out.path);
  ASSERT_EQ(partials.size(), 1u);
  EXPECT_EQ(partials[0].rfind(".ktune-download/", 0), 0u);
  // A later run resumes from it.
  TransferReport r = HfHubClient(options()).download("org/flaky-model", HfRepoType::Model, "main", "",
                                                     PatternFilter{{"*.safetensors"}, {}}, out.path);
  EXPECT_EQ(r.files.at(0).outcome, FetchOutcome::Resumed);
  EXPECT_EQ(read_file(out / "model.safetensors"), fixture("models/org/flaky-model/model.safetensors"));
  EXPECT_LT(r.bytes_transferred, r.total_bytes());
}

TEST_F(HfHub, PartialFromAnEarlierRunIsResumedAndACorruptOneReplaced) {
  std::string data = fixture("models/org/tiny-model/model.safetensors");
  HfHubClient hub(options());
  HfRepoInfo info = hub.repo_info("org/tiny-model", HfRepoType::Model);
  std::string sha;
  for (const auto& s : info.siblings)
    if (s.path == "model.safetensors") sha = s.lfs_sha256;
  {
    TempDir out;
    TargetDir target(out.path);
    write_file(target.partial_path("model.safetensors", sha), data.substr(0, 1000));
    TransferReport r = hub.download("org/tiny-model", HfRepoType::Model, "main", "", PatternFilter{{"*.safetensors"}, {}},
                                    out.path);
    EXPECT_EQ(r.files.at(0).outcome, FetchOutcome::Resumed);
    EXPECT_EQ(r.bytes_transferred, data.size() - 1000);
    EXPECT_EQ(read_file(out / "model.safetensors"), data);
    bool ranged = false;
    for (const auto& e : request_log())
      if (!e["range"].is_null() && e["range"] == "bytes=1000-") ranged = true;
    EXPECT_TRUE(ranged);
  }
  {
    TempDir out;
    TargetDir target(out.path);
    write_file(target.partial_path("model.safetensors", sha), std::string(1000, 'x'));  // not a prefix
    TransferReport r = hub.download("org/tiny-model", HfRepoType::Model, "main", "", PatternFilter{{"*.safetensors"}, {}},
                                    out.path);
    EXPECT_EQ(read_file(out / "model.safetensors"), data);  // sha256 caught it; fetched again whole
    EXPECT_EQ(r.files.at(0).outcome, FetchOutcome::Downloaded);
  }
}

TEST_F(HfHub, FilesAlreadyThereAreCheckedNotFetchedAgain) {
  TempDir out;
  HfHubClient hub(options());
  PatternFilter f{default_model_allow_patterns(), {}};
  hub.download("org/tiny-model", HfRepoType::Model, "main", "", f, out.path);
  write_file(out / "config.json", "{\"tampered\": 1}");  // changed locally: must be fetched again
  HttpClient http;
  http.perform({"POST", endpoint() + "/_reset"});
  TransferReport again = hub.download("org/tiny-model", HfRepoType::Model, "main", "", f, out.path);
  for (const auto& file : again.files)
    EXPECT_EQ(file.outcome, file.path == "config.json" ? FetchOutcome::Downloaded : FetchOutcome::UpToDate) << file.path;
  EXPECT_EQ(read_file(out / "config.json"), fixture("models/org/tiny-model/config.json"));
  int resolves = 0;
  for (const auto& e : request_log())
    if (e["path"].get<std::string>().find("/resolve/") != std::string::npos) ++resolves;
  EXPECT_EQ(resolves, 1);
}

TEST_F(HfHub, EscapingSiblingIsRefusedBeforeAnythingIsWritten) {
  TempDir parent;
  std::string out = parent / "out";
  std::string err = error_of([&] {
    HfHubClient(options()).download("org/evil", HfRepoType::Model, "main", "", PatternFilter{}, out);
  });
  EXPECT_NE(err.find("'../escape.txt'"), std::string::npos) << err;
  EXPECT_NE(err.find("escape the target directory"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(parent / "escape.txt"));
  EXPECT_FALSE(std::filesystem::exists(out)) << "the refused download left its output folder (or config.json) behind";
}

TEST_F(HfHub, SymlinkInTheTargetLeadingOutsideIsRefused) {
  TempDir parent;
  std::filesystem::create_directories(parent / "out");
  std::filesystem::create_directories(parent / "elsewhere");
  ASSERT_EQ(symlink((parent / "elsewhere").c_str(), (parent / "out/original").c_str()), 0);
  std::string err = error_of([&] {
    HfHubClient(options()).download("org/tiny-model", HfRepoType::Model, "main", "",
                                    PatternFilter{default_model_allow_patterns(), {}}, parent / "out");
  });
  EXPECT_NE(err.find("symlink leading outside"), std::string::npos) << err;
  EXPECT_TRUE(all_files(parent / "elsewhere").empty());
}

TEST_F(HfHub, UploadCommitsRegularAndLfsFilesByteForByte) {
  TempDir src;
  write_file(src / "config.json", "{\"hidden_size\": 64}");
  std::string weights = fixture("models/org/tiny-model/model.safetensors");
  write_file(src / "model.safetensors", weights);
  HfHubClient hub(options(kGood));
  std::string commit = hub.upload("org/exported", HfRepoType::Model, "main",
                                  {{src / "config.json", "config.json"}, {src / "model.safetensors", "sub/model.safetensors"}},
                                  "test upload");
  EXPECT_EQ(commit.size(), 40u);
  EXPECT_EQ(read_file(upload_dir_->path + "/models/org/exported/config.json"), "{\"hidden_size\": 64}");
  EXPECT_EQ(read_file(upload_dir_->path + "/models/org/exported/sub/model.safetensors"), weights);
  bool lfs_put = false;
  for (const auto& e : request_log())
    if (e["method"] == "PUT" && e["path"].get<std::string>().rfind("/_lfs_upload/", 0) == 0) {
      lfs_put = true;
      EXPECT_FALSE(e["has_auth"].get<bool>());
    }
  EXPECT_TRUE(lfs_put);
  std::string no_token = error_of([&] {
    HfHubClient(options()).upload("org/exported", HfRepoType::Model, "main", {{src / "config.json", "c.json"}}, "x");
  });
  EXPECT_NE(no_token.find("needs an access token"), std::string::npos);
}
