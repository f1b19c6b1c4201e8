// /proc parsing and process-group signalling for the local backend (see process_identity.h).
#include "sdk/process_identity.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/error.h"

namespace ktune::sdk {

// /proc/<pid>/stat: "pid (comm) state ppid ... starttime(22) ...". comm may hold spaces and
// parentheses, so fields are counted from the last ')'.
static bool read_stat(int pid, char* state, long long* start_time) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return false;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  rest >> *state;  // field 3
  for (int i = 4; i < 22; ++i) rest >> field;
  rest >> *start_time;  // field 22
  return bool(rest);
}

long long process_start_time(int pid) {
  if (pid <= 0) return 0;
  char state = 0;
  long long start = 0;
  if (!read_stat(pid, &state, &start)) return 0;
  if (state == 'Z' || state == 'X') return 0;
  return start;
}

bool process_is_alive(int pid, long long start_time) {
  long long now_start = process_start_time(pid);
  if (now_start == 0) return false;
  return start_time == 0 || now_start == start_time;
}

// Live (non-zombie) members of a process group, found by scanning /proc: kill(-pgid, 0) would
// also count zombies that their parent has not reaped yet.
static int group_live_members(int pgid) {
  int n = 0;
  DIR* proc = opendir("/proc");
  if (!proc) return 0;
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/stat");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 1));
    char state = 0;
    long ppid = 0, pgrp = 0;
    rest >> state >> ppid >> pgrp;
    if (rest && pgrp == pgid && state != 'Z' && state != 'X') ++n;
  }
  closedir(proc);
  return n;
}

bool stop_process_group(int pgid, long long start_time, double grace_seconds) {
  if (pgid <= 1) return false;
  // The leader's pid was reused by an unrelated process: the group is not ours any more (a new
  // process would only share the pgid if it were that leader's descendant, which a reused pid is not).
  long long leader_start = process_start_time(pgid);
  if (leader_start != 0 && start_time != 0 && leader_start != start_time) return false;
  if (group_live_members(pgid) == 0) return false;
  kill(-pgid, SIGTERM);
  kill(-pgid, SIGCONT);  // a stopped process must wake up to handle SIGTERM
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (group_live_members(pgid) == 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  if (group_live_members(pgid) == 0) return false;
  kill(-pgid, SIGKILL);
  return true;
}

int free_local_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  check(fd >= 0, "local backend", "cannot create a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  check(ok, "local backend", "cannot bind 127.0.0.1:0 to find a free port");
  return ntohs(addr.sin_port);
}

double unix_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace ktune::sdk
