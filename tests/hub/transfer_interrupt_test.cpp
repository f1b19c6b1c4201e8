// TransferInterrupt: a check that throws ends a transfer mid-file (an HTTP body from a loopback
// server that trickles it, a retry's delay, a local copy between its pieces), and what it throws
// reaches the caller as it was.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "hub/http_client.h"
#include "hub/local_files.h"

using namespace ktune::hub;
using Clock = std::chrono::steady_clock;

namespace {

struct Interrupted {};  // what the tests' checks throw: not a ktune::Error, so nothing converts it

// A check that throws once `after` has passed since it was made, counting its calls.
struct InterruptAfter {
  Clock::time_point deadline;
  std::atomic<int> calls{0};
  explicit InterruptAfter(std::chrono::milliseconds after) : deadline(Clock::now() + after) {}
  std::function<void()> check() {
    return [this] {
      ++calls;
      if (Clock::now() >= deadline) throw Interrupted{};
    };
  }
};

// A loopback HTTP server that answers one GET with a 1 GiB Content-Length and then a KiB every
// 20 ms until the client goes away.
class TricklingServer {
 public:
  TricklingServer() {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listener_, 1);
    socklen_t n = sizeof a;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &n);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~TricklingServer() {
    stop_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    thread_.join();
    ::close(listener_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/big.bin"; }

 private:
  void serve() {
    const int client = ::accept(listener_, nullptr, nullptr);
    if (client < 0) return;
    char request[4096];
    (void)::recv(client, request, sizeof request, 0);
    const std::string head = "HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\nContent-Type: application/octet-stream\r\n\r\n";
    ::send(client, head.data(), head.size(), MSG_NOSIGNAL);
    const std::string piece(1024, 'x');
    const Clock::time_point give_up = Clock::now() + std::chrono::seconds(30);
    while (!stop_ && Clock::now() < give_up && ::send(client, piece.data(), piece.size(), MSG_NOSIGNAL) > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ::close(client);
  }
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class CountingSink : public BodySink {
 public:
  void begin(const HttpResponse&) override {}
  void write(const char*, size_t size) override { bytes += size; }
  size_t bytes = 0;
};

}  // namespace

TEST(TransferInterrupt, EndsAnHttpBodyMidTransferWithTheChecksException) {
  TricklingServer server;
  InterruptAfter interrupt(std::chrono::milliseconds(400));
  CountingSink sink;
  HttpClient http;
  HttpRequest request;
  request.url = server.url();
  const Clock::time_point start = Clock::now();
  {
    const TransferInterrupt scope(interrupt.check());
    EXPECT_THROW(http.perform(request, &sink), Interrupted);
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5)) << "the body would have taken hours";
  EXPECT_GT(sink.bytes, 0u) << "it was mid-file";
  EXPECT_LT(sink.bytes, size_t(1) << 30);
  EXPECT_FALSE(TransferInterrupt::active()) << "the scope's end removes the check";
}

TEST(TransferInterrupt, EndsARetrysDelayAndNests) {
  InterruptAfter interrupt(std::chrono::milliseconds(150));
  const Clock::time_point start = Clock::now();
  {
    const TransferInterrupt outer([] {});
    const TransferInterrupt inner(interrupt.check());
    EXPECT_THROW(sleep_seconds(30), Interrupted);
    EXPECT_TRUE(TransferInterrupt::active());
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  EXPECT_GT(interrupt.calls.load(), 1);
  sleep_seconds(0.01);  // none lives: a plain sleep
}

TEST(TransferInterrupt, EndsALocalCopyBetweenItsPiecesLeavingNoFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ktune-interrupt-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "from");
  {
    std::ofstream f(dir / "from/model.safetensors", std::ios::binary);
    const std::string mib(size_t(1) << 20, 'w');
    for (int i = 0; i < 200; ++i) f << mib;  // 200 MiB: four of the copy's 64 MiB pieces
  }
  int calls = 0;
  const TransferInterrupt scope([&] {
    if (++calls == 2) throw Interrupted{};
  });
  bool interrupted = false;
  try {
    copy_local_tree((dir / "from").string(), PatternFilter{}, (dir / "to").string(), nullptr);
  } catch (const Interrupted&) {
    interrupted = true;
  }
  if (calls == 0) {
    fs::remove_all(dir);
    GTEST_SKIP() << "the temporary directory's filesystem cloned the file (FICLONE): no piece to interrupt";
  }
  EXPECT_TRUE(interrupted);
  EXPECT_FALSE(fs::exists(dir / "to/model.safetensors")) << "never the real name for a part of the file";
  fs::remove_all(dir);
}
