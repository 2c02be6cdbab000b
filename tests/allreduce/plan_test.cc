// The collective's steps (allreduce/plan/schedule.h) on their own: every send has its receive,
// every plan all-reduces (run in memory, step by step, as the collective runs them), and the
// bytes are the algorithms' formulas.
#include "allreduce/plan/schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <tuple>

namespace gradsync {
namespace {

std::vector<std::vector<int>> OneHostPer(int n, int per_host) {
  std::vector<std::vector<int>> hosts;
  for (int r = 0; r < n; ++r) {
    if (r % per_host == 0) hosts.emplace_back();
    hosts.back().push_back(r);
  }
  return hosts;
}

std::vector<Plan> Plans(AllReduceAlgo algo, int n, size_t count, const std::vector<std::vector<int>>& hosts) {
  std::vector<Plan> plans;
  for (int r = 0; r < n; ++r) plans.push_back(AllReducePlan(algo, r, n, count, hosts));
  return plans;
}

// Runs every rank's plan in memory: a step's send is posted (a copy of the range) as soon as
// the rank reaches it, its receive waits for the matching (from, tag) message. Shared-memory
// phases sum the host's buffers into the leader and copy the leader's back.
// Returns false on a deadlock.
bool RunInMemory(const std::vector<Plan>& plans, const std::vector<std::vector<int>>& hosts,
                 std::vector<std::vector<double>>* data) {
  const int n = static_cast<int>(plans.size());
  std::vector<size_t> at(static_cast<size_t>(n), 0);
  std::map<std::tuple<int, int, uint32_t>, std::vector<double>> mail;  // (to, from, tag)
  std::vector<bool> posted(static_cast<size_t>(n), false);
  auto host_of = [&](int r) -> const std::vector<int>& {
    for (const auto& h : hosts)
      for (int x : h)
        if (x == r) return h;
    return hosts.front();
  };
  for (int rounds = 0; rounds < 100000; ++rounds) {
    bool moved = false, done = true;
    for (int r = 0; r < n; ++r) {
      auto& d = (*data)[static_cast<size_t>(r)];
      const Plan& p = plans[static_cast<size_t>(r)];
      if (at[r] == p.size()) continue;
      done = false;
      const PlanStep& s = p[at[r]];
      if (s.shm != PlanStep::Shm::kNone) {
        // Every member of the host must be at the same phase; the leader does the work.
        const auto& h = host_of(r);
        bool all_there = true;
        for (int m : h) all_there &= at[m] < plans[m].size() && plans[m][at[m]].shm == s.shm;
        if (!all_there || r != h.front()) continue;
        for (int m : h) {
          if (m == r) continue;
          auto& md = (*data)[static_cast<size_t>(m)];
          for (size_t i = 0; i < d.size(); ++i) {
            if (s.shm == PlanStep::Shm::kBroadcast) md[i] = d[i];
            else d[i] += md[i];
          }
        }
        if (s.shm == PlanStep::Shm::kAllReduce) {
          for (int m : h) (*data)[static_cast<size_t>(m)] = d;
        }
        for (int m : h) ++at[m];
        moved = true;
        continue;
      }
      if (s.to >= 0 && !posted[r]) {
        mail[{s.to, r, s.tag}] = std::vector<double>(d.begin() + static_cast<long>(s.send.begin), d.begin() + static_cast<long>(s.send.end));
        posted[r] = true;
        moved = true;
      }
      if (s.from >= 0) {
        auto it = mail.find({r, s.from, s.tag});
        if (it == mail.end()) continue;
        if (it->second.size() != s.recv.size()) return false;
        for (size_t i = 0; i < s.recv.size(); ++i) {
          double& x = d[s.recv.begin + i];
          x = s.reduce ? x + it->second[i] : it->second[i];
        }
        mail.erase(it);
      }
      posted[r] = false;
      ++at[r];
      moved = true;
    }
    if (done) return mail.empty();
    if (!moved) return false;
  }
  return false;
}

class PlanTest : public ::testing::TestWithParam<AllReduceAlgo> {};

TEST_P(PlanTest, EveryRankEndsWithTheSumAndEverySendIsReceived) {
  for (int n = 1; n <= 9; ++n) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{37}}) {
      for (int per_host : {1, 2, 3}) {
        if (GetParam() != AllReduceAlgo::kHier && per_host > 1) continue;
        const auto hosts = OneHostPer(n, GetParam() == AllReduceAlgo::kShm ? n : per_host);
        std::vector<std::vector<double>> data(static_cast<size_t>(n));
        std::vector<double> sum(count, 0);
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < count; ++i) {
            data[r].push_back(static_cast<double>((r + 1) * 1000 + i));
            sum[i] += data[r].back();
          }
        }
        ASSERT_TRUE(RunInMemory(Plans(GetParam(), n, count, hosts), hosts, &data))
            << AllReduceAlgoName(GetParam()) << " n=" << n << " count=" << count << " per host " << per_host;
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(data[r], sum) << AllReduceAlgoName(GetParam()) << " n=" << n << " count=" << count << " rank " << r;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, PlanTest,
                         ::testing::Values(AllReduceAlgo::kRing, AllReduceAlgo::kRhd, AllReduceAlgo::kRd, AllReduceAlgo::kTree,
                                           AllReduceAlgo::kShm, AllReduceAlgo::kHier),
                         [](const auto& p) { return std::string(AllReduceAlgoName(p.param)); });

uint64_t Bytes(const Plan& p, size_t elem) {
  uint64_t b = 0;
  for (const auto& s : p) b += StepWireBytes(s, elem);
  return b;
}

TEST(PlanBytesTest, TheRingAndHalvingDoublingSendTwoNMinusOneOverNOfTheBuffer) {
  for (int n : {2, 4, 8}) {
    const size_t count = 8 * 1024;
    for (int r = 0; r < n; ++r) {
      const uint64_t payload = 2 * (n - 1) * count / n * 4;
      EXPECT_EQ(Bytes(RingAllReducePlan(r, n, count), 4), payload + 2 * (n - 1) * kStepHeaderBytes);
      int log = 0;
      while ((1 << log) < n) ++log;
      EXPECT_EQ(Bytes(HalvingDoublingPlan(r, n, count), 4), payload + 2 * log * kStepHeaderBytes);
      EXPECT_EQ(Bytes(RecursiveDoublingPlan(r, n, count), 4), log * (count * 4 + kStepHeaderBytes));
    }
  }
}

TEST(PlanBytesTest, ABroadcastSendsEverySegmentOnceWithItsHeader) {
  const size_t bytes = 5 * kDefaultSegmentBytes / 2;
  for (int r = 0; r < 4; ++r) {
    const uint64_t expected = r == 3 ? 0 : bytes + 3 * kStepHeaderBytes;  // rank 3 is last from root 0
    EXPECT_EQ(Bytes(BroadcastPlan(r, 4, 0, bytes), 1), expected) << r;
  }
}

TEST(PlanBytesTest, AnAllGatherSendsTheSizesThenEveryBlockButTheNext) {
  const std::vector<size_t> sizes = {100, 0, 7, 50};
  for (int r = 0; r < 4; ++r) {
    uint64_t b = 0;
    for (const auto& s : AllGatherPlan(r, 4)) b += AllGatherWireBytes(s, 4, sizes);
    const size_t next = static_cast<size_t>((r + 1) % 4);
    const uint64_t blocks = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0}) - sizes[next];
    EXPECT_EQ(b, 6 * kStepHeaderBytes + 3 * sizeof(uint64_t) + blocks) << r;
  }
}

TEST(ResolveAllReduceAlgoTest, AutoTakesSharedMemoryOnOneHostTheHierarchyAcrossHostsElseTheChoice) {
  EXPECT_EQ(ResolveAllReduceAlgo({AllReduceAlgo::kAuto, 1, true, false}, 1 << 20, 4), AllReduceAlgo::kShm);
  EXPECT_EQ(ResolveAllReduceAlgo({AllReduceAlgo::kAuto, 2, true, false}, 1 << 20, 4), AllReduceAlgo::kHier);
  EXPECT_EQ(ResolveAllReduceAlgo({AllReduceAlgo::kAuto, 4, false, false}, 1 << 20, 4), ChooseAllReduceAlgo(1 << 20, 4, false));
  EXPECT_EQ(ResolveAllReduceAlgo({AllReduceAlgo::kAuto, 1, false, true}, 1 << 10, 4), ChooseAllReduceAlgo(1 << 10, 4, true));
  EXPECT_EQ(ResolveAllReduceAlgo({AllReduceAlgo::kTree, 1, true, false}, 1 << 20, 4), AllReduceAlgo::kTree);
}

}  // namespace
}  // namespace gradsync
