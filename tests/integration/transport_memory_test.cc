// What anyone who reaches a port can make a process hold: a frame above the socket's limit is
// refused before it is buffered (plain TCP peers speaking just enough ZMTP to announce 1 GiB), and
// thousands of short-lived connections leave no per-peer state behind.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/data/synthetic.h"
#include "common/net/transport.h"
#include "tests/support/ps_job.h"

namespace gradsync::testing {
namespace {

int64_t RssBytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

// Reads the peer's greeting and READY command (libzmq drops a peer whose READY or messages
// come before it has sent its own greeting). False when it hangs up first.
bool ReadGreeting(int fd) {
  std::string in;
  char buf[256];
  while (in.size() < 66 || in.size() < size_t{66} + static_cast<uint8_t>(in[65])) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    in.append(buf, static_cast<size_t>(n));
  }
  return true;
}

// A ZMTP 3.0 peer on a plain TCP socket: the greeting (NULL mechanism) and a DEALER's READY.
int ConnectZmtp(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{2, 0};  // never block a test on a peer that neither reads nor closes
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  std::string hello(64, '\0');
  hello[0] = '\xff';
  hello[9] = '\x7f';
  hello[10] = 3;  // version 3.0
  std::memcpy(&hello[12], "NULL", 4);
  const std::string body = std::string("\x05READY\x0bSocket-Type\0\0\0\x06", 22) + "DEALER";
  const std::string ready = std::string(1, '\x04') + static_cast<char>(body.size()) + body;
  if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size()) || !ReadGreeting(fd) ||
      ::send(fd, ready.data(), ready.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(ready.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Announces a frame of `announced` bytes and sends up to `send` of it (less if the peer hangs
// up); the bytes sent.
int64_t AnnounceFrame(int fd, uint64_t announced, int64_t send) {
  char head[9] = {'\x02'};  // a long, final frame
  for (int i = 0; i < 8; ++i) head[1 + i] = static_cast<char>(announced >> (8 * (7 - i)));
  if (::send(fd, head, sizeof head, MSG_NOSIGNAL) != sizeof head) return 0;
  const std::vector<char> chunk(1 << 20, 'x');
  int64_t sent = 0;
  while (sent < send) {
    const ssize_t n = ::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += n;
  }
  return sent;
}

PsJobOptions Job(Dataset* data) {
  BlobsOptions bo;
  bo.n = 800;
  bo.dim = 12;
  bo.classes = 4;
  *data = MakeGaussianBlobs(bo);
  PsJobOptions o;
  o.mode = ConsistencyMode::kBsp;
  o.num_servers = 2;
  o.num_workers = 2;
  o.model.name = "mlp";
  o.model.input_dim = 12;
  o.model.num_classes = 4;
  o.model.hidden = {16};
  o.train.batch = 8;
  o.train.epochs = 100;
  o.train.max_steps = 100;
  o.train.seed = 3;
  o.train.lr = {LrSchedule::Kind::kConstant, 0.05f, 100, 0.0f};
  o.delay_ms = [](int, int64_t) { return 10.0; };  // the probes meet the job training
  return o;
}

TEST(TransportMemoryTest, AFrameAboveTheLimitIsRefusedBeforeItIsHeld) {
  Dataset data;
  PsJobOptions o = Job(&data);
  int64_t grown = -1, sent = 0;
  size_t probes = 0, connected = 0;
  o.side_task = [&](const std::vector<uint16_t>& ports) {
    const int64_t before = RssBytes();
    std::vector<int> fds;
    probes = 3 * ports.size();
    // Three connections per shard, each announcing 1 GiB and sending up to 64 MiB of it, held
    // open: a shard that buffered them would hold 384 MiB more.
    for (uint16_t port : ports) {
      for (int i = 0; i < 3; ++i) {
        const int fd = ConnectZmtp(port);
        if (fd < 0) continue;
        sent += AnnounceFrame(fd, uint64_t{1} << 30, int64_t{64} << 20);
        fds.push_back(fd);
        ++connected;
      }
    }
    grown = RssBytes() - before;
    for (int fd : fds) ::close(fd);
  };
  PsJobResult r = RunPsJob(o, data, data);
  ASSERT_TRUE(r.status.ok()) << r.status;  // the shards kept serving the job
  RecordProperty("rss_growth_bytes", std::to_string(grown));
  RecordProperty("bytes_sent_by_probes", std::to_string(sent));
  // The probes reached the shards (a test whose connections all failed would prove nothing).
  ASSERT_GT(probes, 0u);
  EXPECT_EQ(connected, probes);
  EXPECT_GT(sent, 0);
  ASSERT_GE(grown, -(int64_t{1} << 30));
  EXPECT_LT(grown, int64_t{48} << 20);
}

TEST(TransportMemoryTest, ShortLivedConnectionsLeaveNoPerPeerState) {
  TransportContext ctx(1);
  auto router = Socket::BindRouter(ctx, "127.0.0.1", 0);
  ASSERT_TRUE(router.ok()) << router.status();
  // 2,000 connections that each send one malformed message (a 1-byte header) and hang up; every
  // one is a new identity on the ROUTER.
  constexpr int kConnections = 2000;
  int opened = 0;
  uint64_t received = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(45);
  for (int i = 0; i < kConnections && std::chrono::steady_clock::now() < deadline; ++i) {
    const int fd = ConnectZmtp(router->port());
    if (fd < 0) continue;
    const char frame[3] = {'\x00', '\x01', '\x7f'};
    (void)::send(fd, frame, sizeof frame, MSG_NOSIGNAL);
    ++opened;
    ::close(fd);  // nothing unread: the shard's answer comes after
    while (true) {  // read as a shard does, as they come
      auto m = router->Recv(0);
      if (!m.ok()) break;
      ++received;
    }
  }
  while (received < static_cast<uint64_t>(opened) && std::chrono::steady_clock::now() < deadline) {
    auto m = router->Recv(100);
    if (m.ok()) ++received;
    else if (m.status().code() == StatusCode::kDeadlineExceeded && received + 50 >= static_cast<uint64_t>(opened)) break;
  }
  EXPECT_GT(opened, kConnections / 2);
  EXPECT_GT(received, static_cast<uint64_t>(opened) / 2);
  EXPECT_EQ(router->traffic().messages_received, received);
  EXPECT_LE(router->traffic_by_peer().size(), Socket::kMaxTrackedPeers);
  EXPECT_EQ(router->traffic_by_peer().count(Socket::kOtherPeers), 1u);
}

}  // namespace
}  // namespace gradsync::testing
