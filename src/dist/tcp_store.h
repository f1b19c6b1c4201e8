// A small TCP key-value store for rendezvous, as torch's TCPStore: node 0's launcher serves it on
// the rendezvous endpoint; every launcher and worker is a client. Keys map to byte strings; `add`
// is an atomic counter; `get` and `wait` block until the key exists or the timeout passes.
// It deliberately holds only rendezvous-sized data (bytes to kilobytes): tensors travel over the
// collectives library (Gloo, NCCL), never through the store.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ktune::dist {

using Bytes = std::vector<char>;

class TcpStoreServer {
 public:
  // Listens on all interfaces at port (0: pick a free one; see port()).
  explicit TcpStoreServer(int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }

 private:
  void accept_loop();
  void serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> data_;
  std::vector<std::thread> clients_;
  std::vector<int> client_fds_;
};

class TcpStore {
 public:
  // Connects, retrying until timeout (the server may start after its clients).
  TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const Bytes& value);
  void set(const std::string& key, const std::string& value) { set(key, Bytes(value.begin(), value.end())); }
  Bytes get(const std::string& key);  // blocks up to the timeout; throws naming the key
  std::string get_string(const std::string& key) { Bytes b = get(key); return std::string(b.begin(), b.end()); }
  int64_t add(const std::string& key, int64_t delta);  // returns the new value
  bool check(const std::string& key);                  // exists now? (never blocks)
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& endpoint() const { return endpoint_; }

 private:
  Bytes request(uint8_t op, const std::string& key, const Bytes& value, int64_t timeout_ms);

  int fd_ = -1;
  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
};

// "host:port" → (host, port); throws naming the text when malformed.
std::pair<std::string, int> parse_endpoint(const std::string& endpoint, int default_port);

}  // namespace ktune::dist
