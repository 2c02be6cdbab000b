#include "worker/run_worker.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "allreduce/tcp_ring.h"
#include "common/cluster.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/process_summary.h"
#include "common/scheduler_client.h"
#include "common/security.h"
#include "common/transport.h"
#include "gradsync/config.h"
#include "models/model.h"
#include "worker/allreduce_trainer.h"
#include "worker/data_source.h"
#include "worker/local_trainer.h"
#include "worker/ps_client.h"
#include "worker/ps_trainer.h"
#if GRADSYNC_HAVE_CUDA
#include "models/cuda/cuda_model.h"
#endif
#if GRADSYNC_HAVE_NCCL
#include "allreduce/nccl/nccl_allreduce.h"
#endif

namespace gradsync {
namespace {

using config::TrainConfig;

ModelOptions ModelOptionsFrom(const TrainConfig& c) {
  ModelOptions o;
  o.name = c.model();
  o.feature_bits = c.feature_bits();
  if (o.name == "mlp") o.hidden = *ParseIntList(c.hidden(), 1, 1 << 20);  // Validate() parsed it
  return o;
}

DataOptions DataOptionsFrom(const TrainConfig& c) {
  DataOptions o;
  o.name = EffectiveDataset(c);
  o.dir = c.data_dir();
  o.standardize = c.standardize();
  o.feature_bits = c.feature_bits();
  o.seed = c.seed();
  return o;
}

LocalTrainOptions TrainOptionsFrom(const TrainConfig& c) {
  LocalTrainOptions t;
  // DGC moves the momentum to the sender: the applied update is plain SGD.
  t.optimizer.momentum = c.momentum_correction() ? 0.0f : c.momentum();
  t.optimizer.nesterov = c.nesterov();
  t.optimizer.weight_decay = c.weight_decay();
  t.lr.base = c.lr();
  t.lr.kind = *ParseLrScheduleKind(c.lr_schedule());
  t.batch = c.batch();
  if (c.accumulate() > 1) {
    t.micro_batch = t.batch;
    t.batch *= c.accumulate();  // a step takes K micro-batches
  }
  t.warmup_epochs = c.warmup_epochs();
  t.epochs = c.epochs();
  t.max_steps = c.max_steps();
  t.seed = c.seed();
  t.log_every = c.log_every();
  t.eval_every = c.eval_every();
  t.straggler = *ParseStraggler(c.straggle());
  t.straggler_seed = c.straggle_seed();
  return t;
}

}  // namespace

int RunWorker(const TrainConfig& c, const config::WorkerProcess& p, const FlagParser& flags) {
  const config::Mode mode = c.mode();
  const std::string& mode_name = ModeName(mode);
  const bool ps = IsPsMode(mode), allreduce = mode == config::ALLREDUCE, joins = JoinsJob(mode);
  const bool cuda = c.device() == "cuda", sparse_model = c.model() == "sparse_logreg";
  const std::string compress = c.compress();
  const float correction_momentum = c.momentum_correction() ? c.momentum() : 0.0f;
  ModelOptions model_options = ModelOptionsFrom(c);
  const DataOptions data_options = DataOptionsFrom(c);
  LocalTrainOptions train = TrainOptionsFrom(c);
  SetBlasThreads(c.threads());

  // Parameter-server modes register first: the scheduler assigns the rank that picks the shard.
  TransportContext ctx(1);
  // --auth-dir: CURVE on every socket of this context (declared after it: stops first).
  std::unique_ptr<CurveAuthenticator> auth;
  if (p.has_auth_dir()) {
    auto a = EnableCurveFromDir(ctx, p.auth_dir());
    if (!a.ok()) flags.Fail("--auth-dir: " + a.status().message());
    auth = std::move(a).value();
  }
  std::unique_ptr<SchedulerClient> scheduler;
  wire::ClusterTable table;
  int rank = 0;
  std::unique_ptr<RingCollective> ring;
  if (allreduce) {
    CollectiveOptions co;
    co.timeout_s = c.collective_timeout();
    auto r = RingCollective::Listen(p.bind(), co);
    if (!r.ok()) {
      std::cerr << "gradsync-worker: error: " << r.status().message() << std::endl;
      return 1;
    }
    ring = std::move(r).value();
  }
  if (joins) {
    std::string host;
    uint16_t port = 0;
    if (Status s = ParseHostPort(p.scheduler(), &host, &port); !s.ok()) flags.Fail("--scheduler: " + s.message());
    SchedulerClientOptions so;
    so.scheduler_endpoint = "tcp://" + host + ":" + std::to_string(port);
    so.self.set_role(wire::WORKER);
    so.self.set_host(p.host());
    if (ring) so.self.set_port(ring->port());
    so.self.set_requested_rank(p.rank() >= 0 ? p.rank() : SlurmRank());
    so.mode = mode_name;
    // ssp without --staleness: -1 asks for the job's bound (the scheduler has it from the servers).
    so.staleness = mode == config::SSP ? (c.has_staleness() ? c.staleness() : -1) : 0;
    so.heartbeat_interval_s = p.heartbeat_interval();
    so.scheduler_timeout_s = p.heartbeat_timeout();
    so.job_fingerprint = JobFingerprint(c);  // the settings that must agree between the workers
    scheduler = std::make_unique<SchedulerClient>(ctx, so);
    auto t = scheduler->Register(300.0);
    if (!t.ok()) {
      std::cerr << "gradsync-worker: error: " << t.status().message() << std::endl;
      return t.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
    table = *t;
    rank = scheduler->rank();
    if (mode == config::SSP && !c.has_staleness()) {
      std::printf("gradsync-worker %d: staleness bound %d, the job's (no --staleness given)\n", rank, table.staleness());
    }
    if (allreduce) {
      std::vector<std::string> peers;
      for (const auto& w : table.workers()) peers.push_back(w.host() + ":" + std::to_string(w.port()));
      if (Status s = ring->Connect(rank, peers, 120); !s.ok()) {
        std::cerr << "gradsync-worker: error: " << s.message() << std::endl;
        scheduler->Finished(s);
        scheduler->Flush(2.0);
        return 1;
      }
    }
  }

  // Fails the job (so that the scheduler hears of it) with one line and exit 1.
  auto fail_job = [&](const Status& s) {
    std::cerr << "gradsync-worker: error: " << s.message() << std::endl;
    if (scheduler) {
      scheduler->Finished(s);
      scheduler->Flush(2.0);
    }
    return 1;
  };
  auto data = LoadTrainTest(data_options);
  if (!data.ok()) return fail_job(data.status());
  if (!sparse_model) {
    model_options.input_dim = data->train.dim;
    model_options.num_classes = data->train.num_classes;
  }
  Result<std::unique_ptr<Model>> model = UnimplementedError("no model");
  std::string device_name = "cpu";
#if GRADSYNC_HAVE_NCCL
  std::unique_ptr<NcclCollective> nccl;
#endif
  if (!cuda) {
    model = CreateModel(model_options);
    if (!model.ok()) flags.Fail(model.status().message());
  } else {
#if GRADSYNC_HAVE_CUDA
    if (Status s = DenseModelDims(model_options).status(); !s.ok()) flags.Fail(s.message());
    const int devices = CudaDeviceCount();
    if (devices == 0) return fail_job(FailedPreconditionError("--device=cuda: no CUDA device is visible"));
    const int gpu = c.gpu() >= 0 ? c.gpu() : rank % devices;
    if (allreduce && table.workers_size() > devices && !c.has_gpu()) {
      return fail_job(FailedPreconditionError("--device=cuda --mode=allreduce runs one NCCL rank per GPU: " +
                                              std::to_string(table.workers_size()) + " workers, " +
                                              std::to_string(devices) + " GPUs visible"));
    }
    CudaModelOptions co;
    co.device = gpu;
    co.stream_grads_to_host = ps;  // the push reads the pinned mirror; copy it during backward
    model = CreateCudaModel(model_options, co);
    if (!model.ok()) return fail_job(model.status());
    device_name = "cuda:" + std::to_string(gpu) + " (" + CudaDeviceName(gpu) + ")";
#if GRADSYNC_HAVE_NCCL
    if (allreduce) {
      auto n = NcclCollective::Create(*ring, gpu);
      if (!n.ok()) return fail_job(n.status().WithContext("NCCL"));
      nccl = std::move(n).value();
    }
#endif
#endif
  }
  (*model)->Initialize(train.seed);

  std::optional<MetricsWriter> metrics;
  if (p.has_out()) {
    auto w = MetricsWriter::Open(p.out() + "/worker-" + std::to_string(rank) + ".csv",
                                 p.run().empty() ? mode_name : p.run(), rank);
    if (!w.ok()) {
      std::cerr << "gradsync-worker: error: " << w.status().message() << std::endl;
      return 1;
    }
    metrics.emplace(std::move(w).value());
  }

  std::printf("gradsync-worker %d: mode=%s model=%s params=%lld dataset=%s train=%lld test=%lld "
              "batch=%lld lr=%g (%s) momentum=%g%s weight_decay=%g epochs=%d seed=%llu threads=%d device=%s\n",
              rank, mode_name.c_str(), (*model)->name().c_str(), static_cast<long long>((*model)->num_params()),
              data_options.name.c_str(), static_cast<long long>(data->train.n),
              static_cast<long long>(data->test.n), static_cast<long long>(train.batch),
              train.lr.base, c.lr_schedule().c_str(), train.optimizer.momentum,
              train.optimizer.nesterov ? " (nesterov)" : "", train.optimizer.weight_decay,
              train.epochs, static_cast<unsigned long long>(train.seed), c.threads(), device_name.c_str());
  std::fflush(stdout);
  double best = -1.0;
  int best_epoch = 0;
  auto print_epoch = [&](const EpochReport& r) {
    if (std::isnan(r.test_accuracy)) return;  // only the evaluating worker prints epochs
    if (r.test_accuracy > best) best = r.test_accuracy, best_epoch = r.epoch;
    std::printf("epoch %2d/%d  train_loss %.4f  test_loss %.4f  test_acc %6.2f%%  samples/s %8.0f  "
                "elapsed %.1fs\n",
                r.epoch, train.epochs, r.train_loss, r.test_loss, 100.0 * r.test_accuracy,
                r.samples_per_s, r.wall_s);
    std::fflush(stdout);
  };
  // Large-batch rules: the rate grows with the global batch; a warm-up starts from --lr.
  {
    const int workers = joins ? table.workers_size() : 1;
    const float base_lr = train.lr.base;
    if (c.lr_scaling() == "linear") {
      train.lr.base = base_lr * static_cast<float>(workers * train.batch) / static_cast<float>(c.base_batch());
    }
    train.lr.warmup_start = base_lr;
    if (rank == 0 && train.lr.base != base_lr) {
      std::printf("gradsync-worker 0: learning rate %g (linear scaling of %g to a global batch of %lld)%s\n", train.lr.base,
                  base_lr, static_cast<long long>(workers * train.batch),
                  train.warmup_epochs > 0 ? (", warm-up over " + std::to_string(train.warmup_epochs) + " epochs").c_str() : "");
    }
  }
  Result<std::vector<EpochReport>> reports = std::vector<EpochReport>{};
  TrafficCounters traffic;  // bytes this worker moved for the job (PS client or ring)
  if (!joins) {
    LocalTrainer trainer(train, model->get(), &data->train, &data->test, metrics ? &*metrics : nullptr);
    reports = trainer.Run(print_epoch);
  } else if (allreduce) {
    AllreduceTrainOptions ao;
    ao.train = train;
    ao.bucket_bytes = static_cast<size_t>(c.bucket_mb() * 1e6);
    ao.overlap = c.overlap();
    ao.first_bucket_bytes = static_cast<size_t>(c.first_bucket_mb() * 1e6);
    ao.compression = compress == "none" ? "" : compress;
    ao.error_feedback = c.error_feedback();
    ao.correction_momentum = correction_momentum;
    ao.collective_timeout_s = c.collective_timeout();
    if (c.has_checkpoint_dir()) {
      ao.checkpoint_dir = c.checkpoint_dir();
      std::error_code ec;
      std::filesystem::create_directories(ao.checkpoint_dir, ec);
      ao.checkpoint_every = c.checkpoint_every();
      ao.resume = c.resume();
    }
#if GRADSYNC_HAVE_NCCL
    ao.device_collective = nccl.get();
#endif
    AllreduceTrainer trainer(ao, model->get(), &data->train, &data->test, metrics ? &*metrics : nullptr, ring.get());
    reports = trainer.Run(print_epoch);
    traffic.bytes_sent = ring->bytes_sent();
    traffic.bytes_received = ring->bytes_received();
    if (reports.ok()) {
      std::printf("worker %d: %llu bytes sent, %llu received over the ring\n", rank,
                  static_cast<unsigned long long>(ring->bytes_sent()),
                  static_cast<unsigned long long>(ring->bytes_received()));
#if GRADSYNC_HAVE_NCCL
      if (nccl) {
        std::printf("worker %d: NCCL all-reduced %llu gradient bytes (its own transport; the ring bytes above are the bootstrap's)\n",
                    rank, static_cast<unsigned long long>(nccl->elements_reduced() * sizeof(float)));
      }
#endif
    }
    scheduler->Finished(reports.ok() ? OkStatus() : reports.status());
    scheduler->Flush(2.0);
  } else {
    auto client = PsClient::Create(ctx, table, rank, (*model)->layout(), scheduler.get());
    if (!client.ok()) {
      reports = client.status();
    } else {
      PsTrainOptions po;
      po.train = train;
      po.rank = rank;
      po.num_workers = table.workers_size();
      po.request_timeout_s = c.request_timeout();
      po.recovery_timeout_s = c.recovery_timeout();
      po.compression = compress == "none" ? "" : compress;
      po.error_feedback = c.error_feedback();
      po.correction_momentum = correction_momentum;
      po.compress_pull = c.compress_pull();
      po.staleness_aware_lr = c.staleness_aware_lr();
      po.overlap = c.overlap();
      po.push_part_floats = static_cast<size_t>(std::max(1.0, c.push_part_mb() * 1e6 / sizeof(float)));
      PsTrainer trainer(po, model->get(), &data->train, &data->test, metrics ? &*metrics : nullptr, client->get(),
                        scheduler.get());
      reports = trainer.Run(print_epoch);
      traffic = (*client)->traffic();
      if (reports.ok()) {
        auto t = (*client)->traffic();
        std::printf("worker %d: %lld bytes sent, %lld received, %lld malformed replies\n", rank,
                    static_cast<long long>(t.bytes_sent), static_cast<long long>(t.bytes_received),
                    static_cast<long long>(t.malformed_received));
      }
    }
    scheduler->Finished(reports.ok() ? OkStatus() : reports.status());
    scheduler->Flush(2.0);
  }
  if (p.has_out()) {
    // DIR/worker-<rank>.json: what the report reads about this worker (never its log).
    summary::ProcessSummary s;
    s.set_role("worker");
    s.set_rank(rank);
    s.set_mode(mode_name);
    if (mode == config::SSP) s.set_staleness_bound(table.staleness());  // the job's (given or taken)
    s.set_ok(reports.ok());
    if (!reports.ok()) s.set_error(reports.status().message());
    s.set_params((*model)->num_params());
    if (reports.ok() && !reports->empty()) {
      s.set_steps(reports->back().steps);
      s.set_wall_s(reports->back().wall_s);
      if (best >= 0) s.set_final_test_accuracy(reports->back().test_accuracy);
    }
    s.set_bytes_sent(static_cast<int64_t>(traffic.bytes_sent));
    s.set_bytes_received(static_cast<int64_t>(traffic.bytes_received));
    if (Status w = WriteProcessSummary(p.out(), s); !w.ok()) {
      std::cerr << "gradsync-worker: warning: summary not written: " << w.message() << std::endl;
    }
  }
  if (!reports.ok()) {
    std::cerr << "gradsync-worker: error: " << reports.status().message() << std::endl;
    return 1;
  }
  if (!reports->empty() && best >= 0) {
    std::printf("final test_acc %.2f%% (best %.2f%% at epoch %d), %lld steps, %.1fs\n",
                100.0 * reports->back().test_accuracy, 100.0 * best, best_epoch,
                static_cast<long long>(reports->back().steps), reports->back().wall_s);
  }
  return 0;
}

}  // namespace gradsync
