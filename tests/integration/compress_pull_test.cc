// --compress-pull at the wire: a pull reply carries the compressed parameter delta since the
// worker's last pull, and the server's record of what the worker holds follows the worker bit
// for bit, so that repeated pulls of unchanged parameters converge to them exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "common/net/control/client/scheduler_client.h"
#include "server/scheduler/scheduler.h"
#include "server/server.h"
#include "worker/ps/client/ps_client.h"

namespace gradsync {
namespace {

TEST(CompressPullTest, DeltasAreCompressedAndTheResidualIsCarriedUntilExact) {
  constexpr int64_t kParams = 1000;
  TransportContext ctx(1);
  SchedulerOptions so;
  so.num_servers = 1;
  so.num_workers = 1;
  auto sched = Scheduler::Create(ctx, so);
  ASSERT_TRUE(sched.ok()) << sched.status();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string((*sched)->port());
  ServerOptions sopt;
  sopt.link.scheduler_endpoint = endpoint;
  sopt.rule.mode = ConsistencyMode::kAsp;
  auto server = Server::Create(ctx, sopt);
  ASSERT_TRUE(server.ok()) << server.status();
  Status sched_status, server_status;
  std::thread st([&] { sched_status = (*sched)->Run(); });
  std::thread vt([&] { server_status = (*server)->Run(); });

  SchedulerClientOptions sc;
  sc.scheduler_endpoint = endpoint;
  sc.self.set_role(wire::WORKER);
  sc.self.set_host("127.0.0.1");
  sc.mode = "asp";
  Status worker_status = [&]() -> Status {
    SchedulerClient client(ctx, sc);
    ASSIGN_OR_RETURN(wire::ClusterTable table, client.Register(30));
    std::vector<TensorInfo> layout = {{"w", {kParams}, 0, kParams, false}};
    ASSIGN_OR_RETURN(auto ps, PsClient::Create(ctx, table, 0, layout, &client));
    RETURN_IF_ERROR(ps->SetCompression("topk:0.25", 7, /*error_feedback=*/true, 0, /*compress_pull=*/true));
    wire::JobConfig job;
    auto* t = job.add_tensors();
    t->set_name("w");
    t->set_size(kParams);
    job.set_num_params(kParams);
    job.set_num_workers(1);
    job.set_lr(0.5f);
    job.set_lr_schedule("constant");
    job.set_total_steps(10);
    job.set_compression("topk:0.25");
    job.set_compression_seed(7);
    job.set_compress_pull(true);
    std::vector<float> params(kParams), grads(kParams), exact(kParams);
    for (int64_t i = 0; i < kParams; ++i) {
      params[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
      grads[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + static_cast<float>(i % 13));
    }
    RETURN_IF_ERROR(ps->Init(job, params, 10));
    const std::vector<float> initial = params;
    // The first pull has no baseline: it comes raw.
    ASSIGN_OR_RETURN(auto p0, ps->Pull(0, params, {}));
    RETURN_IF_ERROR(ps->Wait(p0, 10));
    EXPECT_EQ(params, initial);
    // Three pushes (each a top-k 25% of its gradient) change up to 750 parameters.
    for (int c = 0; c < 3; ++c) {
      for (int64_t i = 0; i < kParams; ++i) grads[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * c) * (1.0f + static_cast<float>(i % 13));
      ASSIGN_OR_RETURN(auto push, ps->Push(c, grads, {}, {}));
      RETURN_IF_ERROR(ps->Wait(push, 10));
    }
    // The next pull is a top-k 25% delta: a quarter of the bytes (plus the header), and only
    // the largest changes have arrived.
    const uint64_t before = ps->traffic().bytes_received;
    ASSIGN_OR_RETURN(auto p1, ps->Pull(3, params, {}));
    RETURN_IF_ERROR(ps->Wait(p1, 10));
    const uint64_t reply_bytes = ps->traffic().bytes_received - before;
    const size_t payload = 250 * (sizeof(uint32_t) + sizeof(float));
    EXPECT_GE(reply_bytes, payload);
    EXPECT_LE(reply_bytes, payload + 200);
    int changed = 0;
    for (int64_t i = 0; i < kParams; ++i) changed += params[i] != initial[i];
    EXPECT_EQ(changed, 250);
    // With no further updates, each pull sends the next largest differences (the residual):
    // the worker ends bit-identical to the server.
    for (int k = 0; k < 10; ++k) {
      ASSIGN_OR_RETURN(auto p, ps->Pull(3, params, {}));
      RETURN_IF_ERROR(ps->Wait(p, 10));
    }
    ASSIGN_OR_RETURN(auto full, ps->Pull(3, exact, {}, /*full=*/true));
    RETURN_IF_ERROR(ps->Wait(full, 10));
    EXPECT_EQ(params, exact);
    int updated = 0;
    for (int64_t i = 0; i < kParams; ++i) updated += exact[i] != initial[i];
    EXPECT_GT(updated, 400);  // so the first delta (250) could not carry everything
    client.Finished(OkStatus());
    client.Flush(5);
    return OkStatus();
  }();
  EXPECT_TRUE(worker_status.ok()) << worker_status;
  if (!worker_status.ok()) {
    (*server)->Stop();
    (*sched)->Stop();
  }
  st.join();
  vt.join();
  EXPECT_GE((*server)->stats().channels.compressed_pulls, 11);
  EXPECT_EQ((*server)->stats().requests.rejected, 0);
}

}  // namespace
}  // namespace gradsync
