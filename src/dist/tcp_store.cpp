#include "dist/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "core/error.h"

namespace ktune::dist {

// Wire format, both directions: [op u8][key_len u32][key][value_len u32][value][timeout_ms i64]
// (requests) and [status u8][value_len u32][value] (replies). Little-endian, host order.
enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5 };
enum Status : uint8_t { kOk = 0, kTimeout = 1 };

static bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

static bool read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= size_t(r);
  }
  return true;
}

static bool read_bytes(int fd, Bytes* out) {
  uint32_t n = 0;
  if (!read_all(fd, &n, 4)) return false;
  if (n > (64u << 20)) return false;  // rendezvous data is small; refuse a corrupt length
  out->resize(n);
  return n == 0 || read_all(fd, out->data(), n);
}

static bool write_bytes(int fd, const char* data, uint32_t n) { return write_all(fd, &n, 4) && (n == 0 || write_all(fd, data, n)); }

std::pair<std::string, int> parse_endpoint(const std::string& endpoint, int default_port) {
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) return {endpoint, default_port};
  std::string host = endpoint.substr(0, colon);
  std::string port = endpoint.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  long value = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != 0 || value <= 0 || value > 65535)
    throw Error("rendezvous endpoint '" + endpoint + "'", "expected HOST:PORT with a port in 1..65535");
  return {host, int(value)};
}

TcpStoreServer::TcpStoreServer(int port) {
  listen_fd_ = ::socket(AF_INET6, SOCK_STREAM, 0);
  bool v6 = listen_fd_ >= 0;
  if (!v6) listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listen_fd_ < 0) throw Error("TcpStoreServer", std::string("socket: ") + std::strerror(errno));
  int one = 1, zero = 0;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc;
  if (v6) {
    ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(uint16_t(port));
    rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(uint16_t(port));
    rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  }
  if (rc != 0 || ::listen(listen_fd_, 128) != 0) {
    std::string reason = std::strerror(errno);
    ::close(listen_fd_);
    throw Error("rendezvous store on port " + std::to_string(port), "cannot listen: " + reason);
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  changed_.notify_all();
  for (std::thread& t : clients_) t.join();
}

void TcpStoreServer::accept_loop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> lock(mutex_);
    client_fds_.push_back(fd);
    clients_.emplace_back([this, fd] { serve(fd); });
  }
}

void TcpStoreServer::serve(int fd) {
  for (;;) {
    uint8_t op = 0;
    Bytes key_bytes, value;
    int64_t timeout_ms = 0;
    if (!read_all(fd, &op, 1) || !read_bytes(fd, &key_bytes) || !read_bytes(fd, &value) || !read_all(fd, &timeout_ms, 8)) break;
    std::string key(key_bytes.begin(), key_bytes.end());
    uint8_t status = kOk;
    Bytes reply;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
      auto present = [&] { return stopping_ || data_.count(key) != 0; };
      switch (op) {
        case kSet:
          data_[key] = value;
          changed_.notify_all();
          break;
        case kAdd: {
          int64_t delta = 0, current = 0;
          std::memcpy(&delta, value.data(), std::min<size_t>(8, value.size()));
          auto it = data_.find(key);
          if (it != data_.end()) std::memcpy(&current, it->second.data(), std::min<size_t>(8, it->second.size()));
          current += delta;
          Bytes stored(8);
          std::memcpy(stored.data(), &current, 8);
          data_[key] = stored;
          reply = stored;
          changed_.notify_all();
          break;
        }
        case kCheck:
          reply.push_back(data_.count(key) ? 1 : 0);
          break;
        case kGet:
        case kWait:
          if (!changed_.wait_until(lock, deadline, present) || stopping_) {
            status = kTimeout;
          } else if (op == kGet) {
            reply = data_[key];
          }
          break;
        default:
          status = kTimeout;
      }
    }
    if (!write_all(fd, &status, 1) || !write_bytes(fd, reply.data(), uint32_t(reply.size()))) break;
  }
  ::close(fd);
}

TcpStore::TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout)
    : endpoint_(host + ":" + std::to_string(port)), timeout_(timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last_error;
  while (fd_ < 0) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (rc != 0) {
      last_error = gai_strerror(rc);
    } else {
      for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          fd_ = fd;
        } else {
          last_error = std::strerror(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(found);
    }
    if (fd_ >= 0) break;
    if (std::chrono::steady_clock::now() > deadline)
      throw Error("rendezvous store " + endpoint_,
                  "cannot connect within " + std::to_string(timeout.count() / 1000) + " s (" + last_error + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

Bytes TcpStore::request(uint8_t op, const std::string& key, const Bytes& value, int64_t timeout_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool sent = write_all(fd_, &op, 1) && write_bytes(fd_, key.data(), uint32_t(key.size())) &&
              write_bytes(fd_, value.data(), uint32_t(value.size())) && write_all(fd_, &timeout_ms, 8);
  uint8_t status = 0;
  Bytes reply;
  if (!sent || !read_all(fd_, &status, 1) || !read_bytes(fd_, &reply))
    throw Error("rendezvous store " + endpoint_, "connection lost (did node 0 exit?)");
  if (status == kTimeout)
    throw Error("rendezvous store " + endpoint_,
                "timed out after " + std::to_string(timeout_ms / 1000) + " s waiting for key '" + key + "'");
  return reply;
}

void TcpStore::set(const std::string& key, const Bytes& value) { request(kSet, key, value, 0); }

Bytes TcpStore::get(const std::string& key) { return request(kGet, key, {}, timeout_.count()); }

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  Bytes value(8);
  std::memcpy(value.data(), &delta, 8);
  Bytes reply = request(kAdd, key, value, 0);
  int64_t result = 0;
  std::memcpy(&result, reply.data(), std::min<size_t>(8, reply.size()));
  return result;
}

bool TcpStore::check(const std::string& key) {
  Bytes reply = request(kCheck, key, {}, 0);
  return !reply.empty() && reply[0] == 1;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const std::string& key : keys) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    request(kWait, key, {}, std::max<int64_t>(0, left.count()));
  }
}

}  // namespace ktune::dist
