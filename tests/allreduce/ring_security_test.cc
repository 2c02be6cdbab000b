// The authenticated and encrypted ring: the same exact results as the plaintext one; peers
// with another key, without authentication or with another --ring-encrypt refused on both
// sides, naming each other; tampered and replayed frames failing the collective. Everything
// over 127.0.0.1; the man in the middle is a proxy thread per rank.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "allreduce/ring_security.h"
#include "allreduce/tcp_ring.h"
#include "common/base/numeric/half.h"
#include "tests/allreduce/exact_sums.h"

namespace gradsync {
namespace {

RingKey KeyOf(uint8_t seed) {
  std::array<uint8_t, 32> secret{};
  secret.fill(seed);
  return DeriveRingKey(secret);
}

RingSecurity Auth(bool encrypt, uint8_t seed = 7) { return RingSecurity{true, encrypt, KeyOf(seed)}; }

using RankFn = std::function<Status(int rank, RingCollective& ring)>;

// n rings on 127.0.0.1 (threads), rank r with security[r]; `addresses` (if given) replaces the
// peer list every rank is told (the proxies' addresses).
std::vector<Status> RunRing(int n, const std::vector<RingSecurity>& security, const RankFn& fn,
                            CollectiveOptions options = {},
                            const std::function<std::vector<std::string>(const std::vector<uint16_t>&)>& addresses = nullptr) {
  std::vector<std::unique_ptr<RingCollective>> rings;
  std::vector<uint16_t> ports;
  for (int r = 0; r < n; ++r) {
    auto ring = RingCollective::Listen("127.0.0.1", options, security[r]);
    GRADSYNC_CHECK(ring.ok()) << ring.status();
    ports.push_back((*ring)->port());
    rings.push_back(std::move(ring).value());
  }
  std::vector<std::string> peers;
  if (addresses) {
    peers = addresses(ports);
  } else {
    for (uint16_t p : ports) peers.push_back("127.0.0.1:" + std::to_string(p));
  }
  std::vector<Status> result(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Status s = rings[r]->Connect(r, peers, 10);
      result[r] = s.ok() ? fn(r, *rings[r]) : s;
    });
  }
  for (auto& t : threads) t.join();
  return result;
}

// Every collective, with exact expectations (small integers: exact in float and half).
Status EveryOperation(int n, int r, RingCollective& ring) {
  for (size_t count : {size_t{0}, size_t{1}, static_cast<size_t>(n - 1), size_t{1000}, size_t{1000003}}) {
    RETURN_IF_ERROR(testing::ExactSums(ring, r, n, count));
  }
  std::vector<float> y(4097, static_cast<float>(r));
  RETURN_IF_ERROR(ring.AllReduce(y, ReduceOp::kAverage));
  for (float v : y) {
    if (std::fabs(v - (n - 1) / 2.0f) > 1e-6f) return InternalError("wrong average " + std::to_string(v));
  }
  std::vector<float> b(10007, r == n - 1 ? 3.5f : -1.0f);
  RETURN_IF_ERROR(ring.Broadcast(b, n - 1));
  for (float v : b) {
    if (v != 3.5f) return InternalError("wrong broadcast value " + std::to_string(v));
  }
  std::vector<std::byte> mine(static_cast<size_t>(r) * 1000, static_cast<std::byte>(r));
  std::vector<std::vector<std::byte>> all;
  RETURN_IF_ERROR(ring.AllGather(mine, &all));
  for (int i = 0; i < n; ++i) {
    if (all[i] != std::vector<std::byte>(static_cast<size_t>(i) * 1000, static_cast<std::byte>(i))) {
      return InternalError("wrong allgather part " + std::to_string(i));
    }
  }
  return ring.Barrier();
}

class RingSecureTest : public ::testing::TestWithParam<std::tuple<int, bool, size_t>> {};

TEST_P(RingSecureTest, EveryOperationIsExactAsInPlaintext) {
  auto [n, encrypt, segment] = GetParam();
  CollectiveOptions opt;
  opt.segment_bytes = segment;  // small: reads that cut frames in the middle
  auto st = RunRing(n, std::vector<RingSecurity>(static_cast<size_t>(n), Auth(encrypt)),
                    [&](int r, RingCollective& ring) { return EveryOperation(n, r, ring); }, opt);
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
}

INSTANTIATE_TEST_SUITE_P(Worlds, RingSecureTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool(),
                                            ::testing::Values(size_t{4098}, size_t{1} << 20)),
                         [](const auto& p) {
                           return "n" + std::to_string(std::get<0>(p.param)) +
                                  (std::get<1>(p.param) ? "_encrypted" : "_authenticated") + "_segment" +
                                  std::to_string(std::get<2>(p.param));
                         });

// rhd, rd and the tree run over the mesh connections too: authenticated and encrypted alike.
TEST(RingSecurityTest, EveryAlgorithmRunsOverAuthenticatedAndEncryptedMeshConnections) {
  for (AllReduceAlgo algo : {AllReduceAlgo::kRhd, AllReduceAlgo::kRd, AllReduceAlgo::kTree}) {
    for (int n : {4, 5}) {
      for (bool encrypt : {false, true}) {
        CollectiveOptions opt;
        opt.algorithm = algo;
        opt.segment_bytes = 4098;
        auto st = RunRing(n, std::vector<RingSecurity>(static_cast<size_t>(n), Auth(encrypt)), [&](int r, RingCollective& ring) -> Status {
          for (size_t count : {size_t{1000}, size_t{100003}}) RETURN_IF_ERROR(testing::ExactSums(ring, r, n, count));
          return OkStatus();
        }, opt);
        for (int r = 0; r < n; ++r) {
          EXPECT_TRUE(st[r].ok()) << AllReduceAlgoName(algo) << " n " << n << " encrypt " << encrypt << " rank " << r << ": " << st[r];
        }
      }
    }
  }
}

TEST(RingSecurityTest, EncryptedBytesCarryTheirFramesOverhead) {
  uint64_t plain_sent = 0, encrypted_sent = 0;
  for (bool encrypt : {false, true}) {
    auto st = RunRing(2, {Auth(encrypt), Auth(encrypt)}, [&](int r, RingCollective& ring) -> Status {
      std::vector<float> x(1 << 18, 1.0f);
      RETURN_IF_ERROR(ring.AllReduce(x, ReduceOp::kSum));
      if (r == 0) (encrypt ? encrypted_sent : plain_sent) = ring.bytes_sent();
      return OkStatus();
    });
    for (const auto& s : st) ASSERT_TRUE(s.ok()) << s;
  }
  // 20 bytes (length and tag) per frame of at most 64 KiB.
  EXPECT_GT(encrypted_sent, plain_sent);
  EXPECT_LT(encrypted_sent, plain_sent + plain_sent / 1000 + 200);
}

void ExpectAuthFailureNaming(const Status& s, int peer) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("ring authentication failed"), std::string::npos) << s;
  EXPECT_NE(s.message().find("and rank " + std::to_string(peer) + " ("), std::string::npos) << s;
}

// Each rank reports the first failure it sees: the refusal itself, or (when the other side
// gave up first on the other connection) the other side closing mid-handshake. Both are
// authentication failures naming the peer; whoever fails first names the reason.
void ExpectRefusedOnBothSides(const std::vector<Status>& st, const std::string& reason) {
  ExpectAuthFailureNaming(st[0], 1);
  ExpectAuthFailureNaming(st[1], 0);
  EXPECT_TRUE(st[0].message().find(reason) != std::string::npos || st[1].message().find(reason) != std::string::npos)
      << st[0] << " / " << st[1];
}

TEST(RingSecurityTest, APeerWithAnotherKeyIsRefusedOnBothSides) {
  for (bool encrypt : {false, true}) {
    SCOPED_TRACE(encrypt);
    // Two ranks: each is the other's left and right, so both handshakes fail on both sides.
    auto st = RunRing(2, {Auth(encrypt, 1), Auth(encrypt, 2)}, [](int, RingCollective&) { return OkStatus(); });
    ExpectRefusedOnBothSides(st, "ring keys differ");
  }
  // Three ranks, the stranger in the middle: it fails, and so does the ring around it.
  auto st = RunRing(3, {Auth(false, 1), Auth(false, 2), Auth(false, 1)}, [](int, RingCollective&) { return OkStatus(); });
  for (const auto& s : st) EXPECT_FALSE(s.ok());
  EXPECT_NE(st[1].message().find("ring authentication failed"), std::string::npos) << st[1];
  EXPECT_TRUE(st[0].message().find("and rank 1 (") != std::string::npos || st[2].message().find("and rank 1 (") != std::string::npos)
      << st[0] << " / " << st[2];
}

TEST(RingSecurityTest, DifferentRingEncryptIsRefusedOnBothSides) {
  auto st = RunRing(2, {Auth(true), Auth(false)}, [](int, RingCollective&) { return OkStatus(); });
  ExpectRefusedOnBothSides(st, "--ring-encrypt differs");
}

// Rank 0 of a two-rank ring (`security`) against a fake rank 1 played by raw sockets: it
// connects to rank 0 and sends `hello`, and accepts rank 0's connection without a word.
Status AgainstAFakePeer(const RingSecurity& security, const void* hello, size_t hello_bytes) {
  auto ring = RingCollective::Listen("127.0.0.1", {}, security);
  GRADSYNC_CHECK(ring.ok()) << ring.status();
  const int listen_fd = ::socket(AF_INET, SOCK_STREAM, 0), conn_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  GRADSYNC_CHECK(::bind(listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(listen_fd, 2) == 0);
  socklen_t len = sizeof(a);
  ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::vector<std::string> peers = {"127.0.0.1:" + std::to_string((*ring)->port()),
                                          "127.0.0.1:" + std::to_string(ntohs(a.sin_port))};
  Status result;
  std::thread t([&] { result = (*ring)->Connect(0, peers, 5); });
  a.sin_port = htons((*ring)->port());
  GRADSYNC_CHECK(::connect(conn_fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  GRADSYNC_CHECK(::send(conn_fd, hello, hello_bytes, MSG_NOSIGNAL) == static_cast<ssize_t>(hello_bytes));
  pollfd p{listen_fd, POLLIN, 0};
  const int held = ::poll(&p, 1, 5000) > 0 ? ::accept(listen_fd, nullptr, nullptr) : -1;
  t.join();
  for (int fd : {held, conn_fd, listen_fd}) {
    if (fd >= 0) ::close(fd);
  }
  return result;
}

TEST(RingSecurityTest, APlaintextPeerIsRefused) {
  const uint32_t plain_hello[2] = {ring_handshake::kPlainHelloMagic, 1};
  Status s = AgainstAFakePeer(Auth(true), plain_hello, sizeof(plain_hello));
  ExpectAuthFailureNaming(s, 1);
  EXPECT_NE(s.message().find("without authentication"), std::string::npos) << s;
  EXPECT_NE(s.message().find("connection from 127.0.0.1:"), std::string::npos) << s;
  // A real plaintext worker in an authenticated ring: both sides fail, naming each other.
  auto st = RunRing(2, {Auth(false), RingSecurity{}}, [](int, RingCollective&) { return OkStatus(); });
  ExpectAuthFailureNaming(st[0], 1);
  EXPECT_FALSE(st[1].ok());
  EXPECT_NE(st[1].message().find("rank 0"), std::string::npos) << st[1];
}

TEST(RingSecurityTest, APlaintextWorkerTellsAnAuthenticatingPeerWhy) {
  ring_handshake::Hello hello{ring_handshake::kHelloMagic, 1, 0, ring_handshake::kVersion, ring_handshake::RandomNonce()};
  Status s = AgainstAFakePeer(RingSecurity{}, &hello, sizeof(hello));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("this worker has no --auth-dir"), std::string::npos) << s;
}

TEST(RingSecurityTest, AStrangerIsRefused) {
  // A well-formed hello and a made-up proof: the stranger does not hold the key.
  struct {
    ring_handshake::Hello hello;
    ring_handshake::Finish finish;
  } forged{{ring_handshake::kHelloMagic, 1, 0, ring_handshake::kVersion, ring_handshake::RandomNonce()},
           {ring_handshake::kFinishMagic, ring_handshake::kAccepted, ring_handshake::RandomNonce()}};
  Status s = AgainstAFakePeer(Auth(false), &forged, sizeof(forged));
  ExpectAuthFailureNaming(s, 1);
  EXPECT_NE(s.message().find("ring keys differ"), std::string::npos) << s;
  // Not even a ring peer.
  const uint32_t garbage[4] = {0xdeadbeef, 1, 2, 3};
  s = AgainstAFakePeer(Auth(false), garbage, sizeof(garbage));
  ExpectAuthFailureNaming(s, 1);
  EXPECT_NE(s.message().find("not a gradsync ring peer"), std::string::npos) << s;
}

TEST(RingSecurityTest, KeysAndMacsAreBoundToTheirInputs) {
  using namespace ring_handshake;
  EXPECT_EQ(KeyOf(1), KeyOf(1));
  EXPECT_NE(KeyOf(1), KeyOf(2));
  EXPECT_NE(RandomNonce(), RandomNonce());
  const auto ctx = RingContext({"127.0.0.1:1", "127.0.0.1:2"});
  EXPECT_NE(ctx, RingContext({"127.0.0.1:1", "127.0.0.1:3"}));
  Hello hello{kHelloMagic, 0, 0, kVersion, RandomNonce()};
  Reply reply{kReplyMagic, 1, 0, kVersion, RandomNonce(), {}};
  const auto t = Transcript(ctx, hello, reply);
  // The roles differ, so a proof cannot be reflected back.
  EXPECT_FALSE(MacEqual(AcceptorMac(KeyOf(1), t), ConnectorMac(KeyOf(1), t)));
  EXPECT_TRUE(MacEqual(AcceptorMac(KeyOf(1), t), AcceptorMac(KeyOf(1), t)));
  EXPECT_FALSE(MacEqual(AcceptorMac(KeyOf(1), t), AcceptorMac(KeyOf(2), t)));
  // A fresh nonce on either side changes the transcript: a replayed proof does not verify.
  Reply fresh = reply;
  fresh.nonce = RandomNonce();
  EXPECT_NE(t, Transcript(ctx, hello, fresh));
  // Each direction has its own session key, and the two sides agree on them.
  const SessionKeys c = DeriveSessionKeys(KeyOf(1), t, true), a = DeriveSessionKeys(KeyOf(1), t, false);
  EXPECT_EQ(c.send, a.recv);
  EXPECT_EQ(c.recv, a.send);
  EXPECT_NE(c.send, c.recv);
}

// ---- A man in the middle ----

// Forwards one TCP connection to 127.0.0.1:target, both ways, over plain POSIX sockets; the
// bytes from the connector (the ring's sender) go through `edit` first, which may rewrite the
// stream (it reads from `from` and writes to `to` itself, then returns to plain forwarding).
class Proxy {
 public:
  using Edit = std::function<void(int from, int to)>;
  Proxy(uint16_t target, Edit edit) : target_(target), edit_(std::move(edit)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    GRADSYNC_CHECK(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    GRADSYNC_CHECK(::listen(listen_fd_, 4) == 0);
    socklen_t len = sizeof(a);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~Proxy() {
    stop_ = true;
    for (int fd : {in_fd_.load(), out_fd_.load()}) {
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    }
    thread_.join();
    for (int fd : {listen_fd_, in_fd_.load(), out_fd_.load()}) {
      if (fd >= 0) ::close(fd);
    }
  }
  uint16_t port() const { return port_; }

  // Reads exactly n bytes (false on EOF or error).
  static bool ReadFull(int fd, void* p, size_t n) {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t k = ::read(fd, c, n);
      if (k <= 0) return false;
      c += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }
  static bool WriteFull(int fd, const void* p, size_t n) {
    auto* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
      if (k <= 0) return false;
      c += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }

 private:
  static void Pump(int from, int to) {
    char buf[65536];
    while (true) {
      const ssize_t k = ::read(from, buf, sizeof(buf));
      if (k <= 0 || !WriteFull(to, buf, static_cast<size_t>(k))) break;
    }
    ::shutdown(to, SHUT_WR);
    ::shutdown(from, SHUT_RD);
  }

  void Run() {
    pollfd p{listen_fd_, POLLIN, 0};
    for (int waited = 0; waited < 150 && !stop_; ++waited) {  // 15 s at most
      if (::poll(&p, 1, 100) > 0) break;
    }
    if (stop_ || !(p.revents & POLLIN)) return;
    const int in = ::accept(listen_fd_, nullptr, nullptr);
    const int out = ::socket(AF_INET, SOCK_STREAM, 0);
    in_fd_ = in;
    out_fd_ = out;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(target_);
    if (in < 0 || ::connect(out, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return;
    std::thread back([in, out] { Pump(out, in); });
    if (edit_) edit_(in, out);
    Pump(in, out);
    back.join();
  }

  uint16_t target_;
  Edit edit_;
  int listen_fd_ = -1;
  std::atomic<int> in_fd_{-1}, out_fd_{-1};
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Forwards the handshake, then `skip` whole encrypted frames, then hands the next frame to `frame`
// (which forwards whatever it likes).
Proxy::Edit AtFrame(int skip, std::function<void(std::vector<uint8_t>& frame, int to)> frame) {
  return [skip, frame](int from, int to) {
    // The hello, then (once the acceptor answered it) the verdict and proof.
    for (size_t part : {sizeof(ring_handshake::Hello), sizeof(ring_handshake::Finish)}) {
      std::vector<uint8_t> hs(part);
      if (!Proxy::ReadFull(from, hs.data(), hs.size()) || !Proxy::WriteFull(to, hs.data(), hs.size())) return;
    }
    for (int i = 0; i <= skip; ++i) {
      uint32_t len = 0;
      if (!Proxy::ReadFull(from, &len, 4) || len > RingStream::kMaxFrame) return;
      std::vector<uint8_t> f(4 + len + 16);
      std::memcpy(f.data(), &len, 4);
      if (!Proxy::ReadFull(from, f.data() + 4, len + 16)) return;
      if (i < skip) {
        if (!Proxy::WriteFull(to, f.data(), f.size())) return;
      } else {
        frame(f, to);
      }
    }
  };
}

// Two encrypted ranks whose every connection runs through a proxy; rank 1's (carrying rank 0's
// data to it) runs `edit`. Both ranks all-reduce 1000 floats.
std::vector<Status> RunThroughProxies(const Proxy::Edit& edit) {
  std::vector<std::unique_ptr<Proxy>> proxies;
  CollectiveOptions opt;
  opt.timeout_s = 5;
  opt.algorithm = AllReduceAlgo::kRing;  // the frames counted below are the ring's
  return RunRing(
      2, {Auth(true), Auth(true)},
      [](int r, RingCollective& ring) -> Status {
        std::vector<float> x(1000, static_cast<float>(r + 1));
        RETURN_IF_ERROR(ring.AllReduce(x, ReduceOp::kSum));
        for (float v : x) {
          if (v != 3.0f) return InternalError("wrong sum " + std::to_string(v));
        }
        return OkStatus();
      },
      opt,
      [&](const std::vector<uint16_t>& ports) {
        std::vector<std::string> peers;
        for (size_t r = 0; r < ports.size(); ++r) {
          proxies.push_back(std::make_unique<Proxy>(ports[r], r == 1 ? edit : nullptr));
          peers.push_back("127.0.0.1:" + std::to_string(proxies.back()->port()));
        }
        return peers;
      });
}

TEST(RingSecurityTest, AnHonestProxyChangesNothing) {
  auto st = RunThroughProxies(AtFrame(1, [](std::vector<uint8_t>& f, int to) { Proxy::WriteFull(to, f.data(), f.size()); }));
  for (const auto& s : st) EXPECT_TRUE(s.ok()) << s;
}

// Rank 1 receives the altered frame: kDataLoss naming its sender. When that happens in step 0,
// rank 1 never sends its reduced chunk and rank 0 fails too (it lost rank 1); later, rank 0 may
// already hold its exact result.
void ExpectTamperingDetected(const std::vector<Status>& st, bool in_step_0 = true) {
  EXPECT_EQ(st[1].code(), StatusCode::kDataLoss) << st[1];
  EXPECT_NE(st[1].message().find("rank 0 ("), std::string::npos) << st[1];
  EXPECT_NE(st[1].message().find("failed authentication"), std::string::npos) << st[1];
  if (in_step_0) {
    EXPECT_FALSE(st[0].ok());
  }
}

TEST(RingSecurityTest, ATamperedFrameFailsTheCollective) {
  // Frame 0 is the step header; frame 1 carries the first chunk of floats.
  ExpectTamperingDetected(RunThroughProxies(AtFrame(1, [](std::vector<uint8_t>& f, int to) {
    f[4 + (f.size() - 20) / 2] ^= 0x01;  // one bit of the ciphertext
    Proxy::WriteFull(to, f.data(), f.size());
  })));
  // The same for the step header's tag.
  ExpectTamperingDetected(RunThroughProxies(AtFrame(0, [](std::vector<uint8_t>& f, int to) {
    f[f.size() - 1] ^= 0x80;  // the tag
    Proxy::WriteFull(to, f.data(), f.size());
  })));
}

TEST(RingSecurityTest, AReplayedOrDroppedFrameFailsTheCollective) {
  // The first data frame twice: the copy arrives under the next frame's counter (step 1's header).
  ExpectTamperingDetected(RunThroughProxies(AtFrame(1, [](std::vector<uint8_t>& f, int to) {
    Proxy::WriteFull(to, f.data(), f.size());
    Proxy::WriteFull(to, f.data(), f.size());
  })), /*in_step_0=*/false);
  // The step header twice: the copy arrives where the data should.
  ExpectTamperingDetected(RunThroughProxies(AtFrame(0, [](std::vector<uint8_t>& f, int to) {
    Proxy::WriteFull(to, f.data(), f.size());
    Proxy::WriteFull(to, f.data(), f.size());
  })));
  // The step header dropped: the data frame arrives under the header's counter.
  ExpectTamperingDetected(RunThroughProxies(AtFrame(0, [](std::vector<uint8_t>&, int) {})));
}

}  // namespace
}  // namespace gradsync
