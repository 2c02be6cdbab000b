#include "tests/support/ps_job.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "allreduce/tcp_ring.h"
#include "common/base/numeric/tensor.h"
#include "common/data/synthetic.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/ps/ps_protocol.h"
#include "server/scheduler/scheduler.h"
#include "tests/support/fake_device.h"
#include "worker/job_trainer.h"
#include "worker/ps/client/ps_client.h"

namespace gradsync::testing {

Dataset SmallBlobs(int64_t n, int classes) {
  BlobsOptions bo;
  bo.n = n;
  bo.dim = 12;
  bo.classes = classes;
  bo.center_scale = 0.8f;
  return MakeGaussianBlobs(bo);
}

ModelOptions SmallMlp() {
  ModelOptions m;
  m.name = "mlp";
  m.input_dim = 12;
  m.num_classes = 4;
  m.hidden = {16};
  return m;
}

LocalTrainOptions SmallTrain(int64_t batch, int64_t steps, float momentum) {
  LocalTrainOptions t;
  t.batch = batch;
  t.epochs = 100;
  t.max_steps = steps;
  t.seed = 5;
  t.lr = {LrSchedule::Kind::kCosine, 0.05f, 0, 0.0f};
  t.optimizer.momentum = momentum;
  t.optimizer.weight_decay = 1e-4f;
  return t;
}

std::unique_ptr<Model> MakeTestModel(const ModelOptions& options, bool fake_device) {
  if (fake_device) return std::make_unique<FakeDeviceModel>(options);
  auto m = CreateModel(options);
  GRADSYNC_CHECK(m.ok()) << m.status();
  return std::move(m).value();
}

std::vector<float> RunLocal(const ModelOptions& model_options, const LocalTrainOptions& train, uint64_t init_seed,
                            const Dataset& data, bool fake_device) {
  auto model = MakeTestModel(model_options, fake_device);
  model->Initialize(init_seed);
  LocalTrainer t(train, model.get(), &data, &data, nullptr);
  auto r = t.Run();
  GRADSYNC_CHECK(r.ok()) << r.status();
  GRADSYNC_CHECK(model->ParamsToHost().ok());
  return std::vector<float>(model->params().begin(), model->params().end());
}

double SummationNoise(const ModelOptions& model, LocalTrainOptions train, int64_t micro, const Dataset& data) {
  train.micro_batch = 0;
  const std::vector<float> whole = RunLocal(model, train, 0, data);
  train.micro_batch = micro;
  return MaxRelativeDiff(RunLocal(model, train, 0, data), whole, 1e-3);
}

double EquivalenceTolerance(double noise, double base) { return std::min(kMaxEquivalenceTolerance, std::max(base, 10.0 * noise)); }

// Runs n allreduce workers; returns rank 0's parameters after training (all ranks must agree).
Result<std::vector<float>> RunAllreduceJob(int n, const ModelOptions& mo, const LocalTrainOptions& train,
                                           const Dataset& data, size_t bucket_bytes, const std::string& compression,
                                           bool error_feedback, float correction_momentum, bool fake_device) {
  AllreduceTrainOptions o;
  o.bucket_bytes = bucket_bytes;
  o.codec.compression = compression;
  o.codec.error_feedback = error_feedback;
  o.codec.correction_momentum = correction_momentum;
  ASSIGN_OR_RETURN(auto result, RunAllreduceJobWith(n, mo, train, data, o, fake_device));
  return result.params;
}

Result<AllreduceJobResult> RunAllreduceJobWith(int n, const ModelOptions& mo, const LocalTrainOptions& train,
                                               const Dataset& data, const AllreduceTrainOptions& base, bool fake_device,
                                               AllReduceAlgo algorithm) {
  CollectiveOptions co;
  co.algorithm = algorithm;
  std::vector<std::unique_ptr<RingCollective>> rings;
  std::vector<std::string> peers;
  for (int r = 0; r < n; ++r) {
    rings.push_back(std::move(RingCollective::Listen("127.0.0.1", co)).value());
    peers.push_back("127.0.0.1:" + std::to_string(rings.back()->port()));
  }
  std::vector<std::vector<float>> params(static_cast<size_t>(n));
  std::vector<Status> status(static_cast<size_t>(n));
  AllreduceJobResult result;
  result.optimizer_state_bytes.resize(static_cast<size_t>(n));
  result.bytes_sent.resize(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      status[r] = rings[r]->Connect(r, peers, 10);
      if (!status[r].ok()) return;
      auto model = MakeTestModel(mo, fake_device);
      model->Initialize(r == 0 ? 0 : 1000 + r);  // only rank 0's initial values may matter
      HostDeviceCollective device(rings[r].get());
      AllreduceTrainOptions o = base;
      o.train = train;
      o.evaluate = false;
      if (fake_device) o.device_collective = &device;
      AllreduceTrainer t(o, model.get(), &data, &data, nullptr, rings[r].get());
      auto rep = t.Run();
      status[r] = rep.ok() ? model->ParamsToHost() : rep.status();
      params[r].assign(model->params().begin(), model->params().end());
      result.optimizer_state_bytes[r] = t.optimizer_state_bytes();
      result.bytes_sent[r] = rings[r]->bytes_sent();
    });
  }
  for (auto& t : threads) t.join();
  // Every failed rank's message: the first one's is often only that a peer went away.
  std::string failures;
  for (int r = 0; r < n; ++r) {
    if (!status[r].ok()) failures += (failures.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": ") + status[r].ToString();
  }
  if (!failures.empty()) return Status(status[0].ok() ? StatusCode::kInternal : status[0].code(), failures);
  for (int r = 0; r < n; ++r) {
    if (params[r] != params[0]) return InternalError("rank " + std::to_string(r) + " ended with other parameters");
  }
  result.params = params[0];
  return result;
}

PsJobResult RunPsJob(const PsJobOptions& o, const Dataset& train, const Dataset& test) {
  PsJobResult result;
  TransportContext ctx(2);
  std::unique_ptr<CurveAuthenticator> auth;
  if (o.security) auth = std::move(EnableCurve(ctx, *o.security)).value();
  SchedulerOptions so;
  so.num_servers = o.num_servers;
  so.num_workers = o.num_workers;
  so.heartbeat_timeout_s = o.heartbeat_timeout_s;
  so.register_timeout_s = 30;
  auto sched = Scheduler::Create(ctx, so);
  GRADSYNC_CHECK(sched.ok()) << sched.status();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string((*sched)->port());
  std::mutex mu;
  std::chrono::steady_clock::time_point killed_at{};
  auto fail = [&](const Status& s) {
    std::lock_guard lock(mu);
    if (result.status.ok() && !s.ok()) {
      result.status = s;
      if (killed_at != std::chrono::steady_clock::time_point{}) {
        result.kill_to_failure_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
      }
    }
  };

  std::vector<std::unique_ptr<Server>> servers;
  for (int i = 0; i < o.num_servers; ++i) {
    ServerOptions opt;
    opt.link.scheduler_endpoint = endpoint;
    opt.rule.mode = o.mode;
    opt.rule.staleness = o.staleness;
    opt.link.requested_rank = i;
    opt.link.heartbeat_interval_s = 0.2;
    opt.link.scheduler_timeout_s = o.heartbeat_timeout_s;
    opt.record_pulls = true;
    opt.channels.drop_data_channel_after_pulls = o.drop_data_channel_after_pulls;
    opt.channels.drop_data_channel_after_pushes = o.drop_data_channel_after_pushes;
    auto s = Server::Create(ctx, opt);
    GRADSYNC_CHECK(s.ok()) << s.status();
    servers.push_back(std::move(s).value());
  }
  std::vector<uint16_t> ports;
  for (auto& s : servers) ports.push_back(s->port());

  std::vector<std::thread> threads;
  threads.emplace_back([&] { fail((*sched)->Run().WithContext("scheduler")); });
  for (auto& s : servers) threads.emplace_back([&, srv = s.get()] { fail(srv->Run().WithContext("server")); });

  std::atomic<int> past_init{0};
  for (int w = 0; w < o.num_workers; ++w) {
    threads.emplace_back([&, w] {
      SchedulerClientOptions sc;
      sc.scheduler_endpoint = endpoint;
      sc.self.set_role(wire::WORKER);
      sc.self.set_host("127.0.0.1");
      sc.self.set_requested_rank(w);
      sc.mode = ConsistencyModeName(o.mode);
      sc.staleness = o.mode == ConsistencyMode::kSsp ? o.staleness : 0;
      sc.heartbeat_interval_s = 0.2;
      sc.scheduler_timeout_s = o.heartbeat_timeout_s;
      SchedulerClient client(ctx, sc);
      Status status;
      auto table = client.Register(30);
      if (!table.ok()) {
        fail(table.status());
        return;
      }
      auto model = MakeTestModel(o.model, o.fake_device);
      model->Initialize(o.init_seed);
      auto ps = PsClient::Create(ctx, *table, client.rank(), model->layout(), &client);
      if (!ps.ok()) {
        fail(ps.status());
        client.Finished(ps.status());
        client.Flush(1);
        return;
      }
      PsTrainOptions pto;
      pto.train = o.train;
      pto.rank = client.rank();
      pto.num_workers = o.num_workers;
      pto.request_timeout_s = 30;
      pto.barrier_timeout_s = 60;
      pto.evaluate = false;
      pto.codec = {.compression = o.compression, .error_feedback = o.error_feedback,
                   .correction_momentum = o.correction_momentum, .compress_pull = o.compress_pull};
      pto.shard_update = {.staleness_aware_lr = o.staleness_aware_lr, .delay_compensation = o.delay_compensation,
                          .delay_compensation_adaptive = o.delay_compensation_adaptive};
      pto.overlap = {.enabled = o.overlap, .push_part_floats = o.push_part_floats};
      pto.channels = {.shm = o.shm, .data_channel = o.data_channel, .data_min_floats = o.data_min_floats};
      // Delays go through a model wrapper would be heavier; a per-step hook is enough here.
      if (o.delay_ms) pto.loop.before_compute = [&, w](int64_t step) {
        double d = o.delay_ms(w, step);
        if (d > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(d));
      };
      pto.after_init = [&] { past_init++; };
      pto.loop.step_lr = o.step_lr;
      PsTrainer trainer(pto, model.get(), &train, &test, nullptr, ps->get(), &client);
      auto r = trainer.Run();
      status = r.ok() ? OkStatus() : r.status();
      fail(status.WithContext("worker " + std::to_string(w)));
      client.Finished(status);
      client.Flush(1);
    });
  }
  std::thread side;
  if (o.side_task || o.kill_server >= 0) {
    side = std::thread([&] {
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (past_init.load() < o.num_workers && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (o.side_task) o.side_task(ports);
      if (o.kill_server >= 0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(o.kill_after_s));
        {
          std::lock_guard lock(mu);
          killed_at = std::chrono::steady_clock::now();
        }
        servers[static_cast<size_t>(o.kill_server)]->Stop();
      }
    });
  }
  // A watchdog keeps a broken job from hanging the test.
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout_s);
    while (!done.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!done.load()) {
      fail(DeadlineExceededError("the test job ran past its time bound"));
      (*sched)->Stop();
      for (auto& s : servers) s->Stop();
    }
  });
  for (auto& t : threads) t.join();
  if (side.joinable()) side.join();
  done = true;
  watchdog.join();
  for (auto& s : servers) {
    auto p = s->params();
    result.params.insert(result.params.end(), p.begin(), p.end());
    result.table_rows.push_back(s->table_rows());
    result.pulls.push_back(s->pull_log());
    result.server_stats.push_back(s->stats());
    if (const DelayCompensation* dc = s->delay_compensation()) {
      result.compensated_pushes.push_back(dc->corrected());
      result.uncompensated_pushes.push_back(dc->uncorrected());
      result.relative_correction.push_back(dc->relative_correction());
    }
  }
  if (auth) result.auth_refused = auth->refused();
  return result;
}

SchedulerClientOptions LoopbackClient(const std::string& endpoint, wire::Role role, int rank, const std::string& mode,
                                      int staleness) {
  SchedulerClientOptions c;
  c.scheduler_endpoint = endpoint;
  c.self.set_role(role);
  c.self.set_host("127.0.0.1");
  c.self.set_requested_rank(rank);
  c.mode = mode;
  c.staleness = staleness;
  c.heartbeat_interval_s = 0.2;
  return c;
}

wire::JobConfig OneTensorJob(int64_t params, int workers, float lr) {
  wire::JobConfig job;
  auto* t = job.add_tensors();
  t->set_name("w");
  t->set_offset(0);
  t->set_size(static_cast<uint64_t>(params));
  t->add_shape(params);
  job.set_num_params(static_cast<uint64_t>(params));
  job.set_num_workers(workers);
  job.set_lr(lr);
  job.set_lr_schedule("constant");
  OptimizerOptions sgd;
  sgd.momentum = 0;
  SetJobOptimizer(sgd, &job);
  return job;
}

OneShardJob::~OneShardJob() {
  if (server_thread_.joinable() || scheduler_thread_.joinable()) {
    // Not finished (a test failed midway): stop everything rather than wait for the barriers.
    if (server_) server_->Stop();
    if (scheduler_) scheduler_->Stop();
    if (server_thread_.joinable()) server_thread_.join();
    if (scheduler_thread_.joinable()) scheduler_thread_.join();
  }
}

Status OneShardJob::Start() {
  SchedulerOptions so;
  so.num_servers = 1;
  so.num_workers = 2;
  so.heartbeat_timeout_s = 5;
  so.register_timeout_s = 30;
  ASSIGN_OR_RETURN(scheduler_, Scheduler::Create(ctx_, so));
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(scheduler_->port());
  ServerOptions sv;
  sv.link.scheduler_endpoint = endpoint;
  sv.rule.mode = mode_;
  sv.rule.staleness = staleness_;
  sv.link.heartbeat_interval_s = 0.2;
  ASSIGN_OR_RETURN(server_, Server::Create(ctx_, sv));
  scheduler_thread_ = std::thread([this] { scheduler_ran_ = scheduler_->Run(); });
  server_thread_ = std::thread([this] { server_ran_ = server_->Run(); });
  for (int w = 0; w < 2; ++w) {
    workers_.push_back(std::make_unique<SchedulerClient>(
        ctx_, LoopbackClient(endpoint, wire::WORKER, w, ConsistencyModeName(mode_), staleness_)));
  }
  Status other;
  std::thread second([&] { other = workers_[1]->Register(30).status(); });
  auto table = workers_[0]->Register(30);
  second.join();
  RETURN_IF_ERROR(table.status());
  RETURN_IF_ERROR(other);
  table_ = *table;
  return OkStatus();
}

Status OneShardJob::BothAt(const std::string& name) {
  Status other;
  std::thread second([&] { other = workers_[1]->Barrier(name, "workers", 30); });
  Status first = workers_[0]->Barrier(name, "workers", 30);
  second.join();
  RETURN_IF_ERROR(first);
  return other;
}

Status OneShardJob::InitBarrier() { return BothAt("init"); }

Status OneShardJob::Finish() {
  Status s = BothAt("trained");
  if (!s.ok()) return s;  // the destructor stops the job
  for (auto& w : workers_) {
    w->Finished(OkStatus());
    w->Flush(1);
  }
  server_thread_.join();
  scheduler_thread_.join();
  RETURN_IF_ERROR(server_ran_.WithContext("the server"));
  return scheduler_ran_.WithContext("the scheduler");
}

}  // namespace gradsync::testing
