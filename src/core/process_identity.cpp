// /proc parsing: whether a recorded pid is still the same live process (see process_identity.h).
#include "core/process_identity.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>
#include <string>

namespace ktune {

// The text of /proc/<pid>/stat, or false when it cannot be read whole. A process that exits
// between open() and read() makes read() fail with ESRCH: that is an answer ("gone"), never an
// error, so this reads with plain read(2) (std::ifstream would throw from its underflow).
static bool read_proc_stat_text(const std::string& pid, std::string* text) {
  const std::string path = "/proc/" + pid + "/stat";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  text->clear();
  char buffer[1024];
  bool ok = true;
  while (true) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      text->append(buffer, size_t(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      ok = false;
      break;
    }
  }
  close(fd);
  return ok;
}

// "pid (comm) state ppid pgrp ... starttime(22) ...". comm may hold spaces and parentheses,
// so fields are counted from the last ')'.
bool read_proc_stat(const std::string& pid, ProcStat* stat) {
  std::string text;
  if (!read_proc_stat_text(pid, &text)) return false;
  size_t close_paren = text.rfind(')');
  if (close_paren == std::string::npos) return false;
  std::istringstream rest(text.substr(close_paren + 1));
  long parent = 0;
  rest >> stat->state >> parent >> stat->process_group;  // fields 3, 4, 5
  std::string field;
  for (int i = 6; i < 22; ++i) rest >> field;
  rest >> stat->start_time;  // field 22
  return bool(rest);
}

bool is_zombie_or_dead(char state) { return state == 'Z' || state == 'X'; }

long long process_start_time(int pid) {
  if (pid <= 0) return 0;
  ProcStat stat;
  if (!read_proc_stat(std::to_string(pid), &stat)) return 0;
  if (is_zombie_or_dead(stat.state)) return 0;
  return stat.start_time;
}

bool process_is_alive(int pid, long long start_time) {
  long long now_start = process_start_time(pid);
  if (now_start == 0) return false;
  return start_time == 0 || now_start == start_time;
}

}  // namespace ktune
