// gradsync-worker: trains a model. --mode=local trains in this one process; the parameter
// server (bsp|ssp|asp) and all-reduce modes join a job through --scheduler.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "common/flags.h"
#include "common/security.h"
#include "common/transport.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/process_summary.h"
#include "models/model.h"
#include "common/cluster.h"
#include "common/scheduler_client.h"
#include "allreduce/tcp_ring.h"
#include "compression/compressor.h"
#include "worker/allreduce_trainer.h"
#include "worker/data_source.h"
#include "worker/local_trainer.h"
#include "worker/ps_client.h"
#include "worker/ps_trainer.h"
#include "gradsync/config.h"
#if GRADSYNC_HAVE_CUDA
#include "models/cuda/cuda_model.h"
#endif
#if GRADSYNC_HAVE_NCCL
#include "allreduce/nccl/nccl_allreduce.h"
#endif

namespace gradsync {
namespace {

int Main(int argc, char** argv) {
  FlagParser flags("gradsync-worker",
                   "Trains a model on one process (--mode=local). Prints per-epoch loss, test "
                   "accuracy and samples/s;\n--out=DIR writes DIR/worker-0.csv.");
  flags.options().add_options()
      ("mode", po::value<std::string>()->default_value("local"), "local|bsp|ssp|asp|allreduce (all but local join a job through --scheduler)")
      ("bind", po::value<std::string>()->default_value("127.0.0.1"), "allreduce: address the ring listens on")
      ("compress", po::value<std::string>()->default_value("none"), "gradient codec: none|fp16|int8|qsgd:LEVELS|sign|topk:RATIO|randomk:RATIO")
      ("error-feedback", po::bool_switch(), "keep the compression residual and add it to the next gradient")
      ("compress-pull", po::bool_switch(), "PS modes: servers reply to pulls with the --compress'ed parameter delta since the worker's last pull (the residual stays on the server)")
      ("momentum-correction", po::bool_switch(), "DGC momentum correction with --momentum on the workers (top-k/random-k); the update itself is then plain SGD")
      ("bucket-mb", po::value<double>()->default_value(25.0), "allreduce: gradient bucket size in MB")
      ("overlap", po::value<bool>()->default_value(true), "overlap communication with backward and forward (dense CPU models, uncompressed; true|false). allreduce: all-reduce each bucket as soon as backward produced it, on a communication thread; bsp|ssp|asp: push each tensor (in parts of --push-part-mb) as soon as backward produced it, pull per tensor in forward order and start each layer when its parameters are in")
      ("push-part-mb", po::value<double>()->default_value(4.0), "bsp|ssp|asp with --overlap: the largest part of a tensor pushed or pulled in one message, in MB")
      ("first-bucket-mb", po::value<double>()->default_value(1.0), "allreduce: size of the first (last-layer) bucket in MB, so that communication starts early")
      ("collective-timeout", po::value<double>()->default_value(60.0), "allreduce: seconds an all-reduce may take before the job fails")
      ("checkpoint-dir", po::value<std::string>(), "allreduce: rank 0 checkpoints parameters, momentum and step to DIR/allreduce.ckpt")
      ("checkpoint-every", po::value<int64_t>()->default_value(100), "allreduce: steps between checkpoints")
      ("resume", po::bool_switch(), "allreduce: every rank starts from DIR/allreduce.ckpt (after a failed run)")
      ("scheduler", po::value<std::string>(), "bsp|ssp|asp: the scheduler's HOST:PORT")
      ("auth-dir", po::value<std::string>(), "authenticate and encrypt every socket with CURVE, using the keys gradsync-keygen wrote in DIR")
      ("staleness", po::value<int>()->default_value(0), "ssp staleness bound s >= 0 (must match the servers)")
      ("rank", po::value<int>()->default_value(-1), "requested worker rank (default: SLURM_PROCID, else assigned)")
      ("host", po::value<std::string>()->default_value("127.0.0.1"), "address this worker advertises")
      ("heartbeat-interval", po::value<double>()->default_value(1.0), "seconds between heartbeats")
      ("heartbeat-timeout", po::value<double>()->default_value(10.0), "seconds without the scheduler before giving up")
      ("request-timeout", po::value<double>()->default_value(120.0), "seconds a push or pull may take (dead servers fail faster)")
      ("recovery-timeout", po::value<double>()->default_value(60.0), "PS modes: seconds to wait for a dead server to come back from its checkpoint before failing (0: fail at once)")
      ("device", po::value<std::string>()->default_value("cpu"), "cpu|cuda: where the model computes (cuda: softmax|mlp; PS modes copy through pinned host buffers, allreduce runs NCCL on the device)")
      ("gpu", po::value<int>()->default_value(-1), "--device=cuda: CUDA device index (default: rank modulo the visible devices; PS workers may share one)")
      ("model", po::value<std::string>()->default_value("mlp"), kModelNames)
      ("hidden", po::value<std::string>()->default_value("256,128"), "mlp hidden layer sizes, comma-separated")
      ("dataset", po::value<std::string>(), "fashion-mnist|blobs|sparse-logistic (default: fashion-mnist; sparse-logistic for sparse_logreg)")
      ("data-dir", po::value<std::string>()->default_value(""), "directory of the Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)")
      ("standardize", po::value<bool>()->default_value(true), "standardize Fashion-MNIST pixels: (x - 0.2860) / 0.3530 (true|false)")
      ("feature-bits", po::value<int>()->default_value(20), "sparse_logreg: 2^bits hashed features")
      ("lr", po::value<float>()->default_value(0.02f), "learning rate")
      ("lr-schedule", po::value<std::string>()->default_value("cosine"), "constant|cosine (cosine decays to 0 over the run)")
      ("momentum", po::value<float>()->default_value(0.9f), "momentum (0 = plain SGD)")
      ("nesterov", po::bool_switch(), "Nesterov momentum (needs --momentum > 0)")
      ("weight-decay", po::value<float>()->default_value(0.0f), "L2 weight decay")
      ("batch", po::value<int64_t>()->default_value(64), "batch size per step")
      ("epochs", po::value<int>()->default_value(10), "epochs")
      ("max-steps", po::value<int64_t>()->default_value(0), "stop after this many steps (0: no limit)")
      ("seed", po::value<uint64_t>()->default_value(0), "seed for initialization and data order")
      ("threads", po::value<int>()->default_value(1), "OpenBLAS threads")
      ("log-every", po::value<int64_t>()->default_value(50), "a metrics row every N steps")
      ("accumulate", po::value<int64_t>()->default_value(1), "sum the gradients of K batches of --batch before each update / push / all-reduce (a step of K x --batch samples)")
      ("lr-scaling", po::value<std::string>()->default_value("none"), "none|linear: linear multiplies --lr by the global batch (workers x batch x accumulate) / --base-batch (Goyal et al. 2017)")
      ("base-batch", po::value<int64_t>()->default_value(64), "the global batch --lr was tuned for (--lr-scaling=linear)")
      ("staleness-aware-lr", po::bool_switch(), "ssp|asp: the servers apply each gradient at the rate divided by its staleness (Zhang et al. 2016)")
      ("warmup-epochs", po::value<double>()->default_value(0.0), "ramp the learning rate linearly from --lr to its scaled value over this many epochs")
      ("eval-every", po::value<int64_t>()->default_value(0), "the evaluating worker also evaluates every N steps (0: each epoch only)")
      ("straggle", po::value<std::string>()->default_value("none"), "injected delay per step: none|ms:D|x:FACTOR|exp:MEAN_MS|uniform:LO_MS:HI_MS")
      ("straggle-seed", po::value<uint64_t>()->default_value(0), "seed of a random --straggle distribution")
      ("out", po::value<std::string>(), "directory for worker-<rank>.csv")
      ("run", po::value<std::string>()->default_value(""), "run name written in the metrics (default: the mode)");
  auto vm = flags.ParseOrExit(argc, argv);
  TuneAllocatorForLargeMessages();

  const std::string mode = vm["mode"].as<std::string>();
  if (mode != "local" && mode != "allreduce" && !IsPsMode(mode)) {
    flags.Fail("--mode must be local|bsp|ssp|asp|allreduce, not '" + mode + "'");
  }
  const bool ps = IsPsMode(mode), allreduce = mode == "allreduce", joins = ps || allreduce;
  if (joins && !vm.count("scheduler")) flags.Fail("--mode=" + mode + " needs --scheduler=HOST:PORT");
  if (!joins) {
    for (const char* f : {"scheduler", "rank", "staleness", "auth-dir"})
      if (FlagGiven(vm, f)) flags.Fail(std::string("--") + f + " applies to the modes that join a job only");
  }
  if (!ps && FlagGiven(vm, "recovery-timeout")) flags.Fail("--recovery-timeout applies to the PS modes (bsp|ssp|asp)");
  if (!ps && FlagGiven(vm, "push-part-mb")) flags.Fail("--push-part-mb applies to the PS modes (bsp|ssp|asp)");
  if (!joins && FlagGiven(vm, "overlap")) flags.Fail("--overlap applies to the modes that join a job only");
  const double push_part_mb = vm["push-part-mb"].as<double>();
  if (!(push_part_mb >= 1e-6 && push_part_mb <= 1024)) flags.Fail("--push-part-mb must be in (0, 1024]");
  if (!allreduce) {
    for (const char* f : {"bucket-mb", "collective-timeout", "bind", "first-bucket-mb", "checkpoint-dir",
                          "checkpoint-every", "resume"})
      if (FlagGiven(vm, f)) flags.Fail(std::string("--") + f + " applies to --mode=allreduce only");
  }
  const std::string device = vm["device"].as<std::string>();
  if (device != "cpu" && device != "cuda") flags.Fail("--device must be cpu or cuda, not '" + device + "'");
  const bool cuda = device == "cuda";
  if (FlagGiven(vm, "gpu") && !cuda) flags.Fail("--gpu applies to --device=cuda");
  if (vm["gpu"].as<int>() < -1) flags.Fail("--gpu must be >= 0");
  if (cuda) {
    if (!GRADSYNC_HAVE_CUDA) flags.Fail("--device=cuda: this gradsync-worker was built without CUDA (GRADSYNC_CUDA=OFF or no nvcc)");
    if (vm["model"].as<std::string>() == "sparse_logreg") flags.Fail("--device=cuda applies to --model=softmax|mlp");
    if (vm["accumulate"].as<int64_t>() > 1) flags.Fail("--accumulate is not supported with --device=cuda");
    if (allreduce && !GRADSYNC_HAVE_NCCL) flags.Fail("--device=cuda --mode=allreduce needs NCCL, which this build did not find");
    if (allreduce && vm["compress"].as<std::string>() != "none") {
      flags.Fail("--compress is not supported with --device=cuda --mode=allreduce (NCCL averages fp32 gradients)");
    }
  }
  if (!(vm["bucket-mb"].as<double>() > 0)) flags.Fail("--bucket-mb must be > 0");
  if (vm["checkpoint-every"].as<int64_t>() < 1) flags.Fail("--checkpoint-every must be >= 1");
  if ((vm["resume"].as<bool>() || FlagGiven(vm, "checkpoint-every")) && !vm.count("checkpoint-dir")) {
    flags.Fail("--resume and --checkpoint-every need --checkpoint-dir");
  }
  if (cuda && vm.count("checkpoint-dir")) flags.Fail("--checkpoint-dir is not supported with --device=cuda yet");
  if (!(vm["first-bucket-mb"].as<double>() > 0)) flags.Fail("--first-bucket-mb must be > 0");
  const std::string compress = vm["compress"].as<std::string>();
  const bool error_feedback = vm["error-feedback"].as<bool>();
  {
    auto codec = CreateCompressor(compress, 0);
    if (!codec.ok()) flags.Fail("--compress: " + codec.status().message());
    if (error_feedback && !*codec) flags.Fail("--error-feedback needs a --compress codec");
    if (*codec && !joins) flags.Fail("--compress applies to the modes that join a job (bsp|ssp|asp|allreduce)");
    if (vm["compress-pull"].as<bool>()) {
      if (!*codec) flags.Fail("--compress-pull needs a --compress codec");
      if (allreduce) flags.Fail("--compress-pull applies to the PS modes (bsp|ssp|asp): all-reduce has no pulls");
    }
    if (vm["momentum-correction"].as<bool>()) {
      if (!*codec || !(*codec)->sparse()) flags.Fail("--momentum-correction needs --compress=topk:R or randomk:R");
      if (error_feedback) flags.Fail("--momentum-correction and --error-feedback contradict each other: DGC keeps its own residual");
    }
  }
  // DGC moves the momentum to the sender: the applied update is plain SGD.
  const float correction_momentum = vm["momentum-correction"].as<bool>() ? vm["momentum"].as<float>() : 0.0f;
  if (vm["momentum-correction"].as<bool>() && !(correction_momentum > 0)) flags.Fail("--momentum-correction needs --momentum > 0");
  if (vm["momentum-correction"].as<bool>() && vm["nesterov"].as<bool>()) flags.Fail("--momentum-correction does not combine with --nesterov");
  if (!(vm["collective-timeout"].as<double>() > 0)) flags.Fail("--collective-timeout must be > 0");
  if (FlagGiven(vm, "staleness") && mode != "ssp") flags.Fail("--staleness applies to --mode=ssp only");
  if (vm["staleness"].as<int>() < 0) flags.Fail("--staleness must be >= 0");

  ModelOptions model_options;
  model_options.name = vm["model"].as<std::string>();
  model_options.feature_bits = vm["feature-bits"].as<int>();
  if (model_options.name == "mlp") {
    auto hidden = ParseIntList(vm["hidden"].as<std::string>(), 1, 1 << 20);
    if (!hidden.ok()) flags.Fail("--hidden: " + hidden.status().message() + ", e.g. 256,128");
    model_options.hidden = *hidden;
  }
  else if (FlagGiven(vm, "hidden")) flags.Fail("--hidden applies to --model=mlp only");

  DataOptions data_options;
  data_options.name = vm.count("dataset") ? vm["dataset"].as<std::string>()
                      : model_options.name == "sparse_logreg" ? "sparse-logistic"
                                                              : "fashion-mnist";
  data_options.dir = vm["data-dir"].as<std::string>();
  data_options.standardize = vm["standardize"].as<bool>();
  data_options.feature_bits = model_options.feature_bits;
  data_options.seed = vm["seed"].as<uint64_t>();
  const bool sparse_model = model_options.name == "sparse_logreg";
  if (sparse_model != (data_options.name == "sparse-logistic")) {
    flags.Fail("--model=" + model_options.name + " cannot train on --dataset=" + data_options.name +
               " (sparse_logreg goes with sparse-logistic, the dense models with the others)");
  }

  LocalTrainOptions train;
  train.optimizer.momentum = vm["momentum"].as<float>();
  train.optimizer.nesterov = vm["nesterov"].as<bool>();
  train.optimizer.weight_decay = vm["weight-decay"].as<float>();
  if (Status s = ValidateOptimizerOptions(train.optimizer); !s.ok()) flags.Fail(s.message());
  if (vm["momentum-correction"].as<bool>()) train.optimizer.momentum = 0.0f;  // moved to the sender
  train.lr.base = vm["lr"].as<float>();
  if (!(train.lr.base > 0.0f) || !std::isfinite(train.lr.base)) flags.Fail("--lr must be > 0");
  auto schedule = ParseLrScheduleKind(vm["lr-schedule"].as<std::string>());
  if (!schedule.ok()) flags.Fail(schedule.status().message());
  train.lr.kind = *schedule;
  train.batch = vm["batch"].as<int64_t>();
  if (train.batch <= 0) flags.Fail("--batch must be > 0");
  const int64_t accumulate = vm["accumulate"].as<int64_t>();
  if (accumulate < 1 || accumulate > 4096) flags.Fail("--accumulate must be in [1, 4096]");
  if (accumulate > 1) {
    if (sparse_model) flags.Fail("--accumulate applies to the dense models");
    train.micro_batch = train.batch;
    train.batch *= accumulate;  // a step takes K micro-batches
  }
  const std::string lr_scaling = vm["lr-scaling"].as<std::string>();
  if (lr_scaling != "none" && lr_scaling != "linear") flags.Fail("--lr-scaling must be none or linear, not '" + lr_scaling + "'");
  if (vm["base-batch"].as<int64_t>() < 1) flags.Fail("--base-batch must be > 0");
  if (FlagGiven(vm, "base-batch") && lr_scaling == "none") flags.Fail("--base-batch applies to --lr-scaling=linear");
  if (vm["staleness-aware-lr"].as<bool>() && mode != "ssp" && mode != "asp") {
    flags.Fail("--staleness-aware-lr applies to --mode=ssp|asp (bsp gradients are never stale)");
  }
  train.warmup_epochs = vm["warmup-epochs"].as<double>();
  if (!(train.warmup_epochs >= 0 && train.warmup_epochs <= 1000)) flags.Fail("--warmup-epochs must be in [0, 1000]");
  train.epochs = vm["epochs"].as<int>();
  if (train.epochs <= 0) flags.Fail("--epochs must be > 0");
  train.max_steps = vm["max-steps"].as<int64_t>();
  if (train.max_steps < 0) flags.Fail("--max-steps must be >= 0");
  train.seed = vm["seed"].as<uint64_t>();
  train.log_every = vm["log-every"].as<int64_t>();
  if (train.log_every < 0) flags.Fail("--log-every must be >= 0");
  train.eval_every = vm["eval-every"].as<int64_t>();
  if (train.eval_every < 0) flags.Fail("--eval-every must be >= 0");
  {
    auto straggler = ParseStraggler(vm["straggle"].as<std::string>());
    if (!straggler.ok()) flags.Fail("--straggle: " + straggler.status().message());
    train.straggler = *straggler;
    train.straggler_seed = vm["straggle-seed"].as<uint64_t>();
  }
  const int threads = vm["threads"].as<int>();
  if (threads <= 0 || threads > 256) flags.Fail("--threads must be in [1, 256]");
  SetBlasThreads(threads);

  // Parameter-server modes register first: the scheduler assigns the rank that picks the shard.
  TransportContext ctx(1);
  // --auth-dir: CURVE on every socket of this context (declared after it: stops first).
  std::unique_ptr<CurveAuthenticator> auth;
  if (vm.count("auth-dir")) {
    auto a = EnableCurveFromDir(ctx, vm["auth-dir"].as<std::string>());
    if (!a.ok()) flags.Fail("--auth-dir: " + a.status().message());
    auth = std::move(a).value();
  }
  std::unique_ptr<SchedulerClient> scheduler;
  wire::ClusterTable table;
  int rank = 0;
  std::unique_ptr<RingCollective> ring;
  if (allreduce) {
    CollectiveOptions co;
    co.timeout_s = vm["collective-timeout"].as<double>();
    auto r = RingCollective::Listen(vm["bind"].as<std::string>(), co);
    if (!r.ok()) {
      std::cerr << "gradsync-worker: error: " << r.status().message() << std::endl;
      return 1;
    }
    ring = std::move(r).value();
  }
  if (joins) {
    std::string host;
    uint16_t port = 0;
    if (Status s = ParseHostPort(vm["scheduler"].as<std::string>(), &host, &port); !s.ok()) flags.Fail("--scheduler: " + s.message());
    const double hb_interval = vm["heartbeat-interval"].as<double>(), hb_timeout = vm["heartbeat-timeout"].as<double>();
    if (!(hb_interval > 0) || !(hb_timeout > hb_interval)) flags.Fail("--heartbeat-interval must be > 0 and below --heartbeat-timeout");
    if (!(vm["request-timeout"].as<double>() > 0)) flags.Fail("--request-timeout must be > 0");
    if (!(vm["recovery-timeout"].as<double>() >= 0)) flags.Fail("--recovery-timeout must be >= 0");
    SchedulerClientOptions so;
    so.scheduler_endpoint = "tcp://" + host + ":" + std::to_string(port);
    so.self.set_role(wire::WORKER);
    so.self.set_host(vm["host"].as<std::string>());
    if (ring) so.self.set_port(ring->port());
    so.self.set_requested_rank(vm["rank"].as<int>() >= 0 ? vm["rank"].as<int>() : SlurmRank());
    so.mode = mode;
    so.staleness = mode == "ssp" ? vm["staleness"].as<int>() : 0;
    so.heartbeat_interval_s = hb_interval;
    so.scheduler_timeout_s = hb_timeout;
    // Settings that must agree between the workers of one job.
    std::ostringstream fp;
    fp << "model=" << model_options.name << " hidden=" << vm["hidden"].as<std::string>() << " dataset=" << data_options.name
       << " standardize=" << data_options.standardize << " batch=" << train.batch << " epochs=" << train.epochs
       << " max_steps=" << train.max_steps << " seed=" << train.seed << " lr=" << train.lr.base << " schedule="
       << vm["lr-schedule"].as<std::string>() << " momentum=" << train.optimizer.momentum << " nesterov="
       << train.optimizer.nesterov << " weight_decay=" << train.optimizer.weight_decay << " compress=" << compress
       << " error_feedback=" << error_feedback << " momentum_correction=" << correction_momentum
       << " compress_pull=" << vm["compress-pull"].as<bool>() << " accumulate=" << accumulate
       << " lr_scaling=" << lr_scaling << " base_batch=" << vm["base-batch"].as<int64_t>()
       << " warmup_epochs=" << train.warmup_epochs << " staleness_aware_lr=" << vm["staleness-aware-lr"].as<bool>();
    if (allreduce) fp << " device=" << device << " resume=" << vm["resume"].as<bool>();  // every rank alike
    so.job_fingerprint = fp.str();
    scheduler = std::make_unique<SchedulerClient>(ctx, so);
    auto t = scheduler->Register(300.0);
    if (!t.ok()) {
      std::cerr << "gradsync-worker: error: " << t.status().message() << std::endl;
      return t.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
    table = *t;
    rank = scheduler->rank();
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
    const int gpu = vm["gpu"].as<int>() >= 0 ? vm["gpu"].as<int>() : rank % devices;
    if (allreduce && table.workers_size() > devices && !FlagGiven(vm, "gpu")) {
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
      auto c = NcclCollective::Create(*ring, gpu);
      if (!c.ok()) return fail_job(c.status().WithContext("NCCL"));
      nccl = std::move(c).value();
    }
#endif
#endif
  }
  (*model)->Initialize(train.seed);

  std::optional<MetricsWriter> metrics;
  if (vm.count("out")) {
    auto w = MetricsWriter::Open(vm["out"].as<std::string>() + "/worker-" + std::to_string(rank) + ".csv",
                                 vm["run"].as<std::string>().empty() ? mode : vm["run"].as<std::string>(), rank);
    if (!w.ok()) {
      std::cerr << "gradsync-worker: error: " << w.status().message() << std::endl;
      return 1;
    }
    metrics.emplace(std::move(w).value());
  }

  std::printf("gradsync-worker %d: mode=%s model=%s params=%lld dataset=%s train=%lld test=%lld "
              "batch=%lld lr=%g (%s) momentum=%g%s weight_decay=%g epochs=%d seed=%llu threads=%d device=%s\n",
              rank, mode.c_str(), (*model)->name().c_str(), static_cast<long long>((*model)->num_params()),
              data_options.name.c_str(), static_cast<long long>(data->train.n),
              static_cast<long long>(data->test.n), static_cast<long long>(train.batch),
              train.lr.base, vm["lr-schedule"].as<std::string>().c_str(), train.optimizer.momentum,
              train.optimizer.nesterov ? " (nesterov)" : "", train.optimizer.weight_decay,
              train.epochs, static_cast<unsigned long long>(train.seed), threads, device_name.c_str());
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
    if (lr_scaling == "linear") {
      train.lr.base = base_lr * static_cast<float>(workers * train.batch) / static_cast<float>(vm["base-batch"].as<int64_t>());
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
    ao.bucket_bytes = static_cast<size_t>(vm["bucket-mb"].as<double>() * 1e6);
    ao.overlap = vm["overlap"].as<bool>();
    ao.first_bucket_bytes = static_cast<size_t>(vm["first-bucket-mb"].as<double>() * 1e6);
    ao.compression = compress == "none" ? "" : compress;
    ao.error_feedback = error_feedback;
    ao.correction_momentum = correction_momentum;
    ao.collective_timeout_s = vm["collective-timeout"].as<double>();
    if (vm.count("checkpoint-dir")) {
      ao.checkpoint_dir = vm["checkpoint-dir"].as<std::string>();
      std::error_code ec;
      std::filesystem::create_directories(ao.checkpoint_dir, ec);
      ao.checkpoint_every = vm["checkpoint-every"].as<int64_t>();
      ao.resume = vm["resume"].as<bool>();
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
      po.request_timeout_s = vm["request-timeout"].as<double>();
      po.recovery_timeout_s = vm["recovery-timeout"].as<double>();
      po.compression = compress == "none" ? "" : compress;
      po.error_feedback = error_feedback;
      po.correction_momentum = correction_momentum;
      po.compress_pull = vm["compress-pull"].as<bool>();
      po.staleness_aware_lr = vm["staleness-aware-lr"].as<bool>();
      po.overlap = vm["overlap"].as<bool>();
      po.push_part_floats = static_cast<size_t>(std::max(1.0, push_part_mb * 1e6 / sizeof(float)));
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
  if (vm.count("out")) {
    // DIR/worker-<rank>.json: what the report reads about this worker (never its log).
    summary::ProcessSummary s;
    s.set_role("worker");
    s.set_rank(rank);
    s.set_mode(mode);
    if (mode == "ssp") s.set_staleness_bound(vm["staleness"].as<int>());
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
    if (Status w = WriteProcessSummary(vm["out"].as<std::string>(), s); !w.ok()) {
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

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
