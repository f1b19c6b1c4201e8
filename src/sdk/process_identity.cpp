// Process-group signalling for the local backend (see process_identity.h).
#include "sdk/process_identity.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"

namespace ktune::sdk {

// Live (non-zombie) members of a process group, found by scanning /proc: kill(-pgid, 0) would
// also count zombies that their parent has not reaped yet. Any process on the machine may exit
// while it is being read; it then counts as not live.
static int group_live_members(int pgid) {
  int n = 0;
  DIR* proc = opendir("/proc");
  if (!proc) return 0;
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    ProcStat stat;
    if (!read_proc_stat(e->d_name, &stat)) continue;
    if (stat.process_group == pgid && !is_zombie_or_dead(stat.state)) ++n;
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
