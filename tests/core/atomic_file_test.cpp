// AtomicFile: the path holds the old bytes or the new, never a part; an uncommitted file leaves
// nothing behind; errors name the path.
#include "core/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"

namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("ktune-atomic-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t entries(const fs::path& dir) { return size_t(std::distance(fs::directory_iterator(dir), {})); }

}  // namespace

TEST(AtomicFile, ReplacesThePathOnlyAtCommit) {
  const fs::path dir = fresh_dir("commit"), path = dir / "state.json";
  ktune::write_file_atomic(path.string(), "old");
  {
    ktune::AtomicFile file(path.string());
    file.write("new ", 4);
    file.write("bytes", 5);
    EXPECT_EQ(read(path), "old") << "the path keeps its bytes until the commit";
    EXPECT_EQ(entries(dir), 2u) << "the temporary sits beside it";
    file.commit();
  }
  EXPECT_EQ(read(path), "new bytes");
  EXPECT_EQ(entries(dir), 1u) << "no temporary left";
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  fs::remove_all(dir);
}

TEST(AtomicFile, AnUncommittedFileLeavesNothing) {
  const fs::path dir = fresh_dir("abandon"), path = dir / "model.safetensors";
  {
    ktune::AtomicFile file(path.string());
    file.write("partial", 7);
  }  // a throw between the writes and the commit ends here
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(entries(dir), 0u);
  fs::remove_all(dir);
}

TEST(AtomicFile, AMissingDirectoryIsAnErrorNamingThePath) {
  const fs::path path = fresh_dir("missing") / "no-such-dir" / "config.json";
  try {
    ktune::write_file_atomic(path.string(), "{}");
    FAIL() << "wrote into a missing directory";
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
  fs::remove_all(path.parent_path().parent_path());
}
