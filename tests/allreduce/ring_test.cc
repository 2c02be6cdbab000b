// The CPU ring over threads: exact results for every world size and awkward count, the other
// collectives, mismatched operations, and ranks that die or stall.
#include <gtest/gtest.h>

#include <boost/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <sstream>
#include <thread>

#include "allreduce/tcp_ring.h"
#include "common/base/numeric/half.h"
#include "common/config/train_names.h"
#include "tests/allreduce/exact_sums.h"

namespace gradsync {
namespace {

using RankFn = std::function<Status(int rank, RingCollective& ring)>;

// Starts n rings on 127.0.0.1 (threads), wires them, runs fn on each; returns each rank's status.
// hosts[r] (if given) is rank r's address: 127.0.0.x are all this machine's, but the collective
// takes ranks of different addresses for different hosts.
std::vector<Status> RunRing(int n, const RankFn& fn, CollectiveOptions options = {}, std::vector<std::string> hosts = {}) {
  std::vector<std::unique_ptr<RingCollective>> rings;
  std::vector<std::string> peers;
  hosts.resize(static_cast<size_t>(n), "127.0.0.1");
  for (int r = 0; r < n; ++r) {
    auto ring = RingCollective::Listen(hosts[r], options);
    GRADSYNC_CHECK(ring.ok()) << ring.status();
    peers.push_back(hosts[r] + ":" + std::to_string((*ring)->port()));
    rings.push_back(std::move(ring).value());
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

class RingAllReduceTest : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(RingAllReduceTest, SumsExactlyAndAverages) {
  auto [n, count_spec] = GetParam();
  // -1 stands for n - 1 (a count smaller than the number of chunks).
  const size_t count = static_cast<size_t>(count_spec < 0 ? n - 1 : count_spec);
  CollectiveOptions opt;
  opt.segment_bytes = 4098;  // many segments per chunk: exercises the pipelining (and whole floats)
  opt.algorithm = AllReduceAlgo::kRing;
  auto statuses = RunRing(n, [&](int r, RingCollective& ring) -> Status {
    // Small integers: every partial sum is exact in float, whatever the order.
    std::vector<float> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1));
    RETURN_IF_ERROR(ring.AllReduce(x, ReduceOp::kSum));
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += x[i] != ranks_sum * static_cast<float>(i % 7 + 1);
    if (wrong) return InternalError(std::to_string(wrong) + " wrong sums on rank " + std::to_string(r));
    std::vector<float> y(count, static_cast<float>(r));
    RETURN_IF_ERROR(ring.AllReduce(y, ReduceOp::kAverage));
    for (float v : y) {
      if (std::fabs(v - (n - 1) / 2.0f) > 1e-6f) return InternalError("wrong average " + std::to_string(v));
    }
    // The half-precision ring: the same small integers are exact in half too.
    std::vector<uint16_t> h(count);
    for (size_t i = 0; i < count; ++i) h[i] = FloatToHalf(static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1)));
    const uint64_t sent_before = ring.bytes_sent();
    RETURN_IF_ERROR(ring.AllReduce16(h, Float16::kHalf));
    for (size_t i = 0; i < count; ++i) wrong += HalfToFloat(h[i]) != ranks_sum * static_cast<float>(i % 7 + 1);
    if (wrong) return InternalError(std::to_string(wrong) + " wrong half sums on rank " + std::to_string(r));
    // 2(n-1)/n of 2-byte elements, plus one small header per step.
    const uint64_t sent = ring.bytes_sent() - sent_before;
    if (n > 1 && sent > 2 * count * 2 + 64 * 2 * static_cast<uint64_t>(n)) {
      return InternalError("the half ring sent " + std::to_string(sent) + " bytes for " + std::to_string(count) + " halves");
    }
    return OkStatus();
  }, opt);
  for (int r = 0; r < n; ++r) EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
}

INSTANTIATE_TEST_SUITE_P(
    WorldsAndCounts, RingAllReduceTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 5), ::testing::Values<int64_t>(0, 1, -1, 1000, 1000003)),
    [](const auto& p) {
      const int64_t c = std::get<1>(p.param);
      return "n" + std::to_string(std::get<0>(p.param)) + "_count" + (c < 0 ? std::string("n_minus_1") : std::to_string(c));
    });

// Every algorithm, every world size up to 8 (powers of two and not), awkward counts: exact sums
// and averages in float and half, bit-identical results on every rank for values whose sum
// depends on the order, and the bytes each algorithm should send.
class AllReduceAlgoTest : public ::testing::TestWithParam<std::tuple<AllReduceAlgo, int, int64_t>> {};

TEST_P(AllReduceAlgoTest, SumsExactlyAndEveryRankGetsTheSameBits) {
  auto [algo, n, count_spec] = GetParam();
  const size_t count = static_cast<size_t>(count_spec < 0 ? n - 1 : count_spec);
  CollectiveOptions opt;
  opt.segment_bytes = 4098;
  opt.algorithm = algo;
  std::vector<std::vector<float>> results(static_cast<size_t>(n));
  std::vector<uint64_t> sent(static_cast<size_t>(n));
  auto statuses = RunRing(n, [&](int r, RingCollective& ring) -> Status {
    RETURN_IF_ERROR(testing::ExactSums(ring, r, n, count));
    if (n > 1 && count > 0 && ring.last_algorithm() != algo) return InternalError("ran another algorithm");
    // Values whose float sum depends on the order of the additions.
    std::vector<float> y(count);
    for (size_t i = 0; i < count; ++i) y[i] = 1.0f / static_cast<float>(1 + (i * 7919 + static_cast<size_t>(r) * 104729) % 1000);
    const uint64_t before = ring.bytes_sent();
    RETURN_IF_ERROR(ring.AllReduce(y, ReduceOp::kAverage));
    sent[r] = ring.bytes_sent() - before;
    results[r] = y;
    return OkStatus();
  }, opt);
  for (int r = 0; r < n; ++r) ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  for (int r = 1; r < n; ++r) {
    if (count > 0) {  // (an empty vector's data() may be null, which memcmp must not get)
      EXPECT_EQ(0, std::memcmp(results[0].data(), results[r].data(), count * sizeof(float))) << "rank " << r << " differs";
    }
  }
  for (size_t i = 0; i < count; ++i) {
    double mean = 0;
    for (int r = 0; r < n; ++r) mean += 1.0 / (1 + (i * 7919 + static_cast<size_t>(r) * 104729) % 1000);
    ASSERT_NEAR(results[0][i], mean / n, 1e-6 * mean) << i;
  }
  if (n == 1 || count < static_cast<size_t>(n)) return;
  // Bytes each rank sends (headers aside): rhd on a power of two as the ring, 2(n-1)/n of the
  // buffer; rd log2(n) whole buffers; the tree at most one whole buffer up and log2(n) down.
  const uint64_t buffer = count * sizeof(float), headers = 64 * 64;
  const bool pow2 = (n & (n - 1)) == 0;
  int log2n = 0;
  while ((1 << log2n) < n) ++log2n;
  for (int r = 0; r < n; ++r) {
    uint64_t bound = 0;
    switch (algo) {
      case AllReduceAlgo::kRing: bound = 2 * buffer * (n - 1) / n + static_cast<uint64_t>(n) * 4 + headers; break;
      case AllReduceAlgo::kRhd: bound = (pow2 ? 2 * buffer * (n - 1) / n + static_cast<uint64_t>(n) * 4 : 3 * buffer) + headers; break;
      case AllReduceAlgo::kRd: bound = (log2n + 1) * buffer + headers; break;
      default: bound = (log2n + 1) * buffer + headers; break;
    }
    EXPECT_LE(sent[r], bound) << AllReduceAlgoName(algo) << " rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AlgorithmsWorldsAndCounts, AllReduceAlgoTest,
    ::testing::Combine(::testing::Values(AllReduceAlgo::kRing, AllReduceAlgo::kRhd, AllReduceAlgo::kRd, AllReduceAlgo::kTree),
                       ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8), ::testing::Values<int64_t>(0, -1, 1001, 100003)),
    [](const auto& p) {
      const int64_t c = std::get<2>(p.param);
      return std::string(AllReduceAlgoName(std::get<0>(p.param))) + "_n" + std::to_string(std::get<1>(p.param)) + "_count" +
             (c < 0 ? std::string("n_minus_1") : std::to_string(c));
    });

// Swaps go in lockstep (CollectiveOptions::exchange_segment_bytes): whatever the lockstep and
// read segments, and halves of unequal sizes (an odd count), every rank finishes with exact sums.
TEST(AllReduceAlgoTest, LockstepSwapsFinishExactlyForAnySegments) {
  for (AllReduceAlgo algo : {AllReduceAlgo::kRhd, AllReduceAlgo::kRd}) {
    for (int n : {2, 3, 4}) {
      for (size_t lock : {size_t{0}, size_t{1001}, size_t{1} << 20}) {
        for (size_t segment : {size_t{4096}, size_t{1} << 20}) {
          CollectiveOptions opt;
          opt.algorithm = algo;
          opt.exchange_segment_bytes = lock;
          opt.segment_bytes = segment;
          auto statuses = RunRing(n, [&](int r, RingCollective& ring) { return testing::ExactSums(ring, r, n, 100003); }, opt);
          for (int r = 0; r < n; ++r) {
            ASSERT_TRUE(statuses[r].ok()) << AllReduceAlgoName(algo) << " n=" << n << " lockstep " << lock << " segment "
                                          << segment << " rank " << r << ": " << statuses[r];
          }
        }
      }
    }
  }
}

TEST(AllReduceAlgoTest, MeshPeersAreSymmetricAndFew) {
  for (int n = 1; n <= 64; ++n) {
    for (int r = 0; r < n; ++r) {
      const auto peers = MeshPeers(r, n);
      EXPECT_LE(peers.size(), 3u * 7u) << n;  // fold + log2(n) partners + tree edges
      for (int p : peers) {
        ASSERT_TRUE(p >= 0 && p < n && p != r) << r << " of " << n << ": " << p;
        const auto back = MeshPeers(p, n);
        EXPECT_TRUE(std::find(back.begin(), back.end(), r) != back.end()) << r << " -> " << p << " of " << n;
      }
    }
  }
}

TEST(AllReduceAlgoTest, AutoPicksByStepsForSmallAndByBandwidthForLarge) {
  for (bool oversubscribed : {false, true}) {
    for (int n : {2, 3, 4, 8}) {
      EXPECT_NE(ChooseAllReduceAlgo(4096, n, oversubscribed), AllReduceAlgo::kRing) << n;
      // Large: halving-doubling where no fold is needed, else the ring.
      EXPECT_EQ(ChooseAllReduceAlgo(size_t{256} << 20, n, oversubscribed),
                (n & (n - 1)) == 0 ? AllReduceAlgo::kRhd : AllReduceAlgo::kRing)
          << n;
    }
  }
  // Halving-doubling only where no fold is needed.
  EXPECT_EQ(ChooseAllReduceAlgo(size_t{512} << 10, 4), AllReduceAlgo::kRhd);
  EXPECT_EQ(ChooseAllReduceAlgo(size_t{512} << 10, 6), AllReduceAlgo::kRing);
  // More ranks than cores: the tree while it is latency, the ring once it is bytes.
  EXPECT_EQ(ChooseAllReduceAlgo(size_t{64} << 10, 4, true), AllReduceAlgo::kTree);
  EXPECT_EQ(ChooseAllReduceAlgo(size_t{4} << 20, 4, true), AllReduceAlgo::kRhd);
  EXPECT_EQ(ChooseAllReduceAlgo(size_t{512} << 10, 3, true), AllReduceAlgo::kTree);
  EXPECT_EQ(ChooseAllReduceAlgo(size_t{4} << 20, 3, true), AllReduceAlgo::kRing);
  EXPECT_EQ(*ParseAllReduceAlgo("rhd"), AllReduceAlgo::kRhd);
  // The names the configuration accepts are exactly the ones the collective knows.
  std::stringstream names(kAllReduceAlgoNames);
  for (std::string name; std::getline(names, name, '|');) {
    ASSERT_TRUE(ParseAllReduceAlgo(name).ok()) << name;
    EXPECT_STREQ(AllReduceAlgoName(*ParseAllReduceAlgo(name)), name.c_str());
  }
  EXPECT_FALSE(ParseAllReduceAlgo("butterfly").ok());
}

TEST(AllReduceAlgoTest, RanksThatRunDifferentAlgorithmsFailNamingBoth) {
  auto rings = std::make_shared<std::vector<std::unique_ptr<RingCollective>>>();
  std::vector<std::string> peers;
  for (int r = 0; r < 3; ++r) {
    CollectiveOptions opt;
    opt.timeout_s = 5;
    opt.algorithm = r == 1 ? AllReduceAlgo::kTree : AllReduceAlgo::kRing;
    rings->push_back(std::move(RingCollective::Listen("127.0.0.1", opt)).value());
    peers.push_back("127.0.0.1:" + std::to_string(rings->back()->port()));
  }
  std::vector<Status> st(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      Status s = (*rings)[r]->Connect(r, peers, 10);
      std::vector<float> x(1000, 1.0f);
      st[r] = s.ok() ? (*rings)[r]->AllReduce(x, ReduceOp::kSum) : s;
    });
  }
  for (auto& t : threads) t.join();
  bool named = false;
  for (const auto& s : st) {
    EXPECT_FALSE(s.ok());
    named |= s.message().find("every worker needs the same --allreduce-algo") != std::string::npos;
  }
  EXPECT_TRUE(named) << st[0] << " / " << st[1] << " / " << st[2];
}

// n = 3 ranks all-reduce under `opt` while rank `stalled` sleeps past the timeout (3 s); each
// rank whose all-reduce failed must find the collective broken. Statuses, and per rank the
// seconds its all-reduce took (the stalled rank's: its sleep).
constexpr double kStallS = 3.0;
std::pair<std::vector<Status>, std::vector<double>> WithAStalledRank(const CollectiveOptions& opt, int stalled) {
  std::vector<double> took(3, -1);
  auto st = RunRing(3, [&](int r, RingCollective& ring) -> Status {
    std::vector<float> x(1000, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    if (r == stalled) {
      std::this_thread::sleep_for(std::chrono::duration<double>(kStallS));  // never joins in time
      took[static_cast<size_t>(r)] = kStallS;
      return OkStatus();
    }
    Status s = ring.AllReduce(x, ReduceOp::kSum);
    took[static_cast<size_t>(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Later calls fail at once on a broken ring.
    if (!s.ok() && ring.Barrier().code() != StatusCode::kFailedPrecondition) return InternalError("ring not marked broken");
    return s;
  }, opt);
  return {st, took};
}

// Shared memory on one host, and the hierarchy across "hosts" (127.0.0.x): exact float and half
// sums, the same bits on every rank, no all-reduce bytes over TCP within a host.
struct ShmCase {
  std::vector<std::string> hosts;
  const char* name;
};
class ShmAllReduceTest : public ::testing::TestWithParam<ShmCase> {};

TEST_P(ShmAllReduceTest, SumsExactlyWithTheSameBitsEverywhere) {
  const auto& hosts = GetParam().hosts;
  const int n = static_cast<int>(hosts.size());
  for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{300007}}) {
    CollectiveOptions opt;
    opt.shm = true;
    opt.shm_block_bytes = 4096;  // many blocks: both result buffers in turn
    std::vector<std::vector<float>> results(static_cast<size_t>(n));
    std::vector<uint64_t> sent(static_cast<size_t>(n));
    auto st = RunRing(n, [&](int r, RingCollective& ring) -> Status {
      if (!ring.shared_memory()) return InternalError("no shared memory: " + ring.shared_memory_off_reason());
      const uint64_t before = ring.bytes_sent();
      RETURN_IF_ERROR(testing::ExactSums(ring, r, n, count));
      sent[r] = ring.bytes_sent() - before;
      const AllReduceAlgo want = ring.topology().host_count() == 1 ? AllReduceAlgo::kShm : AllReduceAlgo::kHier;
      if (count > 0 && ring.last_algorithm() != want) return InternalError(std::string("ran ") + AllReduceAlgoName(ring.last_algorithm()));
      std::vector<float> x(count, 1.0f);
      std::vector<float> y(count);
      for (size_t i = 0; i < count; ++i) y[i] = 1.0f / static_cast<float>(1 + (i * 7919 + static_cast<size_t>(r) * 104729) % 1000);
      RETURN_IF_ERROR(ring.AllReduce(y, ReduceOp::kAverage));
      results[r] = y;
      // The other collectives still work over TCP beside it.
      RETURN_IF_ERROR(ring.ReduceScatter(x, ReduceOp::kSum));
      return ring.Barrier();
    }, opt, hosts);
    for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].ok()) << GetParam().name << " count " << count << " rank " << r << ": " << st[r];
    for (int r = 1; r < n && count > 0; ++r) EXPECT_EQ(0, std::memcmp(results[0].data(), results[r].data(), count * sizeof(float))) << r;
    // One host: nothing over TCP. Across hosts: only the leaders send, one ring's worth.
    for (int r = 0; r < n; ++r) {
      const bool leader = std::find(hosts.begin(), hosts.end(), hosts[r]) - hosts.begin() == r;
      const bool alone = std::count(hosts.begin(), hosts.end(), hosts[r]) == n;
      if (alone || !leader) {
        EXPECT_EQ(sent[r], 0u) << GetParam().name << " rank " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Hosts, ShmAllReduceTest,
    ::testing::Values(ShmCase{{"127.0.0.1", "127.0.0.1"}, "one_host_2"}, ShmCase{{"127.0.0.1", "127.0.0.1", "127.0.0.1"}, "one_host_3"},
                      ShmCase{{"127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1"}, "one_host_5"},
                      ShmCase{{"127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"}, "two_hosts_2x2"},
                      ShmCase{{"127.0.0.1", "127.0.0.2", "127.0.0.1", "127.0.0.3", "127.0.0.2"}, "three_hosts_interleaved"}),
    [](const auto& p) { return std::string(p.param.name); });

TEST(ShmAllReduceTest, AStalledRankFailsTheOthersNamingIt) {
  // Sleeping at once, and polling for longer than the timeout: the deadline holds either way.
  for (const double poll_ms : {0.0, 1000.0}) {
    CollectiveOptions opt;
    opt.shm = true;
    opt.timeout_s = 0.5;
    opt.shm_wait.busy_poll_ms = poll_ms;
    auto [st, took] = WithAStalledRank(opt, 2);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(st[r].code(), StatusCode::kDeadlineExceeded) << poll_ms << ": " << st[r];
      EXPECT_NE(st[r].message().find("rank 2 did not reach the shared-memory all-reduce"), std::string::npos) << st[r];
      // By the timeout (0.5 s), not by the stalled rank coming back (3 s).
      EXPECT_GE(took[r], 0.5 * opt.timeout_s) << r;  // (a rank may learn it from a neighbour that timed out a little earlier)
      EXPECT_LT(took[r], kStallS - 0.5) << poll_ms << ": rank " << r;
    }
  }
}

TEST(ShmAllReduceTest, OffWhenAsked) {
  CollectiveOptions opt;
  opt.algorithm = AllReduceAlgo::kShm;
  auto st = RunRing(2, [&](int, RingCollective& ring) -> Status {
    std::vector<float> x(10, 1.0f);
    if (ring.shared_memory()) return InternalError("shared memory though off");
    return ring.AllReduce(x, ReduceOp::kSum);
  }, opt);
  for (const auto& s : st) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("needs shared memory"), std::string::npos) << s;
  }
}

// Reduce-scatter leaves rank r's chunk reduced; all-gather of the chunks completes it.
// Before the ring forms, strangers connect to a rank's port: one says nothing and hangs up, one
// sends bytes that are no hello, one a plaintext hello of "rank 0" (the left neighbour's rank for
// rank 1) from another ring (another job's rank on a reused port). Each is dropped; the ring
// forms with its members and sums exactly.
TEST(RingTest, ConnectionsNotOfThisRingAreDroppedNotFatal) {
  constexpr int n = 3;
  std::vector<std::unique_ptr<RingCollective>> rings;
  std::vector<std::string> peers;
  for (int r = 0; r < n; ++r) {
    rings.push_back(std::move(RingCollective::Listen("127.0.0.1", {})).value());
    peers.push_back("127.0.0.1:" + std::to_string(rings.back()->port()));
  }
  {
    boost::asio::io_context io;
    const boost::asio::ip::tcp::endpoint target(boost::asio::ip::make_address("127.0.0.1"), rings[1]->port());
    std::vector<std::unique_ptr<boost::asio::ip::tcp::socket>> strangers;
    for (int k = 0; k < 3; ++k) {
      auto sock = std::make_unique<boost::asio::ip::tcp::socket>(io);
      sock->connect(target);
      if (k == 1) boost::asio::write(*sock, boost::asio::buffer(std::string("GET / HTTP/1.0\r\n\r\n")));
      if (k == 2) {
        const uint32_t hello[4] = {0x47534849, 0, 0x12345678, 0x9abcdef0};  // plaintext hello, rank 0, a wrong token
        boost::asio::write(*sock, boost::asio::buffer(hello, sizeof(hello)));
      }
      if (k == 0) sock->close();
      strangers.push_back(std::move(sock));
    }
    std::vector<Status> st(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        Status s = rings[r]->Connect(r, peers, 10);
        std::vector<float> x(1001, static_cast<float>(r + 1));
        if (s.ok()) s = rings[r]->AllReduce(x, ReduceOp::kSum);
        if (s.ok() && x[1000] != 6.0f) s = InternalError("rank " + std::to_string(r) + " summed to " + std::to_string(x[1000]));
        st[r] = s;
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  }
}

TEST(RingTest, ReduceScatterThenAllGatherIsAnAllReduce) {
  for (int n : {1, 2, 3, 4, 5}) {
    for (size_t count : {size_t{0}, size_t{3}, size_t{1001}, size_t{100003}}) {
      CollectiveOptions opt;
      opt.segment_bytes = 4098;
      auto st = RunRing(n, [&](int r, RingCollective& ring) -> Status {
        std::vector<float> x(count);
        for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1));
        const uint64_t before = ring.bytes_sent();
        RETURN_IF_ERROR(ring.ReduceScatter(x, ReduceOp::kAverage));
        const uint64_t rs_sent = ring.bytes_sent() - before;
        const float mean = static_cast<float>(n + 1) / 2.0f;
        const size_t b = ChunkBegin(count, n, r), e = ChunkBegin(count, n, r + 1);
        for (size_t i = b; i < e; ++i) {
          if (x[i] != mean * static_cast<float>(i % 7 + 1)) return InternalError("reduce-scatter wrong at " + std::to_string(i));
        }
        // Half an all-reduce: (n-1)/n of the buffer, plus headers.
        if (rs_sent > count * 4 * static_cast<size_t>(n - 1) / static_cast<size_t>(n) + 4 * static_cast<size_t>(n) + 64 * static_cast<size_t>(n)) {
          return InternalError("reduce-scatter sent " + std::to_string(rs_sent));
        }
        for (size_t i = 0; i < count; ++i) {
          if (i < b || i >= e) x[i] = -1.0f;  // the rest is undefined: make sure all-gather fills it
        }
        RETURN_IF_ERROR(ring.AllGatherChunks(x));
        for (size_t i = 0; i < count; ++i) {
          if (x[i] != mean * static_cast<float>(i % 7 + 1)) return InternalError("all-gather wrong at " + std::to_string(i));
        }
        return OkStatus();
      }, opt);
      for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << "n " << n << " count " << count << " rank " << r << ": " << st[r];
    }
  }
}

TEST(RingTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < 4; ++root) {
    CollectiveOptions opt;
    opt.segment_bytes = 1024;
    auto st = RunRing(4, [&](int r, RingCollective& ring) -> Status {
      std::vector<float> x(10007, r == root ? 3.5f : -1.0f);
      RETURN_IF_ERROR(ring.Broadcast(x, root));
      for (float v : x)
        if (v != 3.5f) return InternalError("rank " + std::to_string(r) + " got " + std::to_string(v));
      return OkStatus();
    }, opt);
    for (const auto& s : st) EXPECT_TRUE(s.ok()) << "root " << root << ": " << s;
  }
}

TEST(RingTest, AllGatherWithUnequalAndEmptyParts) {
  auto st = RunRing(4, [&](int r, RingCollective& ring) -> Status {
    // Rank r contributes r * 1000 bytes (rank 0: nothing), each byte = r.
    std::vector<std::byte> mine(static_cast<size_t>(r) * 1000, static_cast<std::byte>(r));
    std::vector<std::vector<std::byte>> all;
    RETURN_IF_ERROR(ring.AllGather(mine, &all));
    if (all.size() != 4) return InternalError("wrong part count");
    for (int i = 0; i < 4; ++i) {
      if (all[i].size() != static_cast<size_t>(i) * 1000) return InternalError("wrong size of part " + std::to_string(i));
      for (auto b : all[i])
        if (b != static_cast<std::byte>(i)) return InternalError("wrong byte in part " + std::to_string(i));
    }
    return ring.Barrier();
  });
  for (const auto& s : st) EXPECT_TRUE(s.ok()) << s;
}

TEST(RingTest, MismatchedOperationsFailLoudlyInsteadOfMixingData) {
  auto st = RunRing(2, [&](int r, RingCollective& ring) -> Status {
    std::vector<float> x(100, 1.0f);
    if (r == 0) return ring.AllReduce(x, ReduceOp::kSum);
    std::vector<std::vector<std::byte>> all;
    return ring.AllGather(std::as_bytes(std::span<const float>(x)), &all);
  });
  ASSERT_FALSE(st[0].ok());
  ASSERT_FALSE(st[1].ok());
  bool named = false;
  for (const auto& s : st) named |= s.message().find("mismatched collectives") != std::string::npos;
  EXPECT_TRUE(named) << st[0] << " / " << st[1];
  // A broken ring refuses further work at once.
}

TEST(RingTest, ADeadRankFailsEveryOtherRankWithinTheTimeout) {
  CollectiveOptions opt;
  opt.timeout_s = 1.0;
  auto start = std::chrono::steady_clock::now();
  auto st = RunRing(3, [&](int r, RingCollective& ring) -> Status {
    std::vector<float> x(1 << 20, 1.0f);
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ring.Abort();  // dies mid-operation (the others are already waiting on it)
      return AbortedError("killed");
    }
    return ring.AllReduce(x, ReduceOp::kSum);
  }, opt);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(st[r].ok()) << r;
    EXPECT_TRUE(st[r].code() == StatusCode::kUnavailable || st[r].code() == StatusCode::kDeadlineExceeded) << st[r];
  }
  EXPECT_LT(took, 2 * opt.timeout_s + 0.5);
}

TEST(RingTest, AStalledRankMakesTheOthersTimeOut) {
  CollectiveOptions opt;
  opt.timeout_s = 0.5;
  auto [st, took] = WithAStalledRank(opt, 1);
  for (int r : {0, 2}) {
    EXPECT_FALSE(st[r].ok()) << r;
    EXPECT_FALSE(st[r].message().empty()) << r;
    // By the timeout (0.5 s), not by the stalled rank coming back (3 s).
    EXPECT_GE(took[r], 0.5 * opt.timeout_s) << r;  // (a rank may learn it from a neighbour that timed out a little earlier)
    EXPECT_LT(took[r], kStallS - 0.5) << r;
  }
  // A neighbour of the stalled rank times out waiting for it: its status says so.
  EXPECT_TRUE(st[0].code() == StatusCode::kDeadlineExceeded || st[2].code() == StatusCode::kDeadlineExceeded)
      << st[0] << " / " << st[2];
}

}  // namespace
}  // namespace gradsync
