// The simulator's all-reduce choice is the real collective's: over a grid of sizes, ranks and
// host layouts against ChooseAllReduceAlgo, and against RingCollective itself on this machine.
#include <gtest/gtest.h>

#include <thread>

#include "allreduce/tcp_ring.h"
#include "common/base/check.h"
#include "experiments/sim/sim.h"

namespace gradsync {
namespace {

RunPlan PlanOf(const std::string& run) {
  auto e = ParseExperiment("name: \"t\"\n" + run, "t.textproto");
  GRADSYNC_CHECK(e.ok()) << e.status();
  return e->runs.at(0);
}

AllReduceAlgo SimChoice(int workers, const std::string& train, const std::string& rest, size_t bytes) {
  // A spec holds up to 64 workers; gradsync-sim --workers sets any count, as here.
  RunPlan plan = PlanOf("run { name: \"a\" workers: 2 train { mode: ALLREDUCE " + train + " } " + rest + " }");
  plan.workers = workers;
  auto settings = ResolveSim(plan);
  GRADSYNC_CHECK(settings.ok()) << settings.status();
  return SimulatedAllReduceAlgo(plan, *settings, bytes);
}

const size_t kSizes[] = {4096, 65536, 65540, 524288, 1048576, 1048580, 4194304, 67108864};

TEST(SimAllReduceChoiceTest, OverAGridOfSizesRanksAndHostsItIsTheRealChoice) {
  for (int n : {2, 3, 4, 5, 8, 12, 16, 64, 1024}) {
    for (size_t bytes : kSizes) {
      const std::string at = "n=" + std::to_string(n) + " bytes=" + std::to_string(bytes);
      // A host per rank (network namespaces): never oversubscribed, no shared memory.
      EXPECT_EQ(SimChoice(n, "", "link { rate: \"1gbit\" } sim { compute_ms: 1 }", bytes), ChooseAllReduceAlgo(bytes, n, false)) << at;
      EXPECT_EQ(SimChoice(n, "", "sim { compute_ms: 1 link_rate: \"25gbit\" host_cores: 2 }", bytes), ChooseAllReduceAlgo(bytes, n, false))
          << at;
      // Every rank on this host (loopback): without shared memory, by size, ranks and cores.
      for (int cores : {0, 2, 16}) {
        EXPECT_EQ(SimChoice(n, "allreduce_shm: false", "sim { compute_ms: 1 host_cores: " + std::to_string(cores) + " }", bytes),
                  ChooseAllReduceAlgo(bytes, n, cores > 0 && n > cores))
            << at << " cores=" << cores;
      }
      // ... with it, shared memory; encrypted, the TCP choice again.
      EXPECT_EQ(SimChoice(n, "", "sim { compute_ms: 1 }", bytes), AllReduceAlgo::kShm) << at;
      EXPECT_EQ(SimChoice(n, "ring_encrypt: true", "sim { compute_ms: 1 host_cores: 2 }", bytes),
                ChooseAllReduceAlgo(bytes, n, n > 2))
          << at;
      // An algorithm asked for is the one run.
      EXPECT_EQ(SimChoice(n, "allreduce_algo: \"tree\"", "link { rate: \"1gbit\" } sim { compute_ms: 1 }", bytes), AllReduceAlgo::kTree)
          << at;
      EXPECT_EQ(SimChoice(n, "allreduce_algo: \"hier\"", "sim { compute_ms: 1 link_rate: \"25gbit\" hier_group: 4 }", bytes),
                AllReduceAlgo::kHier)
          << at;
    }
  }
}

// Starts n rings on this machine (rank r at hosts[r]) and returns the algorithm each size ran.
std::vector<AllReduceAlgo> RealChoices(int n, const std::vector<std::string>& hosts, bool shm) {
  CollectiveOptions options;
  options.shm = shm;
  std::vector<std::unique_ptr<RingCollective>> rings;
  std::vector<std::string> peers;
  for (int r = 0; r < n; ++r) {
    auto ring = RingCollective::Listen(hosts[static_cast<size_t>(r)], options);
    GRADSYNC_CHECK(ring.ok()) << ring.status();
    peers.push_back(hosts[static_cast<size_t>(r)] + ":" + std::to_string((*ring)->port()));
    rings.push_back(std::move(ring).value());
  }
  std::vector<AllReduceAlgo> rank0;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      GRADSYNC_CHECK(rings[r]->Connect(r, peers, 10).ok());
      for (size_t bytes : {size_t{4096}, size_t{1} << 20, size_t{4} << 20}) {
        std::vector<float> x(bytes / sizeof(float), 1.0f);
        GRADSYNC_CHECK(rings[r]->AllReduce(x, ReduceOp::kSum).ok());
        if (r == 0) rank0.push_back(rings[r]->last_algorithm());
      }
    });
  }
  for (auto& t : threads) t.join();
  return rank0;
}

TEST(SimAllReduceChoiceTest, ItIsWhatRingCollectiveRanOnThisMachine) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::string host_cores = "host_cores: " + std::to_string(cores);
  for (int n : {2, 3, 4}) {
    auto sim = [&](const std::string& train, const std::string& rest) {
      std::vector<AllReduceAlgo> out;
      for (size_t bytes : {size_t{4096}, size_t{1} << 20, size_t{4} << 20}) out.push_back(SimChoice(n, train, rest, bytes));
      return out;
    };
    const std::vector<std::string> one_host(static_cast<size_t>(n), "127.0.0.1");
    std::vector<std::string> own_hosts;
    for (int r = 0; r < n; ++r) own_hosts.push_back("127.0.0." + std::to_string(r + 1));
    EXPECT_EQ(RealChoices(n, one_host, false), sim("allreduce_shm: false", "sim { compute_ms: 1 " + host_cores + " }")) << n;
    EXPECT_EQ(RealChoices(n, one_host, true), sim("", "sim { compute_ms: 1 " + host_cores + " }")) << n;
    EXPECT_EQ(RealChoices(n, own_hosts, true), sim("", "link { rate: \"1gbit\" } sim { compute_ms: 1 }")) << n;
  }
}

}  // namespace
}  // namespace gradsync
