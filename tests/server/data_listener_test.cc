// The shard's side of the data channel over a socket pair: frames taken in order and held by
// their lease past the connection, wrong or old frames refused, a frame that never comes timed
// out, an oversized frame ending the connection, a peer's reset ending it at once, pull frames
// written in order after the acknowledgement; the listener's token check, and a worker's new
// connection replacing its old one.
#include "server/channels/data_listener.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <thread>

#include "common/ps/ps_protocol.h"

namespace gradsync {
namespace {

constexpr int64_t kRange = 64;

struct Pair {
  std::unique_ptr<DataConn> shard;
  DataStream worker;
};

// A started connection whose acknowledgement the worker side has read.
Pair Connected() {
  int fds[2];
  EXPECT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM, 0, fds));
  Pair p{std::make_unique<DataConn>(7, kRange, DataStream(fds[0])), DataStream(fds[1])};
  p.shard->Start();
  char ack[kDataAckBytes];
  EXPECT_TRUE(p.worker.Read(ack, sizeof(ack), 5).ok());
  EXPECT_EQ(0, std::memcmp(ack, kDataAck, kDataAckBytes));
  return p;
}

std::vector<float> Iota(size_t n, float first) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

Status Send(DataStream& s, uint64_t seq, const std::vector<float>& v) {
  std::vector<std::span<const float>> parts = {v};
  return s.WriteFrame(seq, parts, 5);
}

TEST(DataConnTest, FramesAreTakenInOrderAndTheirLeasesOutliveTheConnection) {
  Pair p = Connected();
  ASSERT_TRUE(Send(p.worker, 1, Iota(4, 1)).ok());
  ASSERT_TRUE(Send(p.worker, 2, Iota(kRange, 100)).ok());
  auto one = p.shard->TakePush(1, 4, 5);
  ASSERT_TRUE(one.ok()) << one.status();
  auto two = p.shard->TakePush(2, kRange, 5);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(0, std::memcmp(one->get(), Iota(4, 1).data(), 4 * sizeof(float)));
  p.shard.reset();  // a bsp round holds its pushes past a worker's connection
  EXPECT_EQ((*two).get()[kRange - 1], 100.0f + kRange - 1);
}

TEST(DataConnTest, AFrameOfAnotherSizeOrAnOldOneIsRefused) {
  Pair p = Connected();
  ASSERT_TRUE(Send(p.worker, 1, Iota(4, 1)).ok());
  EXPECT_EQ(p.shard->TakePush(1, 6, 5).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.shard->TakePush(1, 4, 5).status().code(), StatusCode::kInvalidArgument) << "dropped with the refusal";
  ASSERT_TRUE(Send(p.worker, 2, Iota(4, 5)).ok());
  ASSERT_TRUE(Send(p.worker, 3, Iota(4, 9)).ok());
  // Frame 2's header never came (or was refused): taking 3 drops it, and it cannot be had after.
  auto three = p.shard->TakePush(3, 4, 5);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ((*three).get()[0], 9.0f);
  EXPECT_EQ(p.shard->TakePush(2, 4, 5).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(p.shard->health().ok());
}

TEST(DataConnTest, AFrameThatNeverComesIsRefusedAfterTheWait) {
  Pair p = Connected();
  auto none = p.shard->TakePush(1, 4, 0.2);
  EXPECT_EQ(none.status().code(), StatusCode::kDeadlineExceeded) << none.status();
}

TEST(DataConnTest, AnOversizedOrOutOfOrderFrameEndsTheConnection) {
  for (uint64_t seq : {uint64_t{1}, uint64_t{5}}) {
    Pair p = Connected();
    // seq 1: larger than the range; seq 5: where 1 is due.
    const uint64_t head[2] = {seq, (seq == 1 ? kRange + 1 : 4) * sizeof(float)};
    ASSERT_TRUE(p.worker.Write(std::vector<iovec>{{const_cast<uint64_t*>(head), sizeof(head)}}, 5).ok());
    char byte;
    EXPECT_EQ(p.worker.Read(&byte, 1, 5).code(), StatusCode::kUnavailable) << "the shard closes it";
    EXPECT_FALSE(p.shard->health().ok());
    EXPECT_EQ(p.shard->TakePush(1, 4, 1).status().code(), StatusCode::kFailedPrecondition);
    EXPECT_FALSE(p.shard->SendPull({}, nullptr).ok());
  }
}

TEST(DataConnTest, PullFramesAreWrittenInOrderFromWhatTheirOwnerKeeps) {
  Pair p = Connected();
  auto a = std::make_shared<std::vector<float>>(Iota(8, 0));
  auto b = std::make_shared<std::vector<float>>(Iota(3, 50));
  std::vector<std::span<const float>> first = {std::span<const float>(*a).subspan(0, 4),
                                               std::span<const float>(*a).subspan(6, 2)};
  auto s1 = p.shard->SendPull(first, a);
  auto s2 = p.shard->SendPull({std::span<const float>(*b)}, b);
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(*s1, 1u);
  EXPECT_EQ(*s2, 2u);
  a.reset();  // the frame keeps them
  b.reset();
  auto h1 = p.worker.ReadHead(5);
  ASSERT_TRUE(h1.ok());
  EXPECT_EQ(h1->seq, 1u);
  ASSERT_EQ(h1->bytes, 6 * sizeof(float));
  std::vector<float> got(6);
  ASSERT_TRUE(p.worker.Read(got.data(), h1->bytes, 5).ok());
  EXPECT_EQ(got, (std::vector<float>{0, 1, 2, 3, 6, 7}));
  auto h2 = p.worker.ReadHead(5);
  ASSERT_TRUE(h2.ok());
  EXPECT_EQ(h2->seq, 2u);
  ASSERT_TRUE(p.worker.Discard(h2->bytes, 5).ok());
}

TEST(DataListenerTest, OnlyAnExpectedTokenGetsAConnectionAndOnlyOnce) {
  auto listener = DataListener::Create("127.0.0.1");
  ASSERT_TRUE(listener.ok()) << listener.status();
  const std::string token(kDataTokenBytes, 't');
  (*listener)->Expect(token, 3, kRange);
  auto present = [&](const std::string& t) {
    auto s = DataStream::Connect("127.0.0.1", (*listener)->port(), 5);
    EXPECT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(s->Write(std::vector<iovec>{{const_cast<char*>(t.data()), t.size()}}, 5).ok());
    char ack[kDataAckBytes];
    const bool accepted = s->Read(ack, sizeof(ack), 10).ok() && std::memcmp(ack, kDataAck, kDataAckBytes) == 0;
    return std::make_pair(accepted, std::move(*s));
  };
  EXPECT_FALSE(present(std::string(kDataTokenBytes, 'x')).first);
  EXPECT_EQ((*listener)->Find(3), nullptr);
  auto [accepted, stream] = present(token);
  EXPECT_TRUE(accepted);
  ASSERT_NE((*listener)->Find(3), nullptr);
  EXPECT_FALSE(present(token).first) << "a token is good for one connection";
  // The connection carries frames.
  ASSERT_TRUE(Send(stream, 1, Iota(4, 1)).ok());
  auto one = (*listener)->Find(3)->TakePush(1, 4, 5);
  ASSERT_TRUE(one.ok()) << one.status();
  (*listener)->Drop(3);
  EXPECT_EQ((*listener)->Find(3), nullptr);
  EXPECT_EQ((*one).get()[3], 4.0f);
  EXPECT_GE((*listener)->bytes_received(), kDataTokenBytes + kDataFrameHeadBytes + 4 * sizeof(float));
}

// Worker `worker`'s connection to `listener` with a token of `fill`, acknowledged.
DataStream Attach(DataListener& listener, int worker, char fill) {
  const std::string token(kDataTokenBytes, fill);
  listener.Expect(token, worker, kRange);
  auto s = DataStream::Connect("127.0.0.1", listener.port(), 5);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return DataStream();
  EXPECT_TRUE(s->Write(std::vector<iovec>{{const_cast<char*>(token.data()), token.size()}}, 5).ok());
  char ack[kDataAckBytes];
  EXPECT_TRUE(s->Read(ack, sizeof(ack), 10).ok());
  return std::move(*s);
}

// A worker that attaches again (a new CHANNEL_ATTACH, a new token) gets a new connection, which
// replaces its old one: the shard closes the old one, and frames come from the new one only.
TEST(DataListenerTest, ANewConnectionForAWorkerReplacesItsOldOne) {
  auto listener = DataListener::Create("127.0.0.1");
  ASSERT_TRUE(listener.ok()) << listener.status();
  auto attach = [&](char fill) { return Attach(**listener, 3, fill); };
  DataStream old = attach('a');
  ASSERT_NE((*listener)->Find(3), nullptr);
  const DataConn* first = (*listener)->Find(3).get();
  DataStream fresh = attach('b');
  for (int i = 0; i < 200 && (*listener)->Find(3).get() == first; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_NE((*listener)->Find(3), nullptr);
  EXPECT_NE((*listener)->Find(3).get(), first) << "the new connection did not replace the old";
  EXPECT_EQ((*listener)->size(), 1u);
  char byte;
  EXPECT_EQ(old.Read(&byte, 1, 10).code(), StatusCode::kUnavailable) << "the shard must close the old connection";
  ASSERT_TRUE(Send(fresh, 1, Iota(4, 10)).ok());
  auto got = (*listener)->Find(3)->TakePush(1, 4, 5);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got).get()[0], 10.0f);
}

// A connection reset by the worker (its process died, the network failed: TCP's RST) ends the
// channel on the shard: a push that waits for a frame from it is refused as the channel being
// down, not after the full wait. A shard that drops a channel is seen by the worker as closed
// (PeerClosed, which it checks before each push frame) and its reads fail.
TEST(DataConnTest, APeerResetEndsTheConnection) {
  {
    auto listener = DataListener::Create("127.0.0.1");
    ASSERT_TRUE(listener.ok()) << listener.status();
    DataStream worker = Attach(**listener, 3, 'r');
    std::shared_ptr<DataConn> conn;
    for (int i = 0; i < 200 && !(conn = (*listener)->Find(3)); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_NE(conn, nullptr);
    linger l{1, 0};  // close with RST
    ASSERT_EQ(0, setsockopt(worker.fd(), SOL_SOCKET, SO_LINGER, &l, sizeof(l)));
    worker = DataStream();
    const auto t0 = std::chrono::steady_clock::now();
    auto push = conn->TakePush(1, 4, 30);
    EXPECT_EQ(push.status().code(), StatusCode::kFailedPrecondition) << push.status();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "waited for a dead connection";
    EXPECT_FALSE(conn->health().ok());
  }
  {
    Pair p = Connected();
    EXPECT_FALSE(p.worker.PeerClosed());
    p.shard.reset();  // the shard drops it
    for (int i = 0; i < 200 && !p.worker.PeerClosed(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(p.worker.PeerClosed());
    char byte;
    EXPECT_EQ(p.worker.Read(&byte, 1, 5).code(), StatusCode::kUnavailable);
  }
}

// Open descriptors of this process.
size_t OpenFds() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += !e.path().empty();
  return n;
}

TEST(DataListenerTest, SilentStrangersHoldNoWorkerBackAndStayBounded) {
  // 200 connections that never say a word are held open on the shard's data port; a worker that
  // then connects and presents its token is attached at once (within 1 s), the strangers are
  // closed (at most 16 per host wait, each at most 1 s), and the shard's descriptors stay bounded.
  auto listener = DataListener::Create("127.0.0.1");
  ASSERT_TRUE(listener.ok()) << listener.status();
  const size_t before = OpenFds();
  std::vector<DataStream> strangers;
  for (int i = 0; i < 200; ++i) {
    auto s = DataStream::Connect("127.0.0.1", (*listener)->port(), 5);
    ASSERT_TRUE(s.ok()) << i << ": " << s.status();
    strangers.push_back(std::move(*s));
  }
  const std::string token(kDataTokenBytes, 'w');
  (*listener)->Expect(token, 1, kRange);
  const auto start = std::chrono::steady_clock::now();
  auto worker = DataStream::Connect("127.0.0.1", (*listener)->port(), 5);
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE(worker->Write(std::vector<iovec>{{const_cast<char*>(token.data()), token.size()}}, 5).ok());
  char ack[kDataAckBytes];
  ASSERT_TRUE(worker->Read(ack, sizeof(ack), 5).ok());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  EXPECT_NE((*listener)->Find(1), nullptr);
  // This process holds both ends of every stranger's connection: 200 on its side, and on the
  // shard's at most the 16 that may wait (plus the worker's connection and its threads' few).
  EXPECT_LE(OpenFds(), before + 200 + 1 + 16 + 8);
  // A second later every stranger's connection is closed on the shard's side.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_LE(OpenFds(), before + 200 + 1 + 8);
}

}  // namespace
}  // namespace gradsync
