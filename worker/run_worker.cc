#include "worker/run_worker.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "common/base/atomic_file.h"
#include "common/base/logging.h"
#include "common/base/numeric/blas_threads.h"
#include "common/data/dataset_cache.h"
#include "common/obs/metrics.h"
#include "common/obs/process_summary.h"
#include "common/obs/trace.h"
#include "gradsync/config.h"
#include "models/model.h"
#include "worker/job_link.h"
#include "worker/job_trainer.h"
#include "worker/loop/data_source.h"
#include "worker/loop/local_trainer.h"
#include "worker/ps/client/ps_client.h"
#include "worker/train_options.h"
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
  o.precision = *ParsePrecision(c.precision());  // Validate() checked it
  if (o.name == "dlrm") {
    o.dlrm.num_dense = c.click_dense();
    o.dlrm.num_tables = c.click_features();
    o.dlrm.dim = c.table_dim();
    o.dlrm.ids_per_table = static_cast<uint64_t>(c.click_ids());
    o.dlrm.max_rows_per_shard = c.table_rows();
    o.dlrm.optimizer.kind = *ParseRowOptimizerKind(c.table_optimizer());  // Validate() checked it
  }
  if (o.name == "mlp") o.hidden = *ParseIntList(c.hidden(), 1, 1 << 20);  // Validate() parsed it
  return o;
}

DataOptions DataOptionsFrom(const TrainConfig& c) {
  DataOptions o;
  o.name = EffectiveDataset(c);
  o.dir = c.data_dir();
  o.cache_dir = !c.has_data_cache() ? DefaultDataCacheDir() : c.data_cache() == "off" ? "" : c.data_cache();
  o.standardize = c.standardize();
  o.feature_bits = c.feature_bits();
  o.seed = c.seed();
  o.click.num_categorical = c.click_features();
  o.click.num_dense = c.click_dense();
  o.click.ids_per_feature = {c.click_ids() == 0 ? int64_t{1} << 62 : c.click_ids()};
  o.click.zipf_s = c.click_zipf();
  o.click.planted_scale = c.click_planted();
  o.click_train = c.click_train();
  o.click_test = c.click_test();
  return o;
}

// Fails the job (so that the scheduler hears of it) with one line; the exit code.
int Fail(JobLink* job, const Status& s) {
  std::cerr << "gradsync-worker: error: " << s.message() << std::endl;
  job->Finished(s);
  return 1;
}

// The model on its device, and (CUDA all-reduce) the NCCL collective over the ring.
struct PlacedModel {
  std::unique_ptr<Model> model;
  std::string device_name = "cpu";
#if GRADSYNC_HAVE_NCCL
  std::unique_ptr<NcclCollective> nccl;
#endif
};

// Builds the model for the loaded data on --device. 0 when built, else the exit code.
int PlaceModel(const TrainConfig& c, const config::WorkerProcess& p, const FlagParser& flags, const Dataset& train,
               JobLink* job, PlacedModel* out) {
  ModelOptions model_options = ModelOptionsFrom(c);
  if (c.model() != "sparse_logreg") {
    model_options.input_dim = train.dim;
    model_options.num_classes = train.num_classes;
  }
  if (c.device() != "cuda") {
    auto model = CreateModel(model_options);
    if (!model.ok()) flags.Fail(model.status().message());
    out->model = std::move(model).value();
    return 0;
  }
#if GRADSYNC_HAVE_CUDA
  const bool allreduce = c.mode() == config::ALLREDUCE;
  if (Status s = DenseModelDims(model_options).status(); !s.ok()) flags.Fail(s.message());
  const int devices = CudaDeviceCount();
  if (devices == 0) return Fail(job, FailedPreconditionError("--device=cuda: no CUDA device is visible"));
  // The launcher's rank on this host picks the GPU when it gave one (a job across hosts), else
  // the job's rank.
  const bool local = p.local_rank() >= 0;
  const int gpu = c.gpu() >= 0 ? c.gpu() : (local ? p.local_rank() : job->rank) % devices;
  if (allreduce && local && p.local_rank() >= devices && !c.has_gpu()) {
    return Fail(job, FailedPreconditionError("--device=cuda --mode=allreduce runs one NCCL rank per GPU: this process is "
                                             "local rank " + std::to_string(p.local_rank()) + " on its host, " +
                                             std::to_string(devices) + " GPUs visible"));
  }
  if (allreduce && !local && job->table.workers_size() > devices && !c.has_gpu()) {
    return Fail(job, FailedPreconditionError("--device=cuda --mode=allreduce runs one NCCL rank per GPU: " +
                                             std::to_string(job->table.workers_size()) + " workers, " +
                                             std::to_string(devices) + " GPUs visible"));
  }
  CudaModelOptions co;
  co.device = gpu;
  co.stream_grads_to_host = IsPsMode(c.mode());  // the push reads the pinned mirror; copy it during backward
  auto model = CreateCudaModel(model_options, co);
  if (!model.ok()) return Fail(job, model.status());
  out->model = std::move(model).value();
  out->device_name = "cuda:" + std::to_string(gpu) + " (" + CudaDeviceName(gpu) + ")";
#if GRADSYNC_HAVE_NCCL
  if (allreduce) {
    auto n = NcclCollective::Create(*job->ring, gpu);
    if (!n.ok()) return Fail(job, n.status().WithContext("NCCL"));
    out->nccl = std::move(n).value();
  }
#endif
  return 0;
#else
  (void)flags;
  (void)p;
  return Fail(job, FailedPreconditionError("--device=cuda: this gradsync-worker was built without CUDA"));
#endif
}

// Large-batch rules: the rate grows with the global batch; a warm-up starts from --lr.
void ScaleLearningRate(const TrainConfig& c, int workers, int rank, LocalTrainOptions* train) {
  const float base_lr = train->lr.base;
  if (c.lr_scaling() == "linear") {
    train->lr.base = base_lr * static_cast<float>(workers * train->batch) / static_cast<float>(c.base_batch());
  }
  train->lr.warmup_start = base_lr;
  if (rank == 0 && train->lr.base != base_lr) {
    std::printf("gradsync-worker 0: learning rate %g (linear scaling of %g to a global batch of %lld)%s\n",
                train->lr.base, base_lr, static_cast<long long>(workers * train->batch),
                train->warmup_epochs > 0
                    ? (", warm-up over " + std::to_string(train->warmup_epochs) + " epochs").c_str()
                    : "");
  }
}

// What training gives back: the epoch reports, and the bytes this worker moved for the job.
struct Trained {
  Result<std::vector<EpochReport>> reports = std::vector<EpochReport>{};
  TrafficCounters traffic;
  uint64_t shm_bytes_sent = 0;  // through shared memory (not in traffic)
  uint64_t shm_bytes_received = 0;
  PsClient::ReplyCounts counts;  // PS modes
};

// Runs the trainer of the mode, and tells the scheduler how it ended.
Trained Train(const TrainConfig& c, const LocalTrainOptions& train, const TrainTest& data, PlacedModel& placed,
              MetricsWriter* metrics, JobLink* job, const std::function<void(const EpochReport&)>& on_epoch) {
  Trained out;
  Model* model = placed.model.get();
  if (!JoinsJob(c.mode())) {
    LocalTrainer trainer(train, model, &data.train, &data.test, metrics);
    out.reports = trainer.Run(on_epoch);
    return out;
  }
  if (c.mode() == config::ALLREDUCE) {
    AllreduceTrainOptions ao = AllreduceOptionsFrom(c, train, job->oversubscribed);
    if (c.has_checkpoint_dir()) {
      ao.checkpoint = CheckpointOptionsFrom(c);
      // A failure to create it shows where the first checkpoint is written (one line, the step goes on).
      (void)CreatePrivateDirectory(ao.checkpoint.dir);
    }
#if GRADSYNC_HAVE_NCCL
    ao.device_collective = placed.nccl.get();
#endif
    AllreduceTrainer trainer(ao, model, &data.train, &data.test, metrics, job->ring.get());
    out.reports = trainer.Run(on_epoch);
    out.traffic.bytes_sent = job->ring->bytes_sent();
    out.traffic.bytes_received = job->ring->bytes_received();
    out.shm_bytes_sent = job->ring->shm_bytes_sent();
    out.shm_bytes_received = job->ring->shm_bytes_received();
    if (out.reports.ok()) {
      std::printf("worker %d: %llu bytes sent, %llu received over the ring\n", job->rank,
                  static_cast<unsigned long long>(out.traffic.bytes_sent),
                  static_cast<unsigned long long>(out.traffic.bytes_received));
      if (out.shm_bytes_sent + out.shm_bytes_received > 0) {
        std::printf("worker %d: and %llu bytes sent, %llu received through shared memory (as the wire would count them)\n",
                    job->rank, static_cast<unsigned long long>(out.shm_bytes_sent),
                    static_cast<unsigned long long>(out.shm_bytes_received));
      }
#if GRADSYNC_HAVE_NCCL
      if (placed.nccl) {
        std::printf("worker %d: NCCL all-reduced %llu gradient bytes (its own transport; the ring bytes above are the bootstrap's)\n",
                    job->rank, static_cast<unsigned long long>(placed.nccl->elements_reduced() * sizeof(float)));
      }
#endif
    }
  } else {
    // A step's table rows to one shard at most: every example's id of every table, with its key.
    int64_t row_bytes = 0;
    const int64_t examples = std::max<int64_t>(train.batch, train.report.eval_batch);  // a step, an evaluation batch
    for (const TableSpec& t : model->tables()) row_bytes += examples * (int64_t{t.dim} * 4 + 8);
    auto client = PsClient::Create(job->ctx, job->table, job->rank, model->layout(), job->scheduler.get(), row_bytes);
    if (!client.ok()) {
      out.reports = client.status();
    } else {
      const PsTrainOptions po = PsOptionsFrom(c, train, job->rank, job->table.workers_size(), job->oversubscribed);
      PsTrainer trainer(po, model, &data.train, &data.test, metrics, client->get(), job->scheduler.get());
      out.reports = trainer.Run(on_epoch);
      out.traffic = (*client)->traffic();
      const WorkerChannels& channels = (*client)->channels();
      const ChannelBytes lanes = channels.bytes(wire::CHANNEL_LANE), dcs = channels.bytes(wire::CHANNEL_DATA);
      out.shm_bytes_sent = lanes.pushed;
      out.shm_bytes_received = lanes.pulled;
      out.counts = (*client)->replies().counts();
      if (out.reports.ok()) {
        std::printf("worker %d: %lld bytes sent, %lld received, %lld malformed replies\n", job->rank,
                    static_cast<long long>(out.traffic.bytes_sent), static_cast<long long>(out.traffic.bytes_received),
                    static_cast<long long>(out.traffic.malformed_received));
        if (channels.count(wire::CHANNEL_LANE) > 0) {
          std::printf("worker %d: %llu value bytes pushed and %llu pulled through shared memory (not in the bytes above)\n",
                      job->rank, static_cast<unsigned long long>(lanes.pushed),
                      static_cast<unsigned long long>(lanes.pulled));
        }
        if (channels.count(wire::CHANNEL_DATA) > 0) {
          std::printf("worker %d: of these, %llu value bytes pushed and %llu pulled over data channels\n", job->rank,
                      static_cast<unsigned long long>(dcs.pushed), static_cast<unsigned long long>(dcs.pulled));
        }
      }
    }
  }
  job->Finished(out.reports.ok() ? OkStatus() : out.reports.status());
  return out;
}

// DIR/worker-<rank>.json: what the report reads about this worker (never its log).
void WriteWorkerSummary(const TrainConfig& c, const config::WorkerProcess& p, const JobLink& job, const Model& model,
                        const Trained& trained, bool evaluated) {
  summary::ProcessSummary s;
  s.set_role("worker");
  s.set_rank(job.rank);
  s.set_mode(ModeName(c.mode()));
  if (c.mode() == config::SSP) s.set_staleness_bound(job.table.staleness());  // the job's (given or taken)
  s.set_ok(trained.reports.ok());
  if (!trained.reports.ok()) s.set_error(trained.reports.status().message());
  s.set_params(model.num_params());
  s.set_peak_rss_mib(PeakRssMib());
  if (trained.reports.ok() && !trained.reports->empty()) {
    s.set_steps(trained.reports->back().steps);
    s.set_wall_s(trained.reports->back().wall_s);
    if (evaluated) s.set_final_test_accuracy(trained.reports->back().test_accuracy);
    if (evaluated && !std::isnan(trained.reports->back().test_auc)) s.set_final_test_auc(trained.reports->back().test_auc);
    SetRowReads(trained.reports->back().row_reads, &s);
  }
  s.set_bytes_sent(static_cast<int64_t>(trained.traffic.bytes_sent));
  s.set_bytes_received(static_cast<int64_t>(trained.traffic.bytes_received));
  s.set_shm_bytes_sent(static_cast<int64_t>(trained.shm_bytes_sent));
  s.set_shm_bytes_received(static_cast<int64_t>(trained.shm_bytes_received));
  SetReplyCounts(trained.counts, &s);
  if (Status w = WriteProcessSummary(p.out(), s); !w.ok()) {
    std::cerr << "gradsync-worker: warning: summary not written: " << w.message() << std::endl;
  }
}

// The worker's settings, in one line: what it trains, on what, and how.
void PrintSetup(const TrainConfig& c, const LocalTrainOptions& train, int rank, const DataOptions& data_options,
                const TrainTest& data, const PlacedModel& placed) {
  const std::string& mode_name = ModeName(c.mode());
  const OptimizerOptions& opt = train.optimizer;
  char opt_text[128];
  if (opt.kind == OptimizerKind::kAdam || opt.kind == OptimizerKind::kLamb) {
    std::snprintf(opt_text, sizeof(opt_text), "%s beta1=%g beta2=%g eps=%g", OptimizerKindName(opt.kind), opt.beta1, opt.beta2,
                  opt.eps);
  } else if (opt.kind == OptimizerKind::kLars) {
    std::snprintf(opt_text, sizeof(opt_text), "lars momentum=%g trust_coefficient=%g", opt.momentum, opt.trust_coefficient);
  } else {
    std::snprintf(opt_text, sizeof(opt_text), "sgd momentum=%g%s", opt.momentum, opt.nesterov ? " (nesterov)" : "");
  }
  std::printf("gradsync-worker %d: mode=%s model=%s params=%lld dataset=%s train=%lld test=%lld "
              "batch=%lld lr=%g (%s) optimizer=%s weight_decay=%g epochs=%d seed=%llu threads=%d device=%s precision=%s\n",
              rank, mode_name.c_str(), placed.model->name().c_str(),
              static_cast<long long>(placed.model->num_params()), data_options.name.c_str(),
              static_cast<long long>(data.train.n), static_cast<long long>(data.test.n),
              static_cast<long long>(train.batch), train.lr.base, c.lr_schedule().c_str(), opt_text,
              opt.weight_decay, train.epochs, static_cast<unsigned long long>(train.seed), c.threads(),
              placed.device_name.c_str(), PrecisionName(train.numerics.precision));
  if (data.oracle) {
    std::printf("gradsync-worker %d: click-log test set: the planted model's AUC %.4f and log loss %.4f are the best "
                "any model can reach; positive rate %.3f\n",
                rank, data.oracle->auc, data.oracle->log_loss, data.oracle->positive_rate);
  }
  if (!placed.model->tables().empty()) {
    const TableSpec& t = placed.model->tables()[0];
    std::printf("gradsync-worker %d: %zu embedding tables of %s ids x %d floats, %s rows, at most %lld rows per %s\n",
                rank, placed.model->tables().size(),
                t.num_ids == 0 ? "any 64-bit" : std::to_string(t.num_ids).c_str(), t.dim,
                RowOptimizerKindName(t.optimizer.kind), static_cast<long long>(t.max_rows_per_shard),
                IsPsMode(c.mode()) ? "server" : "process");
  }
  if (train.periodic.every > 0) {
    std::printf("gradsync-worker %d: %s: rounds of %lld local steps, then the pseudo-gradients (global minus own "
                "model) exchanged and the outer SGD applied to their mean\n",
                rank, OuterName(c).c_str(), static_cast<long long>(train.periodic.every));
  }
  std::fflush(stdout);
}

// Writes the trace (--trace), with the clock offset against the scheduler refined over the run.
void StopTrace(const config::WorkerProcess& p, JobLink& job) {
  if (job.scheduler) {  // the best estimate of the whole run
    job.scheduler->clock().Estimate(SchedulerClient::kClockProbes, 0.5);
    Trace::RefineClockOffset(job.scheduler->clock().offset_us(), job.scheduler->clock().rtt_us() / 2);
  }
  size_t events = 0;
  Stopwatch writing;
  if (Status t = Trace::Stop(&events); !t.ok()) {
    std::fprintf(stderr, "gradsync-worker %d: the trace was not written: %s\n", job.rank, t.message().c_str());
  } else {
    std::printf("gradsync-worker %d: trace: %zu events in %s (written in %.0f ms)\n", job.rank, events,
                p.trace().c_str(), writing.Millis());
  }
}

}  // namespace

int RunWorker(const TrainConfig& c, const config::WorkerProcess& p, const FlagParser& flags) {
  const std::string& mode_name = ModeName(c.mode());
  const DataOptions data_options = DataOptionsFrom(c);
  LocalTrainOptions train = TrainOptionsFrom(c);
  SetBlasThreads(c.threads());

  // Parameter-server modes register first: the scheduler assigns the rank that picks the shard.
  JobLink job;
  if (Status s = JoinJob(c, p, &job); !s.ok()) {
    std::cerr << "gradsync-worker: error: " << s.message() << std::endl;
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  // The trace starts once the rank and the clock offset against the scheduler are known; it is
  // written however this function returns.
  TraceStopper trace_stopper;
  if (p.has_trace()) {
    const double offset = job.scheduler ? job.scheduler->clock().offset_us() : 0;
    if (Status t = Trace::Start(p.trace(), "worker", job.rank, offset); !t.ok()) return Fail(&job, t);
    if (job.scheduler && job.scheduler->rejoined()) TraceInstant("rejoined the job", "failure");
  }
  if (c.mode() == config::SSP && !c.has_staleness()) {
    std::printf("gradsync-worker %d: staleness bound %d, the job's (no --staleness given)\n", job.rank,
                job.table.staleness());
  }
  auto data = LoadTrainTest(data_options);
  if (!data.ok()) return Fail(&job, data.status());
  PlacedModel placed;
  if (int code = PlaceModel(c, p, flags, data->train, &job, &placed); code != 0) return code;
  placed.model->Initialize(train.seed);

  std::optional<MetricsWriter> metrics;
  if (p.has_out()) {
    auto w = MetricsWriter::Open(p.out() + "/worker-" + std::to_string(job.rank) + ".csv",
                                 p.run().empty() ? mode_name : p.run(), job.rank);
    if (!w.ok()) return Fail(&job, w.status());
    metrics.emplace(std::move(w).value());
  }

  PrintSetup(c, train, job.rank, data_options, *data, placed);
  double best = -1.0;
  int best_epoch = 0;
  auto print_epoch = [&](const EpochReport& r) {
    if (std::isnan(r.test_accuracy)) return;  // only the evaluating worker prints epochs
    if (r.test_accuracy > best) best = r.test_accuracy, best_epoch = r.epoch;
    const std::string auc = std::isnan(r.test_auc) ? "" : "  test_auc " + std::to_string(r.test_auc).substr(0, 6);
    std::printf("epoch %2d/%d  train_loss %.4f  test_loss %.4f  test_acc %6.2f%%%s  samples/s %8.0f  "
                "elapsed %.1fs\n",
                r.epoch, train.epochs, r.train_loss, r.test_loss, 100.0 * r.test_accuracy, auc.c_str(),
                r.samples_per_s, r.wall_s);
    std::fflush(stdout);
  };
  ScaleLearningRate(c, JoinsJob(c.mode()) ? job.table.workers_size() : 1, job.rank, &train);
  const Trained trained = Train(c, train, *data, placed, metrics ? &*metrics : nullptr, &job, print_epoch);
  if (p.has_trace()) StopTrace(p, job);
  if (p.has_out()) WriteWorkerSummary(c, p, job, *placed.model, trained, best >= 0);
  if (!trained.reports.ok()) {
    std::cerr << "gradsync-worker: error: " << trained.reports.status().message() << std::endl;
    return 1;
  }
  const auto& reports = *trained.reports;
  if (!reports.empty() && best >= 0) {
    std::printf("final test_acc %.2f%% (best %.2f%% at epoch %d), %lld steps, %.1fs\n",
                100.0 * reports.back().test_accuracy, 100.0 * best, best_epoch,
                static_cast<long long>(reports.back().steps), reports.back().wall_s);
  }
  return 0;
}

}  // namespace gradsync
