// Test support: a whole parameter-server job inside one process (scheduler, servers and workers
// as threads, talking ZeroMQ over 127.0.0.1 with ephemeral ports), bounded in time.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/base/status.h"
#include "common/data/dataset.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/net/security.h"
#include "models/model.h"
#include "server/scheduler/scheduler.h"
#include "server/server.h"
#include "worker/allreduce/allreduce_sync.h"
#include "worker/loop/local_trainer.h"

namespace gradsync::testing {

struct PsJobOptions {
  ConsistencyMode mode = ConsistencyMode::kBsp;
  int staleness = 0;
  int num_servers = 2;
  int num_workers = 2;
  ModelOptions model;
  LocalTrainOptions train;          // per-worker batch, max_steps, optimizer, lr...
  uint64_t init_seed = 0;
  // Extra delay before worker w's compute in step c (stragglers); may be empty.
  std::function<double(int worker, int64_t step)> delay_ms;
  double heartbeat_timeout_s = 5.0;
  double timeout_s = 120.0;
  // Stops server `kill_server` (it goes silent, as if killed) `kill_after_s` after the workers
  // passed the "init" barrier; -1: none.
  int kill_server = -1;
  double kill_after_s = 0;
  std::string compression;  // push codec ("" = raw floats)
  bool error_feedback = false;
  float correction_momentum = 0;  // DGC on the workers
  bool compress_pull = false;
  bool staleness_aware_lr = false;
  float delay_compensation = NAN;  // PsTrainOptions' (NaN: off)
  bool delay_compensation_adaptive = false;
  bool overlap = false;                    // PsTrainOptions::overlap.enabled
  // Each step's own rate, pushed with its gradient (PsTrainOptions::loop.step_lr); empty: none.
  std::function<float(int64_t step)> step_lr;
  size_t push_part_floats = size_t{1} << 20;
  bool shm = true;  // PsTrainOptions::channels.shm: values through shared-memory lanes (every shard is local)
  bool data_channel = true;     // PsTrainOptions::channels.data_channel (shards without a lane)
  size_t data_min_floats = size_t{1} << 20;
  int64_t drop_data_channel_after_pulls = 0;  // ServerOptions' (every server)
  int64_t drop_data_channel_after_pushes = 0;  // ServerOptions' (every server)
  // CURVE on every socket of the job (common/net/security.h); unset: plaintext.
  std::optional<Security> security;
  // The workers' models are FakeDeviceModels (the trainers' --device=cuda path, on the CPU).
  bool fake_device = false;
  // Runs on its own thread once every worker passed the "init" barrier; gets the server ports.
  std::function<void(const std::vector<uint16_t>& server_ports)> side_task;
};

struct PsJobResult {
  Status status;                       // the first failure, if any
  std::vector<float> params;           // all shards' parameters, concatenated
  std::vector<std::vector<wire::TableRowsCheckpoint>> table_rows;  // per server, its tables' rows
  std::vector<std::vector<PullRecord>> pulls;  // per server
  std::vector<ServerStats> server_stats;
  std::vector<int64_t> compensated_pushes, uncompensated_pushes;  // per server (delay compensation)
  std::vector<double> relative_correction;                        // per server (delay compensation)
  double kill_to_failure_s = -1;  // from the kill to the first worker failure
  int64_t auth_refused = 0;       // CURVE handshakes refused (security set)
};

PsJobResult RunPsJob(const PsJobOptions& options, const Dataset& train, const Dataset& test);

// n allreduce workers as threads with their own rings over 127.0.0.1; rank 0's parameters after
// training (every rank must end with the same bits, or this fails).
Result<std::vector<float>> RunAllreduceJob(int n, const ModelOptions& model, const LocalTrainOptions& train,
                                           const Dataset& data, size_t bucket_bytes,
                                           const std::string& compression = "", bool error_feedback = false,
                                           float correction_momentum = 0, bool fake_device = false);

// RunAllreduceJob with every all-reduce setting (`base`'s train, evaluate and device collective
// are replaced), the collective's algorithm, and what each rank measured.
struct AllreduceJobResult {
  std::vector<float> params;               // rank 0's (every rank's, checked)
  std::vector<size_t> optimizer_state_bytes;  // per rank
  std::vector<uint64_t> bytes_sent;           // per rank, the whole run
};
Result<AllreduceJobResult> RunAllreduceJobWith(int n, const ModelOptions& model, const LocalTrainOptions& train,
                                               const Dataset& data, const AllreduceTrainOptions& base,
                                               bool fake_device = false, AllReduceAlgo algorithm = AllReduceAlgo::kAuto);

// Local SGD with the same settings (the reference): returns the parameters after training.
std::vector<float> RunLocal(const ModelOptions& model, const LocalTrainOptions& train, uint64_t init_seed,
                            const Dataset& data, bool fake_device = false);

// Summing the same gradients in two exact orders (one batch of B, or B made of micro-batches of
// `micro`) differs by rounding, which training then amplifies; by how much depends on this CPU's
// BLAS kernels (with FMA or without). SummationNoise measures it: the largest relative difference
// (floor 1e-3) between the two local runs of `train`. EquivalenceTolerance is what an "equals
// local SGD with the global batch" test allows: `base` (1e-5), or 10x the noise on a CPU whose
// rounding alone is larger, so such a test asserts the semantics on every CPU, and a wrong
// learning rate, lost gradient or stale version (differences of 1e-2 and more) still fails it.
// Never more than kMaxEquivalenceTolerance, 10x under those: a CPU noisier than that fails.
constexpr double kMaxEquivalenceTolerance = 1e-3;
double SummationNoise(const ModelOptions& model, LocalTrainOptions train, int64_t micro, const Dataset& data);
double EquivalenceTolerance(double noise, double base = 1e-5);

// What the equivalence tests train, and how: Gaussian blobs of 12 features (`classes` classes,
// centers 0.8 apart), and an MLP 12-16-4 for them.
Dataset SmallBlobs(int64_t n = 1600, int classes = 4);
ModelOptions SmallMlp();
// `steps` steps of `batch` (seed 5), SGD with `momentum` and weight decay 1e-4, rate 0.05
// decaying to 0 (cosine) over the run.
LocalTrainOptions SmallTrain(int64_t batch, int64_t steps, float momentum);

// CreateModel, or a FakeDeviceModel (tests/support/fake_device.h) when fake_device.
std::unique_ptr<Model> MakeTestModel(const ModelOptions& options, bool fake_device);

// A scheduler client on 127.0.0.1 for the tests that play a node themselves: `role` asking for
// `rank`, in `mode` ("bsp", "ssp" with `staleness`, ...), heartbeats every 0.2 s.
SchedulerClientOptions LoopbackClient(const std::string& endpoint, wire::Role role, int rank, const std::string& mode,
                                      int staleness = 0);

// The INIT of a job of one dense tensor "w" of `params` floats, `workers` workers, plain SGD at
// a constant `lr`: the job the OneShardJob tests drive.
wire::JobConfig OneTensorJob(int64_t params, int workers, float lr);

// One shard (a scheduler and a server, each on a thread of its own; bsp unless `mode` says
// otherwise, with `staleness` for ssp) and two workers' scheduler clients, for the tests that
// drive workers step by step (PsClients, raw messages): Start registers both workers;
// InitBarrier and Finish pass the workers' "init" and "trained" barriers together (Finish also
// ends the job: the threads are joined, and the server's or the scheduler's failure is
// returned).
class OneShardJob {
 public:
  explicit OneShardJob(TransportContext& ctx, ConsistencyMode mode = ConsistencyMode::kBsp, int staleness = 0)
      : ctx_(ctx), mode_(mode), staleness_(staleness) {}
  ~OneShardJob();
  OneShardJob(const OneShardJob&) = delete;
  OneShardJob& operator=(const OneShardJob&) = delete;

  Status Start();
  Status InitBarrier();
  Status Finish();
  const wire::ClusterTable& table() const { return table_; }
  Server& server() { return *server_; }
  SchedulerClient& worker(int w) { return *workers_[static_cast<size_t>(w)]; }

 private:
  // Both workers at `name` at once (worker 1 on a thread of its own).
  Status BothAt(const std::string& name);

  TransportContext& ctx_;
  ConsistencyMode mode_;
  int staleness_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Server> server_;
  std::vector<std::unique_ptr<SchedulerClient>> workers_;
  wire::ClusterTable table_;
  std::thread scheduler_thread_, server_thread_;
  Status scheduler_ran_, server_ran_;  // what their Run returned
};

}  // namespace gradsync::testing
