// The transport's helpers that the shard and the PS client share: the poller, the pool of lent
// reply buffers, keys read in place.
#include "common/net/transport.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

TEST(TransportTest, PollReadableNamesTheSocketsWithAMessage) {
  TransportContext ctx(1);
  auto a = Socket::BindRouter(ctx, "inproc://poll-a", 0);
  auto b = Socket::BindRouter(ctx, "inproc://poll-b", 0);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<Socket> clients;
  for (const char* name : {"a", "b"}) {
    auto c = Socket::ConnectDealer(ctx, std::string("inproc://poll-") + name, name);
    ASSERT_TRUE(c.ok());
    clients.push_back(std::move(c).value());
  }
  auto none = PollReadable(clients, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  // b answers a request: only the second client becomes readable.
  wire::Header h;
  h.set_type(wire::HEARTBEAT);
  ASSERT_TRUE(clients[1].Send("", h).ok());
  auto got = b->Recv(1000);
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(b->Send(got->peer, h).ok());
  auto ready = PollReadable(clients, 1000);
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ(*ready, std::vector<size_t>{1});
  EXPECT_TRUE(clients[1].Recv(0).ok());
}

TEST(TransportTest, LentBuffersAreReusedOnlyOnceReleased) {
  LentBufferPool pool(2);
  LentBufferPool::Buffer* first = pool.Acquire(100);
  ASSERT_NE(first, nullptr);
  EXPECT_GE(first->values.size(), 100u);
  EXPECT_EQ(pool.Acquire(50), first);  // nothing in flight: the same buffer again

  // Lend it to ZeroMQ: until the message is gone, another buffer is handed out, then none.
  TransportContext ctx(1);
  auto server = Socket::BindRouter(ctx, "inproc://lent", 0);
  auto client = Socket::ConnectDealer(ctx, "inproc://lent", "s");
  ASSERT_TRUE(server.ok() && client.ok());
  Payload p;
  p.values = std::span<const float>(first->values.data(), 100);
  p.lent = first->inflight;
  wire::Header h;
  h.set_type(wire::PULL_REPLY);
  ASSERT_TRUE(client->Send("", h, p).ok());
  LentBufferPool::Buffer* second = pool.Acquire(10);
  ASSERT_NE(second, nullptr);
  EXPECT_NE(second, first);
  second->inflight->WaitForZero();
  {
    auto m = server->Recv(1000);  // received and dropped: ZeroMQ releases the lent frame
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->num_values(), 100u);
  }
  first->inflight->WaitForZero();
  EXPECT_EQ(pool.Acquire(100), first);
}

TEST(TransportTest, KeysAreReadInPlace) {
  TransportContext ctx(1);
  auto server = Socket::BindRouter(ctx, "inproc://keys", 0);
  auto client = Socket::ConnectDealer(ctx, "inproc://keys", "s");
  ASSERT_TRUE(server.ok() && client.ok());
  const std::vector<uint64_t> keys = {3, 9, 27, 81, 243, 729, 2187, 6561, 19683, 59049};
  const std::vector<float> values(keys.size(), 1.0f);
  Payload p;
  p.keys = keys;
  p.values = values;
  wire::Header h;
  h.set_type(wire::PULL_REPLY);
  ASSERT_TRUE(client->Send("", h, p).ok());
  auto m = server->Recv(1000);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<uint64_t> scratch;
  auto view = m->Keys(&scratch);
  EXPECT_EQ(std::vector<uint64_t>(view.begin(), view.end()), keys);
  // Read in place: no copy into the scratch buffer.
  EXPECT_EQ(static_cast<const void*>(view.data()), m->keys.data());
  EXPECT_TRUE(scratch.empty());
}

}  // namespace
}  // namespace gradsync
