#include "dist/worker_error.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

namespace ktune::dist {

int64_t wall_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void record_worker_error(const std::string& message, bool lost_peer) {
  static std::atomic<bool> recorded{false};
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == 0) return;
  if (recorded.exchange(true)) return;  // the first record is the failure; later ones are its way out
  try {
    int64_t now = wall_clock_ns();
    nlohmann::json doc = {{"message",
                           {{"message", message},
                            {"extraInfo",
                             {{"timestamp", std::to_string(now / 1000000000)},
                              {"timestamp_ns", std::to_string(now)},
                              {"lost_peer", lost_peer ? "1" : "0"}}}}}};
    std::string text = doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::string tmp = std::string(path) + ".tmp" + std::to_string(getpid());
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr) return;
    bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    ok = std::fclose(f) == 0 && ok;
    if (ok) std::rename(tmp.c_str(), path);
    else std::remove(tmp.c_str());
  } catch (...) {
  }
}

std::optional<WorkerError> read_worker_error(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    nlohmann::json doc = nlohmann::json::parse(in);
    const nlohmann::json& m = doc.at("message");
    WorkerError e;
    if (m.is_string()) return WorkerError{m.get<std::string>(), 0};
    e.message = m.at("message").get<std::string>();
    const nlohmann::json& extra = m.value("extraInfo", nlohmann::json::object());
    if (extra.contains("timestamp_ns")) e.time_ns = std::stoll(extra["timestamp_ns"].get<std::string>());
    else if (extra.contains("timestamp")) e.time_ns = std::stoll(extra["timestamp"].get<std::string>()) * 1000000000LL;
    e.lost_peer = extra.value("lost_peer", std::string()) == "1";
    return e;
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace ktune::dist
