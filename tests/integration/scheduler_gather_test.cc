// SchedulerClient::Gather: a barrier that returns every worker's data by rank (the Python
// frontend compares the workers' model layouts with it).
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "common/net/control/client/scheduler_client.h"
#include "common/net/transport.h"
#include "server/scheduler/scheduler.h"

namespace gradsync {
namespace {

SchedulerClientOptions WorkerOptions(const std::string& endpoint, int rank) {
  SchedulerClientOptions c;
  c.scheduler_endpoint = endpoint;
  c.self.set_role(wire::WORKER);
  c.self.set_host("127.0.0.1");
  c.self.set_requested_rank(rank);
  c.mode = "allreduce";
  c.heartbeat_interval_s = 0.2;
  return c;
}

TEST(SchedulerGatherTest, EveryWorkerGetsEveryWorkersDataByRank) {
  TransportContext ctx(1);
  SchedulerOptions so;
  so.num_servers = 0;
  so.num_workers = 3;
  so.register_timeout_s = 20;
  auto sched = Scheduler::Create(ctx, so);
  ASSERT_TRUE(sched.ok()) << sched.status();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string((*sched)->port());
  std::thread st([&] { (void)(*sched)->Run(); });
  std::vector<std::vector<std::string>> got(3);
  std::vector<Status> errors(3);
  std::vector<std::thread> workers;
  for (int r = 2; r >= 0; --r) {  // registration order differs from rank order
    workers.emplace_back([&, r] {
      SchedulerClient sc(ctx, WorkerOptions(endpoint, r));
      auto table = sc.Register(20);
      if (!table.ok()) {
        errors[r] = table.status();
        return;
      }
      auto g = sc.Gather("layout", "workers", "data of " + std::to_string(r), 20);
      if (!g.ok()) {
        errors[r] = g.status();
      } else {
        got[r] = *g;
      }
      // A second gather of another name, and a plain barrier after it: neither sees old data.
      auto again = sc.Gather("second", "workers", std::string(r + 1, 'x'), 20);
      if (again.ok() && again->size() == 3 && (*again)[2] != "xxx") errors[r] = InternalError("second gather mixed up");
      if (Status b = sc.Barrier("plain", "workers", 20); !b.ok()) errors[r] = b;
      sc.Finished(OkStatus());
      sc.Flush(1);
    });
  }
  for (auto& t : workers) t.join();
  (*sched)->Stop();
  st.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r].ok()) << "worker " << r << ": " << errors[r];
    ASSERT_EQ(got[r].size(), 3u);
    for (int q = 0; q < 3; ++q) EXPECT_EQ(got[r][q], "data of " + std::to_string(q));
  }
}

TEST(SchedulerGatherTest, OversizedDataIsRefusedBeforeItIsSent) {
  TransportContext ctx(1);
  SchedulerClient sc(ctx, WorkerOptions("tcp://127.0.0.1:9", 0));  // never reached: refused first
  auto g = sc.Gather("big", "workers", std::string(kMaxGatherBytes + 1, 'x'), 1);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("at most"), std::string::npos) << g.status();
}

}  // namespace
}  // namespace gradsync
