// End to end through the built `ktune` binary: the initializer env contract (STORAGE_URI,
// ACCESS_TOKEN, IGNORE_PATTERNS, AWS_*, KTUNE_WORKSPACE) against the local Hub server, moto and
// file://; `ktune download` in both spellings; `ktune export` to file://, s3:// and hf://. Every
// run checks that the token and the S3 secret appear in no output and no written file.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <filesystem>
#include <fstream>
#include <set>

#include "test_processes.h"

using namespace ktune::hub::testing;

static const std::string kGood = "hf_goodtoken1234567890";

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    uploads_ = new TempDir();
    hub_ = new ServerProcess(source_dir() + "/tests/hub/hub_server.py",
                             {"--root", source_dir() + "/tests/hub/fixtures/hub", "--upload-dir", uploads_->path,
                              "--max-seconds", "300"});
    if (python_has("moto") && python_has("boto3"))
      s3_ = new ServerProcess(source_dir() + "/tests/hub/s3_server.py", {"--max-seconds", "300"}, 90);
  }
  static void TearDownTestSuite() {
    delete hub_;
    delete s3_;
    delete uploads_;
    s3_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(hub_->ready());
    ASSERT_TRUE(std::filesystem::exists(ktune_binary())) << ktune_binary();
  }
  static std::string hub_endpoint() { return "http://127.0.0.1:" + std::to_string(hub_->port()); }
  static std::string s3_endpoint() { return "http://127.0.0.1:" + std::to_string(s3_->port()); }
  // The environment of a clean run: no inherited tokens or keys.
  static std::map<std::string, std::string> base_env() {
    std::map<std::string, std::string> env;
    for (const char* k : {"HF_TOKEN", "ACCESS_TOKEN", "IGNORE_PATTERNS", "STORAGE_URI", "AWS_ACCESS_KEY_ID",
                          "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                          "AWS_REGION", "AWS_DEFAULT_REGION", "KTUNE_WORKSPACE", "ENDPOINT", "ACCESS_KEY_ID",
                          "SECRET_ACCESS_KEY", "REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN",
                          "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ENDPOINT_URL_STS", "ROLE_ARN"})
      env[k] = "\x01";
    env["AWS_CONFIG_FILE"] = "/nonexistent/ktune-test/aws-config";  // not this machine's ~/.aws
    env["AWS_SHARED_CREDENTIALS_FILE"] = "/nonexistent/ktune-test/aws-credentials";
    env["HF_ENDPOINT"] = hub_endpoint();
    return env;
  }
  static std::map<std::string, std::string> s3_env() {
    auto env = base_env();
    env["AWS_ACCESS_KEY_ID"] = s3_->info()["access_key_id"];
    env["AWS_SECRET_ACCESS_KEY"] = s3_->info()["secret_access_key"];
    env["AWS_ENDPOINT_URL"] = s3_endpoint();
    env["AWS_REGION"] = "us-east-1";
    return env;
  }
  static void expect_no_secret(const CommandResult& r, const std::string& secret, const std::string& dir = "") {
    EXPECT_EQ(r.out.find(secret), std::string::npos) << "secret on stdout";
    EXPECT_EQ(r.err.find(secret), std::string::npos) << "secret on stderr";
    if (!dir.empty() && std::filesystem::exists(dir)) {
      for (const std::string& f : all_files(dir)) {
        EXPECT_EQ(read_file(dir + "/" + f).find(secret), std::string::npos) << "secret in " << f;
      }
    }
  }
  static std::set<std::string> files_in(const std::string& dir) {
    auto v = all_files(dir);
    return {v.begin(), v.end()};
  }
  static std::string fixture(const std::string& p) {
    return read_file(source_dir() + "/tests/hub/fixtures/hub/" + p);
  }
  static ServerProcess* hub_;
  static ServerProcess* s3_;
  static TempDir* uploads_;
};
ServerProcess* Cli::hub_ = nullptr;
ServerProcess* Cli::s3_ = nullptr;
TempDir* Cli::uploads_ = nullptr;

TEST_F(Cli, ModelInitializerReadsTheUpstreamEnvContract) {
  TempDir ws;
  auto env = base_env();
  env["STORAGE_URI"] = "hf://org/gated-model";
  env["ACCESS_TOKEN"] = kGood;
  env["KTUNE_WORKSPACE"] = ws.path;
  CommandResult r = run_command({ktune_binary(), "initializer", "model"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The repo's files, and the repo id (torchtune's original_repo_id.json) that an adapter trained
  // on this model names as its base.
  EXPECT_EQ(files_in(ws / "model"),
            (std::set<std::string>{"config.json", "generation_config.json", "merges.txt", "model.safetensors",
                                   "original/tokenizer.model", "original_repo_id.json", "tokenizer_config.json"}));
  EXPECT_EQ(nlohmann::json::parse(read_file(ws / "model/original_repo_id.json")), (nlohmann::json{{"repo_id", "org/gated-model"}}));
  EXPECT_EQ(read_file(ws / "model/model.safetensors"), fixture("models/org/gated-model/model.safetensors"));
  EXPECT_NE(r.err.find("[6/6]"), std::string::npos) << r.err;  // a progress line per file
  EXPECT_NE(r.out.find("model-initializer: 6 files"), std::string::npos) << r.out;
  expect_no_secret(r, kGood, ws.path);

  // IGNORE_PATTERNS narrows the default set; a second run finds the rest up to date.
  TempDir ws2;
  env["KTUNE_WORKSPACE"] = ws2.path;
  env["IGNORE_PATTERNS"] = "*.safetensors,original/*";
  r = run_command({ktune_binary(), "initializer", "model"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(files_in(ws2 / "model"), (std::set<std::string>{"config.json", "generation_config.json", "merges.txt",
                                                            "original_repo_id.json", "tokenizer_config.json"}));
  r = run_command({ktune_binary(), "initializer", "model"}, env);
  EXPECT_NE(r.err.find("(up to date)"), std::string::npos) << r.err;
}

TEST_F(Cli, DatasetInitializerFetchesTheSubpathIntoWorkspaceDataset) {
  TempDir ws;
  auto env = base_env();
  env["STORAGE_URI"] = "hf://org/tiny-data/data";
  env["KTUNE_WORKSPACE"] = ws.path;
  CommandResult r = run_command({ktune_binary(), "initializer", "dataset"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(files_in(ws / "dataset"), (std::set<std::string>{"data/test.jsonl", "data/train.jsonl"}));
  // --output-dir overrides the workspace; the whole repo without a subpath.
  TempDir other;
  env["STORAGE_URI"] = "hf://org/tiny-data";
  r = run_command({ktune_binary(), "initializer", "dataset", "--output-dir", other / "d"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(files_in(other / "d").size(), 4u);
}

TEST_F(Cli, InitializerErrorsNameTheCauseAndHideTheToken) {
  TempDir ws;
  auto env = base_env();
  env["KTUNE_WORKSPACE"] = ws.path;
  CommandResult r = run_command({ktune_binary(), "initializer", "model"}, env);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("STORAGE_URI is not set"), std::string::npos) << r.err;
  env["STORAGE_URI"] = "hf://org/gated-model";
  env["ACCESS_TOKEN"] = "hf_invalidtoken5555555";
  r = run_command({ktune_binary(), "initializer", "model"}, env);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("rejected the access token"), std::string::npos) << r.err;
  expect_no_secret(r, "hf_invalidtoken5555555", ws.path);
  env["ACCESS_TOKEN"] = "\x01";
  env["STORAGE_URI"] = "hf://org/evil";  // lists "../escape.txt", which *.txt would take
  r = run_command({ktune_binary(), "initializer", "model", "--output-dir", ws / "evil"}, env);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("../escape.txt"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(ws / "escape.txt"));
}

TEST_F(Cli, DownloadAcceptsHfUrisAndTorchtunesSpelling) {
  TempDir out;
  auto env = base_env();
  CommandResult r = run_command({ktune_binary(), "download", "org/tiny-model", "--output-dir", out / "a", "--hf-token",
                                 kGood, "--ignore-patterns", "*.bin, *.msgpack,original/*"},
                                env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(files_in(out / "a"), (std::set<std::string>{"README.md", "config.json", "generation_config.json", "merges.txt",
                                                        "model.safetensors", "original_repo_id.json", "tokenizer_config.json"}));
  EXPECT_EQ(nlohmann::json::parse(read_file(out / "a/original_repo_id.json")).at("repo_id"), "org/tiny-model");
  expect_no_secret(r, kGood, out.path);
  env["HF_TOKEN"] = kGood;
  r = run_command({ktune_binary(), "download", "hf://org/tiny-data/data", "--repo-type", "dataset", "--output-dir",
                   out / "b"},
                  env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(files_in(out / "b"), (std::set<std::string>{"data/test.jsonl", "data/train.jsonl"}));
  expect_no_secret(r, kGood, out.path);
}

// A download larger than the disk is refused before its first byte, from the Hub and from file://:
// the destination on a 64 KiB tmpfs of a mount namespace of its own (skipped, visibly, where the
// machine allows none); each command names the source, the bytes and files it needed and the bytes
// free, and leaves the destination empty (no partial file either).
TEST_F(Cli, ADownloadLargerThanTheDiskIsRefusedBeforeItsFirstByte) {
  TempDir out;
  std::filesystem::create_directories(out / "disk");
  CommandResult probe = run_command(
      {"/usr/bin/unshare", "-m", "/bin/sh", "-c", "mount -t tmpfs -o size=64k tmpfs " + (out / "disk") + " && echo mounted"}, {});
  if (probe.out.find("mounted") == std::string::npos)
    GTEST_SKIP() << "this machine cannot mount a small tmpfs in a mount namespace (unshare -m, exit "
                 << probe.exit_code << "): " << probe.err;
  write_file(out / "src/config.json", "{}");
  write_file(out / "src/model.safetensors", std::string(200000, 'w'));
  const std::string disk = out / "disk";
  const std::string script =
      "mount -t tmpfs -o size=64k tmpfs " + disk + " && { " + ktune_binary() + " download org/tiny-model --output-dir " +
      disk + "/hub; echo EXIT=$?; echo LEFT: $(ls -A " + disk + "/hub); " + ktune_binary() + " download file://" +
      (out / "src") + " --output-dir " + disk + "/file; echo EXIT=$?; echo LEFT: $(ls -A " + disk + "/file); }";
  CommandResult r = run_command({"/usr/bin/unshare", "-m", "/bin/sh", "-c", script}, base_env());
  EXPECT_EQ(r.out, "EXIT=1\nLEFT:\nEXIT=1\nLEFT:\n") << r.out << r.err;
  EXPECT_NE(r.err.find("error: hf://org/tiny-model: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("error: file://" + (out / "src") + ": 200002 bytes (2 files) to write into " + disk + "/file"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(" bytes free: free space or choose another destination"), std::string::npos) << r.err;
}

// file:// gives a copy of its own: writing into a fetched file in place (as json.dump(open(p, "w"))
// does) leaves the source as it was, and the source keeps one link (no hard link shares its inode);
// fetching again copies again rather than calling a changed copy up to date.
TEST_F(Cli, AFileDownloadIsACopyOfItsOwn) {
  TempDir dir;
  write_file(dir / "src/config.json", "{\"rope_theta\": 500000.0}");
  write_file(dir / "src/model.safetensors", std::string(3000, 'w'));
  CommandResult r =
      run_command({ktune_binary(), "download", "file://" + (dir / "src"), "--output-dir", dir / "copy"}, base_env());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name : {"config.json", "model.safetensors"}) {
    struct stat source {};
    ASSERT_EQ(::stat((dir / "src/" + name).c_str(), &source), 0);
    EXPECT_EQ(source.st_nlink, 1u) << name << ": the source gained a link";
  }
  {
    std::ofstream edit(dir / "copy/config.json", std::ios::trunc);  // in place: same inode
    edit << "{\"rope_theta\": 1.0}";
  }
  std::filesystem::resize_file(dir / "copy/model.safetensors", 1000);
  EXPECT_EQ(read_file(dir / "src/config.json"), "{\"rope_theta\": 500000.0}");
  EXPECT_EQ(read_file(dir / "src/model.safetensors"), std::string(3000, 'w'));
  r = run_command({ktune_binary(), "download", "file://" + (dir / "src"), "--output-dir", dir / "copy"}, base_env());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("up to date"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(dir / "copy/model.safetensors"), std::string(3000, 'w'));
  EXPECT_EQ(read_file(dir / "copy/config.json"), "{\"rope_theta\": 500000.0}");
}

// A token given as a flag is overwritten in the process's own argv once read: `ps` (here
// /proc/<pid>/cmdline, read once the download has connected to a server that never answers) shows stars.
TEST_F(Cli, ASecretFlagDoesNotShowInTheProcessList) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  TempDir out;
  const std::string endpoint = "--hf-endpoint=http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  std::vector<std::string> words = {ktune_binary(), "download", "hf://org/model", "--output-dir", out.path,
                                    "--hf-token", kGood, endpoint};
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  // The download connects only after main() has read its arguments (and hidden the token): wait for
  // its connection, however slow the start (a sanitizer build's), rather than for a fixed time.
  pollfd connecting{listener, POLLIN, 0};
  const int ready = ::poll(&connecting, 1, 30000);
  const std::string cmdline = read_file("/proc/" + std::to_string(pid) + "/cmdline");
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ::close(listener);
  ASSERT_EQ(ready, 1) << "the download never connected";
  EXPECT_NE(cmdline.find("hf://org/model"), std::string::npos) << cmdline;
  EXPECT_EQ(cmdline.find(kGood), std::string::npos) << cmdline;
  EXPECT_NE(cmdline.find(std::string(kGood.size(), '*')), std::string::npos) << cmdline;
}

TEST_F(Cli, InitializerFromS3AndFromFile) {
  if (s3_ == nullptr) GTEST_SKIP() << "Python packages moto and boto3 are needed for the S3 server";
  ASSERT_TRUE(s3_->ready());
  // Put a model folder with `ktune export`'s S3 path is tested below; here boto3 writes it.
  TempDir src;
  write_file(src / "config.json", "{\"s3\": true}");
  write_file(src / "model.safetensors", std::string(50000, 'w'));
  write_file(src / "consolidated.pth", "skip me");
  std::string big(20 << 20, 'b');  // boto3's upload_file sends it in 8 MiB parts: a multipart ETag
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = char('a' + (i / 4096) % 26);
  write_file(src / "model-00002.safetensors", big);
  std::string secret = s3_->info()["secret_access_key"];
  std::string cmd = "python3 " + source_dir() + "/tests/hub/s3_reference.py " + s3_endpoint() + " " +
                    std::string(s3_->info()["access_key_id"]) + " " + secret + " put " +
                    std::string(s3_->info()["bucket"]);
  for (const char* f : {"config.json", "model.safetensors", "consolidated.pth", "model-00002.safetensors"})
    cmd += std::string(" cli-model/") + f + " " + (src / f);
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  TempDir ws;
  auto env = s3_env();
  env["STORAGE_URI"] = "s3://" + std::string(s3_->info()["bucket"]) + "/cli-model";
  env["KTUNE_WORKSPACE"] = ws.path;
  CommandResult r = run_command({ktune_binary(), "initializer", "model"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(files_in(ws / "model"), (std::set<std::string>{"config.json", "model.safetensors", "model-00002.safetensors"}));
  EXPECT_EQ(read_file(ws / "model/model.safetensors"), std::string(50000, 'w'));
  EXPECT_EQ(read_file(ws / "model/model-00002.safetensors"), big);
  expect_no_secret(r, secret, ws.path);

  // A local copy changed in place (same size) is not "up to date": a single-part object's ETag is
  // its MD5, a multipart one's the MD5 of its parts' MD5s, which the copies no longer have, so
  // both are fetched again.
  write_file(ws / "model/model.safetensors", std::string(50000, 'x'));
  std::string changed = big;
  changed[12 << 20] = 'Z';  // inside the second part
  write_file(ws / "model/model-00002.safetensors", changed);
  r = run_command({ktune_binary(), "initializer", "model"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(ws / "model/model.safetensors"), std::string(50000, 'w'));
  EXPECT_EQ(read_file(ws / "model/model-00002.safetensors"), big);
  EXPECT_EQ(r.out.find("model-00002.safetensors 20971520 bytes (up to date)"), std::string::npos) << r.out;

  // Upstream's initializer env alone (the SDK's S3 initializer fields: ENDPOINT, ACCESS_KEY_ID,
  // SECRET_ACCESS_KEY, REGION), over an AWS_ENDPOINT_URL elsewhere that it wins against.
  auto upstream = base_env();
  upstream["STORAGE_URI"] = env["STORAGE_URI"];
  upstream["KTUNE_WORKSPACE"] = ws / "upstream";
  upstream["ENDPOINT"] = s3_endpoint();
  upstream["AWS_ENDPOINT_URL"] = "http://127.0.0.1:1";
  upstream["ACCESS_KEY_ID"] = s3_->info()["access_key_id"];
  upstream["SECRET_ACCESS_KEY"] = secret;
  upstream["REGION"] = "us-east-1";
  r = run_command({ktune_binary(), "initializer", "model"}, upstream);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(files_in(ws / "upstream/model"), (std::set<std::string>{"config.json", "model.safetensors", "model-00002.safetensors"}));
  expect_no_secret(r, secret, ws / "upstream");

  // A laptop's AWS profile alone (AWS_PROFILE; keys in the credentials file, the endpoint in the
  // config file's services block), through the initializer and `ktune download`.
  write_file(ws / "aws/config", "[profile store]\nregion = us-east-1\nservices = moto\n[services moto]\ns3 =\n"
                                "  endpoint_url = " + s3_endpoint() + "\n");
  write_file(ws / "aws/credentials", "[store]\naws_access_key_id = " + std::string(s3_->info()["access_key_id"]) +
                                         "\naws_secret_access_key = " + secret + "\n");
  auto profile = base_env();
  profile["AWS_CONFIG_FILE"] = ws / "aws/config";
  profile["AWS_SHARED_CREDENTIALS_FILE"] = ws / "aws/credentials";
  profile["AWS_PROFILE"] = "store";
  profile["STORAGE_URI"] = env["STORAGE_URI"];
  profile["KTUNE_WORKSPACE"] = ws / "profile";
  r = run_command({ktune_binary(), "initializer", "model"}, profile);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(files_in(ws / "profile/model"), (std::set<std::string>{"config.json", "model.safetensors", "model-00002.safetensors"}));
  expect_no_secret(r, secret, ws / "profile");
  r = run_command({ktune_binary(), "download", env["STORAGE_URI"], "--output-dir", ws / "profile-download",
                   "--allow-patterns", "config.json"}, profile);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(ws / "profile-download/config.json"), "{\"s3\": true}");
  auto by_flag = profile;
  by_flag["AWS_PROFILE"] = "\x01";
  r = run_command({ktune_binary(), "download", env["STORAGE_URI"], "--output-dir", ws / "flag-download",
                   "--allow-patterns", "config.json", "--aws-profile", "store"}, by_flag);
  ASSERT_EQ(r.exit_code, 0) << "--aws-profile names the profile as AWS_PROFILE does: " << r.err;
  EXPECT_EQ(read_file(ws / "flag-download/config.json"), "{\"s3\": true}");
  profile["AWS_PROFILE"] = "absent";
  r = run_command({ktune_binary(), "download", env["STORAGE_URI"], "--output-dir", ws / "absent"}, profile);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("profile 'absent' is in neither " + (ws / "aws/config")), std::string::npos) << r.err;

  env["AWS_SECRET_ACCESS_KEY"] = "notTheRightSecret000";
  r = run_command({ktune_binary(), "initializer", "model", "--output-dir", ws / "bad"}, env);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("SignatureDoesNotMatch"), std::string::npos) << r.err;
  expect_no_secret(r, "notTheRightSecret000");

  auto fenv = base_env();
  fenv["STORAGE_URI"] = "file://" + src.path;
  fenv["KTUNE_WORKSPACE"] = ws / "f";
  r = run_command({ktune_binary(), "initializer", "dataset"}, fenv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(files_in(ws / "f/dataset"),
            (std::set<std::string>{"config.json", "consolidated.pth", "model.safetensors", "model-00002.safetensors"}));
  EXPECT_EQ(read_file(ws / "f/dataset/config.json"), "{\"s3\": true}");
}

// A torchtune-layout output dir with two epochs.
static void make_output_dir(const std::string& root) {
  for (int e : {0, 1}) {
    std::string d = root + "/epoch_" + std::to_string(e) + "/";
    write_file(d + "adapter_model.safetensors", std::string(1000 + e, 'a'));
    write_file(d + "adapter_config.json", "{\"r\": 8, \"epoch\": " + std::to_string(e) + "}");
    write_file(d + "adapter_model.pt", "pickle");
    write_file(d + "model-00001-of-00002.safetensors", std::string(3000, 'm'));
    write_file(d + "model-00002-of-00002.safetensors", std::string(2000, 'n'));
    write_file(d + "model.safetensors.index.json", "{}");
    write_file(d + "config.json", "{}");
    write_file(d + "tokenizer.json", "{}");
  }
  write_file(root + "/recipe_state/recipe_state.pt", "state");
}

TEST_F(Cli, ExportCopiesTheLatestEpochToFileS3AndHub) {
  TempDir job;
  make_output_dir(job / "output");
  auto env = base_env();
  CommandResult r = run_command(
      {ktune_binary(), "export", "--from", job / "output", "--to", "file://" + (job / "dest"), "--parts", "adapter"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json summary = nlohmann::json::parse(r.out);
  EXPECT_EQ(summary["epoch"], 1);
  EXPECT_EQ(summary["parts"], "adapter");
  EXPECT_EQ(summary["file_count"], 2);
  EXPECT_EQ(summary["bytes"], 1001 + read_file(job / "output/epoch_1/adapter_config.json").size());
  EXPECT_EQ(files_in(job / "dest"), (std::set<std::string>{"adapter_config.json", "adapter_model.safetensors"}));
  EXPECT_EQ(read_file(job / "dest/adapter_model.safetensors"), std::string(1001, 'a'));

  env["HF_TOKEN"] = kGood;
  r = run_command({ktune_binary(), "export", "--from", job / "output", "--to", "hf://org/finetuned"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  summary = nlohmann::json::parse(r.out);
  EXPECT_EQ(summary["parts"], "all");
  EXPECT_EQ(summary["file_count"], 7);
  EXPECT_EQ(summary["revision"].get<std::string>().size(), 40u);
  std::string repo = uploads_->path + "/models/org/finetuned";
  EXPECT_EQ(files_in(repo).size(), 7u);
  EXPECT_EQ(read_file(repo + "/model-00001-of-00002.safetensors"), std::string(3000, 'm'));
  expect_no_secret(r, kGood, repo);

  if (s3_ == nullptr) GTEST_SKIP() << "Python packages moto and boto3 are needed for the S3 part of this test";
  auto senv = s3_env();
  std::string bucket = s3_->info()["bucket"];
  r = run_command({ktune_binary(), "export", "--from", job / "output", "--to", "s3://" + bucket + "/runs/r1", "--parts",
                   "merged"},
                  senv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  summary = nlohmann::json::parse(r.out);
  EXPECT_EQ(summary["destination"], "s3://" + bucket + "/runs/r1");
  EXPECT_EQ(summary["file_count"], 5);
  std::string cmd = "python3 " + source_dir() + "/tests/hub/s3_reference.py " + s3_endpoint() + " " +
                    std::string(s3_->info()["access_key_id"]) + " " + std::string(s3_->info()["secret_access_key"]) +
                    " list " + bucket + " runs/r1/";
  FILE* p = popen(cmd.c_str(), "r");
  std::string listing;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) listing.append(buf, n);
  pclose(p);
  EXPECT_EQ(listing,
            "runs/r1/config.json\t2\nruns/r1/model-00001-of-00002.safetensors\t3000\n"
            "runs/r1/model-00002-of-00002.safetensors\t2000\nruns/r1/model.safetensors.index.json\t2\n"
            "runs/r1/tokenizer.json\t2\n");
  expect_no_secret(r, s3_->info()["secret_access_key"]);
}
