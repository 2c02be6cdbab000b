#include "python/native/frontend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>

#include "common/base/logging.h"
#include "common/config/cluster.h"
#include "common/config/flags.h"
#include "common/config/train_flags.h"
#include "common/obs/trace.h"
#include "worker/allreduce/allreduce_sync.h"
#include "worker/ps/ps_sync.h"
#include "worker/sync/sync_factory.h"
#include "worker/train_options.h"

namespace gradsync::python {
namespace {

// "d0<sep>d1<sep>...", appended (a char pointer plus a std::string made GCC 12's LTO warn of a
// memcpy past any object).
std::string JoinDims(const std::vector<int64_t>& shape, const char* sep) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) (i ? s.append(sep) : s).append(std::to_string(shape[i]));
  return s;
}

std::string ShapeText(const std::vector<int64_t>& shape) { return "[" + JoinDims(shape, ", ") + "]"; }

// One line per tensor: "name<TAB>d0,d1,...". Names cannot hold a tab or a newline (checked).
std::string LayoutText(const std::vector<TensorSpec>& tensors) {
  std::string s;
  for (const auto& t : tensors) s += t.name + "\t" + JoinDims(t.shape, ",") + "\n";
  return s;
}

std::vector<TensorSpec> ParseLayoutText(const std::string& text) {
  std::vector<TensorSpec> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    TensorSpec t;
    const size_t tab = line.find('\t');
    t.name = line.substr(0, tab);
    if (tab != std::string::npos) {
      std::istringstream dims(line.substr(tab + 1));
      std::string d;
      while (std::getline(dims, d, ',')) t.shape.push_back(std::stoll(d));
    }
    out.push_back(std::move(t));
  }
  return out;
}

// The first difference between worker 0's layout and worker `rank`'s, as a sentence.
std::string LayoutDifference(const std::vector<TensorSpec>& first, const std::vector<TensorSpec>& other, int rank) {
  const std::string w = "worker " + std::to_string(rank);
  for (size_t i = 0; i < std::min(first.size(), other.size()); ++i) {
    if (first[i].name != other[i].name) {
      return "parameter " + std::to_string(i) + " is '" + first[i].name + "' on worker 0 but '" + other[i].name +
             "' on " + w;
    }
    if (first[i].shape != other[i].shape) {
      return "parameter '" + first[i].name + "' has shape " + ShapeText(first[i].shape) + " on worker 0 but " +
             ShapeText(other[i].shape) + " on " + w;
    }
  }
  const auto& longer = first.size() > other.size() ? first : other;
  const size_t i = std::min(first.size(), other.size());
  return "worker 0 has " + std::to_string(first.size()) + " parameters, " + w + " " + std::to_string(other.size()) +
         " (parameter '" + longer[i].name + "' is only on " + (first.size() > other.size() ? "worker 0" : w) + ")";
}

}  // namespace

void ThrowIfError(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}

FrontendJob::FrontendJob(const std::vector<std::string>& argv) {
  FlagParser flags(argv.empty() ? "gradsync" : argv[0], "");
  AddWorkerFlags(flags.options());
  std::vector<const char*> args;
  for (const auto& a : argv) args.push_back(a.c_str());
  if (args.empty()) args.push_back("gradsync");
  auto vm = flags.Parse(static_cast<int>(args.size()), args.data());
  ThrowIfError(vm.status());
  if (vm->count("help")) throw StatusError(InvalidArgumentError("--help: see gradsync-worker --help for the flags"));
  ThrowIfError(FlagsToConfig(*vm, &train_, &process_));
  if (auto errors = Validate(train_, process_); !errors.empty()) {
    throw StatusError(InvalidArgumentError(JoinErrors(errors)));
  }
  ThrowIfError(TakeLauncherRank(train_, &process_));
  if (train_.has_device()) {
    throw StatusError(InvalidArgumentError(
        "--device: the Python frontend runs where the model's tensors are (leave --device unset)"));
  }
  ThrowIfError(JoinJob(train_, process_, &link_));
  if (process_.has_trace()) {
    // GRADSYNC_TRACE (gradsync-launch --trace): this process's timeline, on the scheduler's clock.
    const double offset = link_.scheduler ? link_.scheduler->clock().offset_us() : 0;
    ThrowIfError(Trace::Start(process_.trace(), "worker", link_.rank, offset));
  }
}

FrontendJob::~FrontendJob() { Finished(AbortedError("the Python process ended without gradsync.shutdown()")); }

int FrontendJob::staleness() const {
  if (train_.mode() != config::SSP) return 0;
  return link_.scheduler ? link_.table.staleness() : train_.staleness();
}

std::vector<std::string> FrontendJob::Gather(const std::string& name, const std::string& data, double timeout_s) {
  if (!link_.scheduler) return {data};
  auto g = link_.scheduler->Gather(name, "workers", data, timeout_s);
  ThrowIfError(g.status());
  return std::move(g).value();
}

void FrontendJob::Broadcast(std::span<std::byte> data, int root) {
  if (data.size() % sizeof(float) != 0) throw StatusError(InvalidArgumentError("broadcast: the size must be a multiple of 4"));
  if (root < 0 || root >= size()) {
    throw StatusError(InvalidArgumentError("broadcast: root " + std::to_string(root) + " is not a rank of " +
                                           std::to_string(size()) + " workers"));
  }
  if (size() == 1) return;
  if (link_.ring) {
    FloatSpan floats(reinterpret_cast<float*>(data.data()), data.size() / sizeof(float));
    ThrowIfError(link_.ring->Broadcast(floats, root).WithContext("broadcast"));
    return;
  }
  static int broadcasts = 0;
  const std::string name = "broadcast-" + std::to_string(broadcasts++) + "-";
  for (size_t at = 0, chunk = 0; at < data.size(); at += kMaxGatherBytes, ++chunk) {
    const size_t n = std::min(kMaxGatherBytes, data.size() - at);
    std::string mine = rank() == root ? std::string(reinterpret_cast<const char*>(data.data() + at), n) : std::string();
    const auto all = Gather(name + std::to_string(chunk), mine, process_.heartbeat_timeout() * 30 + 60);
    if (static_cast<size_t>(root) >= all.size() || all[static_cast<size_t>(root)].size() != n) {
      throw StatusError(UnavailableError("broadcast: worker " + std::to_string(root) + "'s data did not arrive"));
    }
    std::memcpy(data.data() + at, all[static_cast<size_t>(root)].data(), n);
  }
}

void FrontendJob::AllReduce(FloatSpan data, ReduceOp op) {
  if (size() == 1) return;
  if (!link_.ring) throw StatusError(InvalidArgumentError("allreduce needs mode allreduce (this job's is " + ModeName(mode()) + ")"));
  ThrowIfError(link_.ring->AllReduce(data, op).WithContext("allreduce"));
}

void FrontendJob::TrainingEnded(int64_t steps, bool joined) {
  if (link_.scheduler && link_.ring) link_.scheduler->TrainingEnded(steps, joined);
}

std::vector<std::string> FrontendJob::AllGather(const std::string& mine, bool via_scheduler) {
  if (size() == 1 || !link_.scheduler) return {mine};
  if (link_.ring && !via_scheduler) {
    std::vector<std::vector<std::byte>> all;
    ThrowIfError(link_.ring
                     ->AllGather(std::span(reinterpret_cast<const std::byte*>(mine.data()), mine.size()), &all)
                     .WithContext("allgather"));
    std::vector<std::string> out;
    out.reserve(all.size());
    for (const auto& a : all) out.emplace_back(reinterpret_cast<const char*>(a.data()), a.size());
    return out;
  }
  // Through the scheduler: the sizes first, then rounds in which each worker sends its next piece;
  // a release carries every worker's piece, so a piece is also bounded by the reply's limit.
  const std::string name = "allgather-" + std::to_string(gathers_++) + "-";
  const double timeout = process_.heartbeat_timeout() * 30 + 60;
  const size_t n = static_cast<size_t>(size());
  const uint64_t my_size = mine.size();
  const auto sizes_text = Gather(name + "size", std::string(reinterpret_cast<const char*>(&my_size), sizeof my_size), timeout);
  // A worker that joined (PS modes) is no member of the gather any more: its entry is missing,
  // and it gives nothing.
  std::vector<uint64_t> sizes(n, 0);
  uint64_t largest = 0;
  for (size_t r = 0; r < n && r < sizes_text.size(); ++r) {
    if (sizes_text[r].empty()) continue;
    if (sizes_text[r].size() != sizeof(uint64_t)) {
      throw StatusError(DataLossError("allgather: worker " + std::to_string(r) + "'s size is " +
                                      std::to_string(sizes_text[r].size()) + " bytes"));
    }
    std::memcpy(&sizes[r], sizes_text[r].data(), sizeof(uint64_t));
    largest = std::max(largest, sizes[r]);
  }
  const size_t piece = std::min(kMaxGatherBytes, static_cast<size_t>(kMaxSchedulerReplyBytes - (128 << 10)) / n);
  std::vector<std::string> out(n);
  for (size_t r = 0; r < n; ++r) out[r].reserve(sizes[r]);
  for (uint64_t at = 0, round = 0; at < largest; at += piece, ++round) {
    const std::string part = at < mine.size() ? mine.substr(at, piece) : std::string();
    const auto all = Gather(name + std::to_string(round), part, timeout);
    for (size_t r = 0; r < n; ++r) {
      // A release lists a worker's piece only when it sent one (the last ranks' empty pieces
      // leave the list short).
      const uint64_t expect = at < sizes[r] ? std::min<uint64_t>(piece, sizes[r] - at) : 0;
      const size_t got = r < all.size() ? all[r].size() : 0;
      if (got != expect) {
        throw StatusError(UnavailableError("allgather: worker " + std::to_string(r) + "'s data did not arrive"));
      }
      if (got) out[r] += all[r];
    }
  }
  return out;
}

void FrontendJob::AlignGathers() {
  if (!link_.scheduler || size() == 1) return;
  const auto all = Gather("gathers-" + std::to_string(aligns_++),
                          std::string(reinterpret_cast<const char*>(&gathers_), sizeof gathers_),
                          process_.heartbeat_timeout() * 30 + 60);
  for (const auto& g : all) {
    if (g.size() != sizeof(int64_t)) continue;
    int64_t theirs = 0;
    std::memcpy(&theirs, g.data(), sizeof theirs);
    gathers_ = std::max(gathers_, theirs);
  }
}

std::vector<EndedWorker> FrontendJob::EndedWorkers() const {
  return link_.scheduler ? link_.scheduler->news().ended_workers() : std::vector<EndedWorker>{};
}

std::vector<std::string> FrontendJob::WorkerHosts() const {
  if (!link_.scheduler) return {process_.host()};
  std::vector<std::string> hosts;
  for (const auto& w : link_.table.workers()) hosts.push_back(w.host());
  return hosts;
}

const char* TraceName(const std::string& name) {
  // Events keep their names as pointers until the trace is written: every name a Python span
  // used lives as long as the process (there are few distinct ones).
  static std::mutex mu;
  static std::set<std::string>* names = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(mu);
  return names->insert(name).first->c_str();
}

void FrontendJob::Finished(const Status& status) {
  if (finished_) return;
  finished_ = true;
  if (Trace::on()) {
    if (link_.scheduler) {  // the best estimate of the whole run
      link_.scheduler->clock().Estimate(SchedulerClient::kClockProbes, 0.5);
      Trace::RefineClockOffset(link_.scheduler->clock().offset_us(), link_.scheduler->clock().rtt_us() / 2);
    }
    if (Status t = Trace::Stop(); !t.ok()) GRADSYNC_LOG(ERROR) << "the trace was not written: " << t;
  }
  link_.Finished(status);
}

FrontendBucketReducer::FrontendBucketReducer(FrontendJob* job, const std::string& codec, bool error_feedback)
    : job_(job), codec_(codec), error_feedback_(error_feedback) {
  if (!job->link().ring) {
    throw StatusError(InvalidArgumentError("the all-reduce hook needs mode allreduce (this job's mode is " +
                                           ModeName(job->mode()) + ")"));
  }
  if (!codec.empty() && codec != "none") {
    auto spec = ParseCodecSpec(codec);
    ThrowIfError(spec.status());
    by_shape_ = spec->needs_shapes();
  }
  if (by_shape_) return;  // per bucket, once its shapes are known
  auto a = BucketAverager::Create(job->link().ring.get(), codec, job->train().seed(), error_feedback);
  ThrowIfError(a.status());
  averager_ = std::move(a).value();
}

void FrontendBucketReducer::Average(FloatSpan bucket, size_t bucket_index, uint64_t step,
                                    const std::vector<std::vector<int64_t>>& shapes) {
  const std::string where = "bucket " + std::to_string(bucket_index);
  if (!by_shape_) {
    ThrowIfError(averager_->Average(bucket, bucket_index, step).WithContext(where));
    return;
  }
  auto& [made_for, averager] = by_shape_averagers_[bucket_index];
  if (!averager || made_for != shapes) {
    // The bucket's tensors laid out in its buffer, in order (a new layout: a new residual and Q).
    for (const auto& shape : shapes) {
      for (const int64_t d : shape) {
        if (d < 1) ThrowIfError(InvalidArgumentError(where + ": a tensor of shape with a dimension < 1"));
      }
    }
    const std::vector<TensorInfo> layout = PackedLayout(shapes);
    const int64_t floats = LayoutSize(layout);
    if (floats != static_cast<int64_t>(bucket.size())) {
      ThrowIfError(InvalidArgumentError(where + ": its tensors hold " + std::to_string(floats) + " floats, its buffer " +
                                        std::to_string(bucket.size()) + " (the codec needs the bucket's tensor shapes)"));
    }
    auto made = MakeDenseAverager(job_->link().ring.get(), layout,
                                  {.codec = codec_, .seed = job_->train().seed(), .error_feedback = error_feedback_});
    ThrowIfError(made.status());
    averager = std::move(made).value();
    made_for = shapes;
  }
  ThrowIfError(averager->Average(bucket, step).WithContext(where));
}

SyncTraffic FrontendBucketReducer::traffic() const {
  const auto& ring = *job_->link().ring;
  return {ring.bytes_sent(), ring.bytes_received(), ring.shm_bytes_sent(), ring.shm_bytes_received()};
}

namespace {

// The model's tensors as the caller declared them (throws on a bad name or shape).
std::vector<TensorInfo> TensorInfos(const std::vector<TensorSpec>& tensors) {
  std::vector<TensorInfo> infos;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name.find_first_of("\t\n") != std::string::npos) {
      throw StatusError(InvalidArgumentError("parameter name '" + t.name + "': empty, or holds a tab or newline"));
    }
    TensorInfo info;
    info.name = t.name;
    info.shape = t.shape;
    info.size = 1;
    for (int64_t d : t.shape) {
      if (d < 0) throw StatusError(InvalidArgumentError("parameter '" + t.name + "' has a negative dimension"));
      info.size *= d;
    }
    infos.push_back(std::move(info));
  }
  return infos;
}

// A table as a line of the layout text: its name (in brackets, which no parameter name the
// frontend makes has) and [num_ids, dim], so that a table whose size or row dimension differs
// between workers is refused when the job forms, as a parameter's shape is.
TensorSpec TableLine(const TableSpec& t) {
  return {"[table " + t.name + "]", {static_cast<int64_t>(t.num_ids), static_cast<int64_t>(t.dim)}};
}

// Every worker must declare the same tensors and tables: compared against worker 0's, by name and
// shape.
void CheckSameLayout(FrontendJob* job, std::vector<TensorSpec> tensors, const std::vector<TableSpec>& tables) {
  static int layouts = 0;
  for (const TableSpec& t : tables) tensors.push_back(TableLine(t));
  const auto all = job->Gather("layout-" + std::to_string(layouts++), LayoutText(tensors),
                               job->process().heartbeat_timeout() * 30 + 60);
  if (!all.empty()) {
    const auto first = ParseLayoutText(all[0]);
    for (size_t r = 1; r < all.size(); ++r) {
      if (all[r].empty() || all[r] == all[0]) continue;
      throw StatusError(InvalidArgumentError("the workers' models differ: " +
                                             LayoutDifference(first, ParseLayoutText(all[r]), static_cast<int>(r))));
    }
  }
}

// The job's settings, with the wrapped optimizer's instead of the flags' (the PS shards apply
// it; all-reduce and local leave it to PyTorch) and a constant schedule: the caller sends
// its own rate with each step.
// The model's tables: valid (ValidateTableSpecs), and none of what tables do not go with yet (the
// C++ models' refusals: common/config/checks/table_checks.cc and Traits::keyed).
void CheckTables(const config::TrainConfig& c, const std::vector<TableSpec>& tables) {
  ThrowIfError(ValidateTableSpecs(tables));
  if (tables.empty()) return;
  if (c.sync_every() > 0) {
    throw StatusError(InvalidArgumentError("--sync-every: rounds of local steps do not go with embedding tables (table '" +
                                           tables[0].name + "')"));
  }
}

LocalTrainOptions WrappedTrainOptions(const config::TrainConfig& c, const OptimizerSpec& optimizer) {
  LocalTrainOptions train = TrainOptionsFrom(c);
  if (optimizer.kind != "sgd" && optimizer.kind != "adam") {
    throw StatusError(InvalidArgumentError("optimizer kind '" + optimizer.kind + "': sgd or adam"));
  }
  train.optimizer = OptimizerOptions{};
  train.optimizer.kind = optimizer.kind == "adam" ? OptimizerKind::kAdam : OptimizerKind::kSgd;
  train.optimizer.beta1 = optimizer.beta1;
  train.optimizer.beta2 = optimizer.beta2;
  train.optimizer.eps = optimizer.eps;
  train.optimizer.momentum = optimizer.momentum;
  train.optimizer.nesterov = optimizer.nesterov;
  train.optimizer.weight_decay = optimizer.weight_decay;
  train.lr = LrSchedule{};
  train.lr.base = optimizer.lr;
  train.warmup_epochs = 0;
  train.straggler = {};  // the script's loop is its own
  train.micro_batch = 0;
  ThrowIfError(ValidateOptimizerOptions(train.optimizer));
  return train;
}

}  // namespace

FrontendSync::FrontendSync(FrontendJob* job, const std::vector<TensorSpec>& tensors, const OptimizerSpec& optimizer,
                           const std::string& compression, int error_feedback,
                           const std::vector<TableSpec>& tables)
    : job_(job) {
  if (tensors.empty()) throw StatusError(InvalidArgumentError("no parameters to synchronize"));
  std::vector<TensorInfo> infos = TensorInfos(tensors);
  CheckTables(job->train(), tables);
  CheckSameLayout(job, tensors, tables);
  model_ = std::make_unique<ExternalModel>(std::move(infos), tables);

  const config::TrainConfig& c = job->train();
  JobLink& link = job->link();
  LocalTrainOptions train = WrappedTrainOptions(c, optimizer);
  straggler_ = Straggler(*ParseStraggler(c.straggle()), c.straggle_seed());  // Validate() checked it
  std::string compress = compression.empty() ? c.compress() : compression;
  if (compress == "none") compress.clear();
  // --precision=bf16|fp16: the gradient travels in those 16 bits unless a codec is named.
  if (compress.empty()) compress = PrecisionCodec(train.numerics.precision);
  if (!compress.empty()) ThrowIfError(ParseCodecSpec(compress).status());
  if (!compress.empty() && !tables.empty()) {
    throw StatusError(InvalidArgumentError("compression '" + compress + "': embedding tables' rows travel uncompressed (table '" +
                                           tables[0].name + "'); leave the compression and --precision unset"));
  }
  const bool feedback = error_feedback < 0 ? c.error_feedback() : error_feedback > 0;
  if (c.momentum_correction()) {
    throw StatusError(InvalidArgumentError("--momentum-correction: not supported by the Python frontend"));
  }
  const bool ps = IsPsMode(c.mode());
  if (!ps && c.mode() != config::ALLREDUCE) {  // local: the script's own optimizer alone
    tables_ = std::make_unique<FrontendTables>(tables, nullptr);
    return;
  }
  if (ps) {
    auto client = PsClient::Create(link.ctx, link.table, link.rank, model_->layout(), link.scheduler.get());
    ThrowIfError(client.status());
    client_ = std::move(client).value();
  }
  // The sync gradsync-worker would build for these settings (worker/sync/sync_factory.h), with the
  // script's optimizer making each update: PyTorch's optimizer steps before FinishStep (rounds:
  // every step, the outer SGD the sync's own every sync_every steps), all-reduce leaves the
  // averaged gradient for it (apply_update false), the shards update the PS modes' parameters.
  SyncRecipe recipe;
  recipe.ps = ps;
  recipe.local_update = false;
  if (ps) {
    recipe.ps_options = PsOptionsFrom(c, train, link.rank, link.table.workers_size(), link.oversubscribed);
    recipe.ps_options.recovery_timeout_s = 0;  // a PyTorch step cannot be redone for the caller
    recipe.ps_options.codec.compression = compress;
    recipe.ps_options.codec.error_feedback = feedback;
    // fp16's loss scale is the script's (gradsync.torch.GradScaler), which unscales the
    // gradient, or zeroes an overflowed one, before the push.
    recipe.ps_options.train.numerics.precision = Precision::kFp32;
  } else {
    recipe.allreduce_options = AllreduceOptionsFrom(c, train, link.oversubscribed);
    recipe.allreduce_options.codec.compression = compress;
    recipe.allreduce_options.codec.error_feedback = feedback;
    recipe.allreduce_options.apply_update = false;
  }
  const SyncLinks links{.client = client_.get(), .scheduler = link.scheduler.get(), .collective = link.ring.get()};
  BuiltSync built = MakeGradientSync(recipe, model_.get(), links);
  if (built.ps != nullptr) {
    shard_state_ = std::make_unique<FrontendShardState>(client_.get(), built.ps, model_.get(), train.optimizer,
                                                        recipe.ps_options.request_timeout_s);
  }
  sync_ = std::move(built.sync);
  tables_ = std::make_unique<FrontendTables>(tables, sync_.get());
  overlapped_ = built.overlapped;
  kind_ = built.kind;
  if (c.sync_every() > 0) sync_every_ = c.sync_every();
}

double FrontendSync::Straggle(double compute_ms) {
  if (!straggler_.active()) return 0;
  TraceSpan span("straggler delay", "compute");
  return straggler_.Sleep(compute_ms);
}

FrontendSync::~FrontendSync() {
  if (sync_ && in_step_) sync_->AbandonStep();
}

int64_t FrontendSync::Start(int64_t total_steps, int64_t steps_per_epoch) {
  if (!sync_) return 0;
  auto first = sync_->Start({total_steps, std::max<int64_t>(1, steps_per_epoch)});
  ThrowIfError(first.status());
  return *first;
}

void FrontendSync::BeginStep(int64_t step, bool evaluate, float lr) {
  step_lr_ = std::isnan(lr) ? job_->train().lr() : lr;
  if (!sync_) return;
  StepPlan plan;
  plan.step = step;
  plan.evaluate = evaluate;
  plan.lr = lr;
  in_step_ = true;
  {
    TraceSpan span("begin step", "comm", {{"step", static_cast<double>(step)}});
    ThrowIfError(sync_->BeginStep(plan));
  }
  compute_begin_us_ = Trace::on() ? Trace::NowUs() : -1;
}

void FrontendSync::WaitParams(size_t tensor) {
  if (sync_) ThrowIfError(sync_->WaitParams(tensor));
}

void FrontendSync::GradReady(size_t tensor) {
  if (!sync_) return;
  TraceInstant("gradient ready", "compute", {{"tensor", static_cast<double>(tensor)}});
  ThrowIfError(sync_->GradReady(tensor));
}

void FrontendSync::GradAbsent(size_t tensor) {
  if (!sync_) return;
  ThrowIfError(sync_->GradAbsent(tensor));
}

SyncStepStats FrontendSync::FinishStep() {
  const int64_t table_rows = tables_->step_rows();
  if (!sync_) {
    const Status applied = tables_->Finish(step_lr_);
    tables_->Clear();
    ThrowIfError(applied);
    SyncStepStats local;
    local.table_rows = table_rows;
    return local;
  }
  in_step_ = false;
  if (compute_begin_us_ >= 0 && Trace::on()) {
    // What Python did between the two: the user's forward and backward.
    Trace::Complete("forward + backward", "compute", compute_begin_us_, Trace::NowUs() - compute_begin_us_);
  }
  compute_begin_us_ = -1;
  TraceSpan span("finish step", "comm");
  if (Status handed = tables_->Finish(step_lr_); !handed.ok()) {
    tables_->Clear();
    ThrowIfError(handed);
  }
  auto stats = sync_->FinishStep();
  tables_->Clear();
  ThrowIfError(stats.status());
  stats->table_rows = table_rows;
  return *stats;
}

void FrontendSync::AbandonStep() {
  tables_->Clear();
  if (!sync_ || !in_step_) return;
  in_step_ = false;
  sync_->AbandonStep();
}

void FrontendSync::EndTraining(bool evaluate, bool join) {
  if (!sync_) return;
  AbandonStep();
  ThrowIfError(join ? sync_->Leave(evaluate) : sync_->EndTraining(evaluate));
  job_->AlignGathers();
}

SyncTraffic FrontendSync::traffic() const { return sync_ ? sync_->traffic() : SyncTraffic{}; }

FrontendShardState& FrontendSync::shard_state() {
  if (!shard_state_) {
    throw StatusError(InvalidArgumentError("the optimizer state lives in this process in mode " + ModeName(job_->mode()) +
                                           " (the wrapped optimizer's own state_dict holds it)"));
  }
  return *shard_state_;
}

}  // namespace gradsync::python
