#include "common/config/train_flags.h"

#include <google/protobuf/descriptor.h>

#include <algorithm>

#include "common/base/check.h"
#include "common/config/train_config.h"

namespace gradsync {

namespace pb = google::protobuf;

namespace {

// WorkerFlags' table, in groups (in the order --help lists them).

std::vector<WorkerFlag> JobFlags() {
  // clang-format off
  return {
      // The job.
      {"mode", false, false, "local|bsp|ssp|asp|allreduce (all but local join a job through --scheduler)"},
      {"staleness", false, false, "ssp staleness bound s >= 0 (default: the job's, as the scheduler has it from the servers)"},
      {"scheduler", true, false, "bsp|ssp|asp|allreduce: the scheduler's HOST:PORT"},
      {"rank", true, false, "requested worker rank (default: the launcher's: RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID in a step; else assigned)"},
      {"local-rank", true, false, "--device=cuda: this process's rank among its host's, which picks the GPU (default: the launcher's LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID)"},
      {"host", true, false, "address this worker advertises"},
      {"bind", true, false, "allreduce: address the ring listens on"},
      {"auth-dir", true, false, "authenticate and encrypt every ZeroMQ socket with CURVE, and authenticate the all-reduce ring, using the keys gradsync-keygen wrote in DIR"},
      {"heartbeat-interval", true, false, "seconds between heartbeats"},
      {"heartbeat-timeout", true, false, "seconds without the scheduler before giving up"},
  };
  // clang-format on
}

std::vector<WorkerFlag> ModelFlags() {
  // clang-format off
  return {
      // The model and the data.
      {"model", false, false, "softmax|mlp|sparse_logreg|dlrm (dlrm: DLRM-style, a bottom and a top MLP around the dot interaction of one embedding table per categorical feature, its tables on the servers in the PS modes)"},
      {"hidden", false, false, "mlp hidden layer sizes, comma-separated"},
      {"dataset", false, false, "fashion-mnist|blobs|sparse-logistic|click-log (default: fashion-mnist; sparse-logistic for sparse_logreg, click-log for dlrm)"},
      {"data-dir", false, false, "directory of the Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)"},
      {"data-cache", false, false, "directory where Fashion-MNIST is decoded once per host and mapped read-only by every worker there (default $GRADSYNC_DATA_CACHE, else ~/.cache/gradsync); off: each worker decodes its own"},
      {"standardize", false, false, "standardize Fashion-MNIST pixels: (x - 0.2860) / 0.3530 (true|false)"},
      {"feature-bits", false, false, "sparse_logreg: 2^bits hashed features"},
      {"click-features", false, false, "click-log: categorical features (dlrm: one embedding table each)"},
      {"click-ids", false, false, "click-log: ids per categorical feature, Zipf-distributed (0: any 64-bit id)"},
      {"click-zipf", false, false, "click-log: the ids' Zipf exponent s in (0, 3]"},
      {"click-dense", false, false, "click-log: dense features"},
      {"click-train", false, false, "click-log: training examples (generated from the seed, never stored whole by the servers)"},
      {"click-test", false, false, "click-log: test examples"},
      {"click-planted", false, false, "click-log: the standard deviation of each id's planted effect on the logit (the dense features' part has 0.6): how much of what can be learned lies in the rows"},
      {"table-dim", false, false, "dlrm: floats per embedding row"},
      {"table-optimizer", false, false, "dlrm: the rows' own optimizer, per row: sgd|adagrad (row-wise: one accumulator per row)|adam (lazy: moments and step count of touched rows only)"},
      {"table-rows", false, false, "dlrm: the most rows of one table a server holds, or a local process (past it a push is refused, naming the table)"},
      {"precision", false, false, "fp32|bf16|fp16: 16-bit operands with fp32 accumulation and fp32 master weights; gradients travel in 16 bits (unless --compress names another codec); fp16 scales the loss dynamically and skips steps whose gradients overflow"},
      {"initial-loss-scale", false, false, "fp16: the dynamic loss scale to start from (halved after each overflowed step, doubled after 2000 good ones)"},
  };
  // clang-format on
}

std::vector<WorkerFlag> OptimizationFlags() {
  // clang-format off
  return {
      // Optimization.
      {"lr", false, false, "learning rate"},
      {"lr-schedule", false, false, "constant|cosine|linear (cosine and linear decay to 0 over the run, after any warm-up)"},
      {"optimizer", false, false, "sgd|adam|lars|lamb: the update rule (adam: torch.optim.Adam; lars, lamb: layer-wise trust ratios, biases and 1-D tensors excluded; adam, lars, lamb: dense models; in the PS modes the servers run it)"},
      {"momentum", false, false, "sgd, lars: momentum (0 = none)"},
      {"nesterov", false, true, "sgd: Nesterov momentum (needs --momentum > 0)"},
      {"weight-decay", false, false, "L2 weight decay, added to the gradient (sgd, adam, lars); lamb: decoupled, added to the update"},
      {"adam-beta1", false, false, "adam, lamb: decay of the gradient's running mean"},
      {"adam-beta2", false, false, "adam, lamb: decay of the squared gradient's running mean"},
      {"adam-eps", false, false, "adam, lamb: added to the denominator (lamb's paper uses 1e-6)"},
      {"trust-coefficient", false, false, "lars: eta in the trust ratio eta ||w|| / (||g|| + wd ||w||); with lars, pick --lr and this together (the MLP on Fashion-MNIST: --lr=0.1 --trust-coefficient=0.03 reaches 88% in 3 epochs, the defaults 73%)"},
      {"epochs", false, false, "epochs"},
      {"batch", false, false, "batch size per step"},
      {"max-steps", false, false, "stop after this many steps (0: no limit)"},
      {"seed", false, false, "seed for initialization and data order"},
      {"accumulate", false, false, "sum the gradients of K batches of --batch before each update / push / all-reduce (a step of K x --batch samples)"},
      {"lr-scaling", false, false, "none|linear: linear multiplies --lr by the global batch (workers x batch x accumulate) / --base-batch (Goyal et al. 2017)"},
      {"base-batch", false, false, "the global batch --lr was tuned for (--lr-scaling=linear)"},
      {"warmup-epochs", false, false, "ramp the learning rate linearly from --lr to its scaled value over this many epochs"},
      {"staleness-aware-lr", false, true, "ssp|asp: the servers apply each gradient at the rate divided by its staleness (Zhang et al. 2016)"},
      {"sync-every", false, false, "local SGD / DiLoCo: each worker takes H steps on its own copy of the model, then the workers exchange pseudo-gradients (the global model minus their own) in the mode's way and the outer SGD applies their mean (0: every step's gradient is exchanged)"},
      {"outer-lr", false, false, "--sync-every: the outer SGD's rate on the averaged pseudo-gradient (1 with no momentum: local SGD, the models averaged; DiLoCo: 0.7)"},
      {"outer-momentum", false, false, "--sync-every: the outer SGD's momentum (DiLoCo: 0.9)"},
      {"outer-nesterov", false, true, "--sync-every: the outer momentum in Nesterov's form (DiLoCo)"},
      {"delay-compensation", false, false, "ssp|asp: delay-compensated ASGD with this lambda (Zheng et al. 2017): the servers correct each gradient by lambda * g * g * (the parameters now - those the worker pulled), keeping every worker's last pull (a copy of the shard per worker); 0 corrects nothing"},
      {"delay-compensation-adaptive", false, true, "--delay-compensation: lambda / sqrt(a running mean square of the gradient), per element (DC-ASGD-a)"},
  };
  // clang-format on
}

std::vector<WorkerFlag> CommunicationFlags() {
  // clang-format off
  return {
      // Compression.
      {"compress", false, false, "gradient codec: none|fp16|bf16|int8|qsgd:LEVELS|sign|topk:RATIO|randomk:RATIO|powersgd:RANK (powersgd: allreduce; each matrix as rank-RANK factors, averaged in two all-reduces, warm-started; with --error-feedback its residual)"},
      {"error-feedback", false, true, "keep the compression residual and add it to the next gradient"},
      {"compress-pull", false, true, "PS modes: servers reply to pulls with the --compress'ed parameter delta since the worker's last pull (the residual stays on the server)"},
      {"momentum-correction", false, true, "DGC momentum correction with --momentum on the workers (top-k/random-k); the update itself is then plain SGD"},
      // Communication.
      {"overlap", false, false, "overlap communication with backward and forward (dense CPU models, uncompressed; true|false). allreduce: all-reduce each bucket as soon as backward produced it, on a communication thread; bsp|ssp|asp: push each tensor (in parts of --push-part-mib) as soon as backward produced it, pull per tensor in forward order and start each layer when its parameters are in. Default: on, unless a host runs more workers than it has cores, where the communication thread only takes the cores the workers compute on (allreduce: any host of the job, so that every rank does the same; bsp|ssp|asp: this worker's host)"},
      {"push-part-mib", false, false, "bsp|ssp|asp with --overlap: the largest part of a tensor pushed or pulled in one message, in MiB (the data channel's threshold, --data-channel-min-mib, is met by whole parts at the defaults)"},
      {"row-cache", false, false, "ssp: serve a table row this worker pulled from its own cache, without asking the shard, while the updates it holds are within the bound s (true|false; bsp and asp keep no rows)"},
      {"shm", false, false, "bsp|ssp|asp: move the values of raw dense pushes and pulls through shared memory to and from the shards on this host (true|false; headers still go over TCP; a shard that cannot map it is used over TCP)"},
      {"data-channel", false, false, "bsp|ssp|asp: move the values of raw dense pushes and pulls of --data-channel-min-mib and more over a TCP connection of their own to each shard without shared memory, received straight into place (true|false; headers still go over ZeroMQ; off with --auth-dir, whose CURVE encrypts them)"},
      {"busy-poll-ms", false, false, "a worker waiting for the others polls this many milliseconds, giving up the core between polls, before it sleeps (bsp|ssp|asp: for the shards' replies; allreduce: at the shared-memory group's barriers, where ranks share a host; 0: sleeps at once, or after a few polls). A sleeping worker must be woken when the wait ends, which can take longer than the wait did where the cores are busy or idle virtual CPUs are parked"},
      {"data-channel-min-mib", false, false, "bsp|ssp|asp with --data-channel: the smallest push or pull (its values, in MiB) that uses it; smaller ones go over ZeroMQ"},
      {"bucket-mib", false, false, "allreduce: gradient bucket size in MiB"},
      {"first-bucket-mib", false, false, "allreduce: size of the first (last-layer) bucket in MiB, so that communication starts early"},
      {"allreduce-algo", false, false, "allreduce on the CPU: auto|ring|rhd|rd|tree (auto: recursive doubling for small buffers, halving-doubling, then the ring for large ones; every worker alike)"},
      {"allreduce-shm", false, false, "allreduce on the CPU: workers on one host (by address) all-reduce through shared memory, and across hosts hierarchically (shared memory within each, a ring of one leader per host over TCP) when --allreduce-algo=auto (true|false; off with --ring-encrypt)"},
      {"zero", false, false, "allreduce: ZeRO stage 0|1|2. 1: each worker keeps the optimizer state of 1/n of the parameters, the gradient is reduce-scattered after backward and the parameters all-gathered after the update (the bytes of an all-reduce); 2: the gradient is reduce-scattered bucket by bucket during backward (--overlap)"},
      {"ring-encrypt", false, true, "allreduce: also encrypt the ring's data (ChaCha20-Poly1305; needs --auth-dir, which authenticates the ring)"},
  };
  // clang-format on
}

std::vector<WorkerFlag> DeviceAndProcessFlags() {
  // clang-format off
  return {
      // The device.
      {"device", false, false, "cpu|cuda: where the model computes (cuda: softmax|mlp; PS modes copy through pinned host buffers, allreduce runs NCCL on the device)"},
      {"gpu", false, false, "--device=cuda: CUDA device index (default: the local rank, else the rank, modulo the visible devices; PS workers may share one)"},
      // Timeouts.
      {"request-timeout", false, false, "seconds a push or pull may take (dead servers fail faster)"},
      {"recovery-timeout", false, false, "PS modes: seconds to wait for a dead server to come back from its checkpoint before failing (0: fail at once)"},
      {"collective-timeout", false, false, "allreduce: seconds an all-reduce may take before the job fails"},
      // All-reduce checkpoints.
      {"checkpoint-dir", false, false, "allreduce: rank 0 checkpoints parameters, optimizer state and step to DIR/allreduce.ckpt"},
      {"checkpoint-every", false, false, "allreduce: steps between checkpoints"},
      {"resume", false, true, "allreduce: every rank starts from DIR/allreduce.ckpt (after a failed run)"},
      // Stragglers.
      {"straggle", false, false, "injected delay per step: none|ms:D|x:FACTOR|exp:MEAN_MS|uniform:LO_MS:HI_MS"},
      {"straggle-seed", false, false, "seed of a random --straggle distribution"},
      // This process.
      {"threads", false, false, "OpenBLAS threads"},
      {"log-every", false, false, "a metrics row every N steps"},
      {"eval-every", false, false, "the evaluating worker also evaluates every N steps (0: each epoch only)"},
      {"out", true, false, "directory for worker-<rank>.csv"},
      {"run", true, false, "run name written in the metrics (default: the mode)"},
      {"trace", true, false, "write a Chrome trace-event JSON timeline of this process (Perfetto, chrome://tracing) to FILE: forward, backward per layer, pushes, pulls and their parts (shard, bytes), encode and decode, all-reduce buckets, the optimizer, failures and recoveries"},
  };
  // clang-format on
}

}  // namespace

const std::vector<WorkerFlag>& WorkerFlags() {
  static const std::vector<WorkerFlag> table = [] {
    std::vector<WorkerFlag> all;
    for (auto group : {JobFlags, ModelFlags, OptimizationFlags, CommunicationFlags, DeviceAndProcessFlags}) {
      const std::vector<WorkerFlag> flags = group();
      all.insert(all.end(), flags.begin(), flags.end());
    }
    return all;
  }();
  return table;
}

namespace {

std::string FieldName(std::string_view flag) {
  std::string s(flag);
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

const pb::FieldDescriptor* FieldOf(const WorkerFlag& flag) {
  const pb::Descriptor* d = flag.process ? config::WorkerProcess::descriptor() : config::TrainConfig::descriptor();
  const pb::FieldDescriptor* f = d->FindFieldByName(FieldName(flag.flag));
  GRADSYNC_CHECK(f) << "worker flag --" << flag.flag << " has no field in " << d->full_name();
  return f;
}

template <typename T>
po::typed_value<T>* Typed(const pb::FieldDescriptor* f, T def, const std::string& text) {
  po::typed_value<T>* v = po::value<T>();
  if (f->has_default_value()) v->default_value(def, text);
  return v;
}

}  // namespace

void AddWorkerFlags(po::options_description& options) {
  auto add = options.add_options();
  for (const WorkerFlag& flag : WorkerFlags()) {
    const pb::FieldDescriptor* f = FieldOf(flag);
    const char* name = flag.flag;
    if (flag.is_switch) {
      GRADSYNC_CHECK(f->cpp_type() == pb::FieldDescriptor::CPPTYPE_BOOL) << name;
      add(name, po::bool_switch(), flag.help);
      continue;
    }
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
        add(name, Typed<int>(f, f->default_value_int32(), std::to_string(f->default_value_int32())), flag.help);
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        add(name, Typed<int64_t>(f, f->default_value_int64(), std::to_string(f->default_value_int64())), flag.help);
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        add(name, Typed<uint64_t>(f, f->default_value_uint64(), std::to_string(f->default_value_uint64())), flag.help);
        break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT:
        add(name, Typed<float>(f, f->default_value_float(), ShortestText(f->default_value_float())), flag.help);
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        add(name, Typed<double>(f, f->default_value_double(), ShortestText(f->default_value_double())), flag.help);
        break;
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        add(name, Typed<bool>(f, f->default_value_bool(), f->default_value_bool() ? "true" : "false"), flag.help);
        break;
      case pb::FieldDescriptor::CPPTYPE_STRING:
        add(name, Typed<std::string>(f, f->default_value_string(), f->default_value_string()), flag.help);
        break;
      case pb::FieldDescriptor::CPPTYPE_ENUM: {
        const std::string def = ModeName(static_cast<config::Mode>(f->default_value_enum()->number()));
        add(name, Typed<std::string>(f, def, def), flag.help);
        break;
      }
      default:
        GRADSYNC_CHECK(false) << "worker flag --" << name << ": unsupported field type";
    }
  }
}

Status FlagsToConfig(const po::variables_map& vm, config::TrainConfig* train, config::WorkerProcess* process) {
  for (const WorkerFlag& flag : WorkerFlags()) {
    if (!FlagGiven(vm, flag.flag)) continue;
    const pb::FieldDescriptor* f = FieldOf(flag);
    pb::Message* m = flag.process ? static_cast<pb::Message*>(process) : static_cast<pb::Message*>(train);
    const pb::Reflection* r = m->GetReflection();
    const po::variable_value& v = vm[flag.flag];
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, v.as<int>()); break;
      case pb::FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, v.as<int64_t>()); break;
      case pb::FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, v.as<uint64_t>()); break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(m, f, v.as<float>()); break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, v.as<double>()); break;
      case pb::FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, v.as<bool>()); break;
      case pb::FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, v.as<std::string>()); break;
      case pb::FieldDescriptor::CPPTYPE_ENUM: {
        auto mode = ParseMode(v.as<std::string>());
        if (!mode.ok()) return InvalidArgumentError("--" + mode.status().message());
        r->SetEnumValue(m, f, *mode);
        break;
      }
      default:
        return InternalError(std::string("--") + flag.flag + ": unsupported field type");
    }
  }
  return OkStatus();
}

std::vector<std::string> ConfigToFlags(const config::TrainConfig& train, std::initializer_list<std::string_view> leave_out) {
  std::vector<std::string> args;
  const pb::Reflection* r = train.GetReflection();
  for (const WorkerFlag& flag : WorkerFlags()) {
    if (flag.process) continue;
    const pb::FieldDescriptor* f = FieldOf(flag);
    if (!r->HasField(train, f) || std::find(leave_out.begin(), leave_out.end(), f->name()) != leave_out.end()) continue;
    if (flag.is_switch) {
      if (r->GetBool(train, f)) args.push_back(FlagName(f->name()));
      continue;
    }
    args.push_back(FlagName(f->name()) + "=" + FieldValueText(train, f));
  }
  return args;
}

}  // namespace gradsync
