#include "dist/tcp_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"

using namespace ktune;
using namespace ktune::dist;
using namespace std::chrono_literals;

TEST(TcpStore, SetThenGetAcrossClients) {
  TcpStoreServer server(0);
  TcpStore a("127.0.0.1", server.port(), 5s);
  TcpStore b("127.0.0.1", server.port(), 5s);
  a.set("k", std::string("value"));
  EXPECT_EQ(b.get_string("k"), "value");
  EXPECT_TRUE(b.check("k"));
  EXPECT_FALSE(b.check("missing"));
}

TEST(TcpStore, GetBlocksUntilAnotherClientSets) {
  TcpStoreServer server(0);
  TcpStore reader("127.0.0.1", server.port(), 5s);
  std::thread writer([&] {
    std::this_thread::sleep_for(100ms);
    TcpStore w("127.0.0.1", server.port(), 5s);
    w.set("late", std::string("here"));
  });
  EXPECT_EQ(reader.get_string("late"), "here");
  writer.join();
}

TEST(TcpStore, AddIsAnAtomicCounter) {
  TcpStoreServer server(0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      TcpStore c("127.0.0.1", server.port(), 5s);
      for (int i = 0; i < 50; ++i) c.add("count", 1);
    });
  for (auto& t : threads) t.join();
  TcpStore c("127.0.0.1", server.port(), 5s);
  EXPECT_EQ(c.add("count", 0), 200);
}

TEST(TcpStore, WaitTimesOutNamingTheKey) {
  TcpStoreServer server(0);
  TcpStore c("127.0.0.1", server.port(), 200ms);
  try {
    c.get("never");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos);
  }
}

TEST(TcpStore, ConnectFailsClearlyWhenNobodyListens) {
  int port;
  { TcpStoreServer probe(0); port = probe.port(); }
  EXPECT_THROW(TcpStore("127.0.0.1", port, 300ms), Error);
}

TEST(TcpStore, ParsesEndpoints) {
  EXPECT_EQ(parse_endpoint("job-node-0-0.job:29500", 1), (std::pair<std::string, int>{"job-node-0-0.job", 29500}));
  EXPECT_EQ(parse_endpoint("localhost", 29500).second, 29500);
  EXPECT_EQ(parse_endpoint("[::1]:80", 1).first, "::1");
  EXPECT_THROW(parse_endpoint("host:notaport", 1), Error);
}
