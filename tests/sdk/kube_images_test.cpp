// What can be checked of the container images (docker/Dockerfile) without a container runtime:
// the trainer on NVIDIA's CUDA runtime image with its builder on the matching -devel image and
// ktune built with the CUDA backend; the initializer on the same Ubuntu without CUDA; every
// package the Dockerfile installs is one scripts/setup.sh lists (Ubuntu 24.04 names them as
// Debian 12 does) or one of a few image-only packages named here with their reason; the oneDNN
// the builder compiles speaks the API src/kernels/cpu/gemm.cpp uses; every path it copies is in
// the repository and not excluded from the build context; no Python in the final images; `tune` /
// `ktune` as their commands, with the names manifests/ and docs/kubernetes.md use; and the built
// binary, called `tune` as the runtimes' node command calls it, reads the PET_* env and the
// --rdzv_endpoint the Kubeflow controller injects.
// It deliberately does not build or run an image (no docker daemon or registry here): whether the
// images build is proven only where they are built (see docs/kubernetes.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "../hub/test_processes.h"

namespace {

namespace fs = std::filesystem;
using ktune::hub::testing::CommandResult;
using ktune::hub::testing::read_file;
using ktune::hub::testing::run_command;
using ktune::hub::testing::TempDir;
using Json = nlohmann::json;

const std::string kSource = KTUNE_SOURCE_DIR;
const std::string kKtune = std::string(KTUNE_BINARY_DIR) + "/bin/ktune";

struct Instruction {
  std::string keyword;  // upper-cased: FROM, RUN, COPY, ARG, ENV, CMD, ENTRYPOINT, ...
  std::string args;     // continuation lines joined with a space
  int line = 0;
};

struct Stage {
  std::string name, base;
  std::vector<Instruction> instructions;
};

struct Dockerfile {
  std::map<std::string, std::string> global_args;  // ARGs before the first FROM, with their defaults
  std::vector<Stage> stages;
  const Stage* stage(const std::string& name) const {
    for (const Stage& s : stages)
      if (s.name == name) return &s;
    return nullptr;
  }
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

Dockerfile parse_dockerfile(const std::string& path) {
  std::ifstream in(path);
  Dockerfile d;
  std::string line, pending;
  int line_no = 0, start = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;  // comments may sit inside a continued instruction
    if (pending.empty()) start = line_no;
    const bool continued = t.back() == '\\';
    pending += (pending.empty() ? "" : " ") + (continued ? trim(t.substr(0, t.size() - 1)) : t);
    if (continued) continue;
    Instruction ins;
    const size_t sp = pending.find(' ');
    ins.keyword = pending.substr(0, sp);
    for (char& c : ins.keyword) c = char(std::toupper(static_cast<unsigned char>(c)));
    ins.args = sp == std::string::npos ? "" : trim(pending.substr(sp + 1));
    ins.line = start;
    pending.clear();
    if (ins.keyword == "FROM") {
      Stage s;
      std::smatch m;
      if (std::regex_match(ins.args, m, std::regex(R"((\S+)\s+AS\s+(\S+))", std::regex::icase))) {
        s.base = m[1];
        s.name = m[2];
      } else {
        s.base = ins.args;
      }
      d.stages.push_back(s);
    } else if (d.stages.empty()) {
      if (ins.keyword == "ARG") {
        const size_t eq = ins.args.find('=');
        d.global_args[ins.args.substr(0, eq)] = eq == std::string::npos ? "" : ins.args.substr(eq + 1);
      }
    } else {
      d.stages.back().instructions.push_back(ins);
    }
  }
  return d;
}

// scripts/setup.sh's APT_PACKAGES=( ... ) list, comments dropped.
std::set<std::string> setup_sh_packages() {
  const std::string text = read_file(kSource + "/scripts/setup.sh");
  const size_t a = text.find("APT_PACKAGES=(");
  const size_t b = text.find("\n)", a);
  std::set<std::string> out;
  if (a == std::string::npos || b == std::string::npos) return out;
  std::istringstream body(text.substr(a + 14, b - a - 14));
  std::string line;
  while (std::getline(body, line)) {
    std::istringstream words(line.substr(0, line.find('#')));
    std::string w;
    while (words >> w) out.insert(w);
  }
  return out;
}

// The packages of every `apt-get install` in a RUN (options and shell syntax dropped).
std::vector<std::string> apt_installs(const std::string& run) {
  std::vector<std::string> out;
  for (size_t at = run.find("apt-get install"); at != std::string::npos; at = run.find("apt-get install", at + 1)) {
    std::istringstream words(run.substr(at + 15));
    std::string w;
    while (words >> w) {
      if (w == "&&" || w == "||" || w == ";" || w == "\\") break;
      if (w[0] == '-') continue;
      out.push_back(w);
    }
  }
  return out;
}

Json exec_form(const Stage& s, const std::string& keyword) {
  Json last;
  for (const Instruction& i : s.instructions)
    if (i.keyword == keyword) last = Json::parse(i.args);
  return last;
}

std::string all_runs(const Stage& s) {
  std::string out;
  for (const Instruction& i : s.instructions)
    if (i.keyword == "RUN") out += i.args + "\n";
  return out;
}

class Images : public ::testing::Test {
 protected:
  void SetUp() override {
    docker_ = parse_dockerfile(kSource + "/docker/Dockerfile");
    ASSERT_FALSE(docker_.stages.empty()) << "docker/Dockerfile has no stage";
  }
  Dockerfile docker_;
};

TEST_F(Images, TheTrainerRunsOnTheCudaRuntimeBuiltOnTheMatchingDevelImage) {
  const std::string cuda = docker_.global_args["CUDA_VERSION"];
  EXPECT_TRUE(std::regex_match(cuda, std::regex(R"(13\.0\.\d+)"))) << "CUDA_VERSION " << cuda;
  EXPECT_EQ(docker_.global_args["UBUNTU"], "24.04");
  const Stage* build = docker_.stage("build");
  const Stage* trainer = docker_.stage("trainer");
  const Stage* initializer = docker_.stage("initializer");
  ASSERT_TRUE(build && trainer && initializer);
  EXPECT_EQ(build->base, "nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU}");
  EXPECT_EQ(trainer->base, "nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU}");
  EXPECT_EQ(initializer->base, "ubuntu:${UBUNTU}");  // same release (glibc) as the builder, no CUDA
  // The trainer's binary is built with the CUDA backend required, the initializer's without.
  const std::string runs = all_runs(*build);
  EXPECT_NE(runs.find("-B /build/cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKTUNE_CUDA=ON"), std::string::npos) << runs;
  EXPECT_NE(runs.find("-B /build/cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKTUNE_CUDA=OFF"), std::string::npos) << runs;
  EXPECT_NE(runs.find("for image in trainer:cuda initializer:cpu"), std::string::npos) << runs;
  // KTUNE_CUDA is an option the build knows; the architectures default to cmake/KtuneCuda.cmake's.
  const std::string cuda_cmake = read_file(kSource + "/cmake/KtuneCuda.cmake");
  EXPECT_NE(cuda_cmake.find("set(KTUNE_CUDA AUTO CACHE STRING"), std::string::npos);
  EXPECT_NE(cuda_cmake.find("\"" + docker_.global_args["CUDA_ARCHITECTURES"] + "\""), std::string::npos)
      << "CUDA_ARCHITECTURES " << docker_.global_args["CUDA_ARCHITECTURES"] << " is not KtuneCuda.cmake's default";
  // Neither the GPU driver nor the base image's CUDA libraries are copied into the trainer.
  EXPECT_NE(runs.find("^/usr/local/cuda|/libcuda\\.so|/libnccl\\.so"), std::string::npos) << runs;
}

TEST_F(Images, EveryPackageInstalledIsOneSetupShListsOrANamedImageOnlyOne) {
  const std::set<std::string> setup = setup_sh_packages();
  ASSERT_GT(setup.size(), 10u);
  // Packages only images need, and why.
  const std::map<std::string, std::string> image_only = {
      {"ca-certificates", "HTTPS to the Hugging Face Hub, S3 and the API server from a bare base image"},
      {"python3", "builder only: runs pip for the pyarrow wheel (Arrow/Parquet C++)"},
      {"python3-venv", "builder only: the venv pyarrow is installed into"},
      {"libnccl-dev", "builder only: NCCL from NVIDIA's repository (configured in the CUDA images)"},
      {"libnccl2", "trainer: NCCL at run time (the CUDA runtime image has it; pinned explicitly)"},
      {"build-essential", "onednn stage: also in setup.sh"},
  };
  bool runs_setup = false;
  for (const Stage& s : docker_.stages)
    for (const Instruction& i : s.instructions) {
      if (i.keyword != "RUN") continue;
      if (i.args.find("bash scripts/setup.sh --no-python") != std::string::npos) runs_setup = s.name == "build";
      for (const std::string& p : apt_installs(i.args))
        EXPECT_TRUE(setup.count(p) || image_only.count(p))
            << "docker/Dockerfile:" << i.line << " (stage " << s.name << ") installs " << p
            << ", which scripts/setup.sh does not list";
      // What the builder removes again must be what setup.sh installs.
      std::smatch m;
      if (std::regex_search(i.args, m, std::regex(R"(apt-get purge -y -qq (\S+))")))
        EXPECT_TRUE(setup.count(m[1])) << m[1];
    }
  EXPECT_TRUE(runs_setup) << "the build stage does not install setup.sh's packages";
}

// Ubuntu 24.04's libdnnl-dev is oneDNN 3.1; the builder compiles oneDNN 2.x instead for as long as
// gemm.cpp uses the 2.x API (matmul::desc, set_output_scales; both gone in 3.0).
TEST_F(Images, TheOneDnnTheBuilderCompilesSpeaksTheApiGemmUses) {
  const std::string gemm = read_file(kSource + "/src/kernels/cpu/gemm.cpp");
  const bool uses_v2_api = gemm.find("matmul::desc") != std::string::npos || gemm.find("set_output_scales") != std::string::npos;
  const std::string version = docker_.global_args["ONEDNN_VERSION"];
  ASSERT_TRUE(uses_v2_api) << "gemm.cpp no longer uses oneDNN 2.x's API: the `onednn` stage (and the purge of "
                              "libdnnl-dev) can go, and this test with it";
  EXPECT_EQ(version.substr(0, 2), "2.") << "ONEDNN_VERSION " << version;
  // The oneDNN this repository's own build uses (Debian 12's) is 2.x too: the API gemm.cpp is tested with.
  const std::string header = read_file("/usr/include/oneapi/dnnl/dnnl_version.h");
  if (!header.empty()) EXPECT_NE(header.find("#define DNNL_VERSION_MAJOR 2"), std::string::npos);
  const Stage* build = docker_.stage("build");
  ASSERT_TRUE(build);
  const std::string runs = all_runs(*build);
  EXPECT_NE(runs.find("apt-get purge -y -qq libdnnl-dev"), std::string::npos);
  EXPECT_NE(runs.find("-DCMAKE_PREFIX_PATH=/opt/onednn"), std::string::npos);
  bool copied = false;
  for (const Instruction& i : build->instructions) copied |= i.keyword == "COPY" && i.args == "--from=onednn /opt/onednn /opt/onednn";
  EXPECT_TRUE(copied);
  // find_package(dnnl CONFIG) is how the build looks for it (so CMAKE_PREFIX_PATH reaches it).
  EXPECT_NE(read_file(kSource + "/cmake/KtuneDependencies.cmake").find("find_package(dnnl CONFIG REQUIRED)"), std::string::npos);
}

TEST_F(Images, EveryPathCopiedIsInTheRepositoryAndInTheBuildContext) {
  std::vector<std::string> ignored;
  {
    std::istringstream in(read_file(kSource + "/docker/Dockerfile.dockerignore"));
    std::string l;
    while (std::getline(in, l))
      if (!trim(l).empty() && trim(l)[0] != '#') ignored.push_back(trim(l));
  }
  std::set<std::string> earlier_stages;
  int copies = 0;
  for (const Stage& s : docker_.stages) {
    for (const Instruction& i : s.instructions) {
      if (i.keyword != "COPY" && i.keyword != "ADD") continue;
      std::istringstream words(i.args);
      std::vector<std::string> w;
      for (std::string x; words >> x;) w.push_back(x);
      ASSERT_GE(w.size(), 2u) << "docker/Dockerfile:" << i.line;
      if (w[0].rfind("--from=", 0) == 0) {
        EXPECT_TRUE(earlier_stages.count(w[0].substr(7))) << "docker/Dockerfile:" << i.line << " copies from " << w[0];
        continue;
      }
      if (i.keyword == "ADD") {
        EXPECT_EQ(w[0].rfind("https://", 0), 0u) << "docker/Dockerfile:" << i.line;  // a pinned download, not the context
        continue;
      }
      for (size_t k = 0; k + 1 < w.size(); ++k) {
        ++copies;
        EXPECT_TRUE(fs::exists(kSource + "/" + w[k])) << "docker/Dockerfile:" << i.line << " copies " << w[k];
        const std::string first = w[k].substr(0, w[k].find('/'));
        for (const std::string& pattern : ignored)
          EXPECT_NE(first, pattern) << "docker/Dockerfile:" << i.line << " copies " << w[k] << ", which the .dockerignore drops";
      }
    }
    if (!s.name.empty()) earlier_stages.insert(s.name);
  }
  EXPECT_GE(copies, 2);
  // The context keeps what the build needs (sources, CMake files, the setup script).
  for (const std::string& needed : {"src", "cmake", "scripts", "tests", "CMakeLists.txt"})
    for (const std::string& pattern : ignored) EXPECT_NE(needed, pattern);
}

TEST_F(Images, TheFinalImagesHaveNoPythonAndRunTuneOrKtuneAsTheRuntimesCallThem) {
  for (const std::string name : {"trainer", "initializer"}) {
    const Stage* s = docker_.stage(name);
    ASSERT_TRUE(s) << name;
    for (const Instruction& i : s->instructions) {
      EXPECT_EQ(i.args.find("python"), std::string::npos) << name << ": docker/Dockerfile:" << i.line << " " << i.args;
      EXPECT_EQ(i.args.find("pyarrow"), std::string::npos) << name << ": docker/Dockerfile:" << i.line;
    }
    // The runtimes give the whole command: no entrypoint in the way.
    EXPECT_EQ(exec_form(*s, "ENTRYPOINT"), Json::array()) << name;
    const Json cmd = exec_form(*s, "CMD");
    ASSERT_TRUE(cmd.is_array() && !cmd.empty()) << name;
    EXPECT_EQ(cmd[0], name == "trainer" ? "tune" : "ktune");
  }
  const std::string runs = all_runs(*docker_.stage("build"));
  EXPECT_NE(runs.find("install -D -m 0755 $tree/bin/ktune $out/usr/local/bin/ktune && ln -s ktune $out/usr/local/bin/tune"),
            std::string::npos) << runs;
  // device=cuda loads the GPU step from beside the binary: the trainer's tree carries it, and its libraries.
  EXPECT_NE(runs.find("install -m 0644 $tree/bin/libktune_cuda_step.so $out/usr/local/bin/"), std::string::npos) << runs;
  EXPECT_NE(runs.find("ldd $binaries"), std::string::npos) << runs;
  EXPECT_NE(all_runs(*docker_.stage("trainer")).find("ldd /usr/local/bin/libktune_cuda_step.so"), std::string::npos);

  // The tags built are the images the runtimes reference, with the commands these images offer.
  const std::string dockerfile = read_file(kSource + "/docker/Dockerfile");
  const std::string docs = read_file(kSource + "/docs/kubernetes.md");
  const std::map<std::string, std::string> tags = {{"trainer", "ghcr.io/ktune/ktune-trainer:0.1.0"},
                                                   {"initializer", "ghcr.io/ktune/ktune-initializer:0.1.0"}};
  for (const auto& [target, tag] : tags) {
    const std::regex build_line("docker build -f docker/Dockerfile --target " + target + " +-t " + std::regex_replace(tag, std::regex(R"([.])"), R"(\.)") + " \\.");
    EXPECT_TRUE(std::regex_search(dockerfile, build_line)) << target;
    EXPECT_TRUE(std::regex_search(docs, build_line)) << "docs/kubernetes.md does not document building " << tag;
  }
  int trainer_commands = 0, initializer_commands = 0;
  for (const auto& e : fs::recursive_directory_iterator(kSource + "/manifests/runtimes/torchtune")) {
    if (e.path().extension() != ".yaml" || e.path().filename() == "kustomization.yaml") continue;
    const std::string text = read_file(e.path());
    std::smatch m;
    std::string rest = text;
    const std::regex container(R"(image: (\S+)\n\s+command:\n\s+- (\S+)\n\s+- (\S+))");
    while (std::regex_search(rest, m, container)) {
      if (m[1] == tags.at("trainer")) {
        ++trainer_commands;
        EXPECT_EQ(m[2], "tune") << e.path();
        EXPECT_EQ(m[3], "run") << e.path();
      } else {
        ++initializer_commands;
        EXPECT_EQ(m[1], tags.at("initializer")) << e.path();
        EXPECT_EQ(m[2], "ktune") << e.path();
        EXPECT_EQ(m[3], "initializer") << e.path();
      }
      rest = m.suffix();
    }
  }
  EXPECT_EQ(trainer_commands, 13);  // one node per runtime
  EXPECT_EQ(initializer_commands, 26);
}

// The built binary called `tune` (argv[0], as the symlink in the trainer image), with the node
// command of a runtime and the env the controller sets: the PET_* values and --rdzv_endpoint
// reach the launcher, whose checks name them.
TEST(ImagesBinary, TuneReadsTheControllersPetEnvAndRdzvEndpoint) {
  if (!fs::exists(kKtune)) GTEST_SKIP() << "the ktune binary is not built at " << kKtune;
  TempDir dir;
  fs::create_directories(dir / "bin");
  fs::create_symlink(kKtune, dir / "bin/tune");
  const std::string tune = dir / "bin/tune";
  const CommandResult help = run_command({tune, "--help"}, {});
  EXPECT_EQ(help.exit_code, 0) << help.err;
  EXPECT_NE(help.out.find("also callable as `tune`"), std::string::npos) << help.out;
  // The initializers' command exists and takes upstream's env contract (its usage, exit 2).
  const CommandResult init_help = run_command({kKtune, "initializer", "--help"}, {});
  EXPECT_NE((init_help.out + init_help.err).find("usage: ktune initializer dataset|model"), std::string::npos) << init_help.err;
  EXPECT_NE((init_help.out + init_help.err).find("env: STORAGE_URI, ACCESS_TOKEN, IGNORE_PATTERNS"), std::string::npos);

  // The node command of torchtune-llama3.2-1b with a multi-node job's injected values.
  const std::vector<std::string> node = {tune, "run", "--rdzv_endpoint=job-node-0-0.job:29500", "full_finetune_distributed",
                                         "--config", "llama3_2/1B_full", "output_dir=" + dir / "out"};
  const CommandResult rank = run_command(node, {{"PET_NNODES", "2"}, {"PET_NPROC_PER_NODE", "1"}, {"PET_NODE_RANK", "5"},
                                                {"KTUNE_HOME", dir / "home"}});
  EXPECT_EQ(rank.exit_code, 1);
  EXPECT_NE(rank.err.find("node rank 5 is not below --nnodes 2"), std::string::npos) << rank.err;
  const CommandResult nproc = run_command(node, {{"PET_NNODES", "2"}, {"PET_NPROC_PER_NODE", "x"}, {"PET_NODE_RANK", "1"},
                                                 {"KTUNE_HOME", dir / "home"}});
  EXPECT_EQ(nproc.exit_code, 1);
  EXPECT_NE(nproc.err.find("PET_NPROC_PER_NODE: expected a process count"), std::string::npos) << nproc.err;
  std::vector<std::string> bad_endpoint = node;
  bad_endpoint[2] = "--rdzv_endpoint=job-node-0-0.job:port";
  const CommandResult endpoint = run_command(bad_endpoint, {{"PET_NNODES", "2"}, {"PET_NPROC_PER_NODE", "1"},
                                                           {"PET_NODE_RANK", "1"}, {"KTUNE_HOME", dir / "home"}});
  EXPECT_EQ(endpoint.exit_code, 1);
  EXPECT_NE(endpoint.err.find("rdzv"), std::string::npos) << endpoint.err;
}

}  // namespace
