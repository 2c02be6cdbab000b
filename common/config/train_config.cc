#include "common/config/train_config.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "common/base/host_port.h"
#include "common/config/checks/config_checks.h"
#include "common/config/flags.h"
#include "common/config/checks/table_checks.h"
#include "common/optim/optimizer.h"
#include "common/optim/precision.h"

namespace gradsync {

using config::Mode;
using config::TrainConfig;
using config_checks::Checker;
using config_checks::CheckTables;
using config_checks::Has;
using config_checks::Traits;
namespace pb = google::protobuf;

namespace {

constexpr std::array<std::pair<Mode, const char*>, 5> kModes = {{
    {config::LOCAL, "local"}, {config::BSP, "bsp"}, {config::SSP, "ssp"}, {config::ASP, "asp"}, {config::ALLREDUCE, "allreduce"},
}};

Result<double> StragglerNumber(const std::string& s, const std::string& spec) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used == s.size() && std::isfinite(v) && v >= 0) return v;
  } catch (const std::exception&) {
  }
  return InvalidArgumentError("straggler '" + spec + "': '" + s + "' is not a number >= 0");
}

// Every field of `m` set, to its value (its default where it was not set).
void SetEveryField(pb::Message* m) {
  const auto* d = m->GetDescriptor();
  const auto* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const auto* f = d->field(i);
    if (f->is_repeated() || r->HasField(*m, f)) continue;
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, r->GetInt32(*m, f)); break;
      case pb::FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, r->GetInt64(*m, f)); break;
      case pb::FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(m, f, r->GetUInt32(*m, f)); break;
      case pb::FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, r->GetUInt64(*m, f)); break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(m, f, r->GetFloat(*m, f)); break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, r->GetDouble(*m, f)); break;
      case pb::FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, r->GetBool(*m, f)); break;
      case pb::FieldDescriptor::CPPTYPE_ENUM: r->SetEnumValue(m, f, r->GetEnumValue(*m, f)); break;
      case pb::FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, r->GetString(*m, f)); break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE: break;
    }
  }
}

}  // namespace

const std::string& ModeName(Mode mode) {
  static const std::array<std::string, 6> names = [] {
    std::array<std::string, 6> n;
    for (const auto& [m, name] : kModes) n[static_cast<size_t>(m)] = name;
    return n;
  }();
  const auto i = static_cast<size_t>(mode);
  return i < names.size() ? names[i] : names[0];
}

Result<Mode> ParseMode(std::string_view name) {
  for (const auto& [m, n] : kModes) {
    if (name == n) return m;
  }
  return InvalidArgumentError("mode must be " + std::string(kModeNames) + ", not '" + std::string(name) + "'");
}

std::string FlagName(std::string_view field) {
  std::string s = "--";
  for (char c : field) s += c == '_' ? '-' : c;
  return s;
}

bool IsPsMode(Mode mode) { return mode == config::BSP || mode == config::SSP || mode == config::ASP; }
bool JoinsJob(Mode mode) { return IsPsMode(mode) || mode == config::ALLREDUCE; }

bool OverlapOf(const TrainConfig& c, bool oversubscribed) { return c.has_overlap() ? c.overlap() : !oversubscribed; }

WaitPolicy WaitPolicyOf(const TrainConfig& c) { return {.busy_poll_ms = c.busy_poll_ms(), .pause_spins = 0, .min_polls = 0}; }

std::string EffectiveDataset(const TrainConfig& c) {
  if (c.has_dataset()) return c.dataset();
  if (c.model() == "dlrm") return "click-log";
  return c.model() == "sparse_logreg" ? "sparse-logistic" : "fashion-mnist";
}

std::string OuterName(const TrainConfig& c) {
  if (c.outer_lr() == 1 && c.outer_momentum() == 0) return "local SGD";
  return "DiLoCo lr=" + ShortestText(c.outer_lr()) + " momentum=" + ShortestText(c.outer_momentum()) +
         (c.outer_nesterov() ? " nesterov" : "");
}

Result<StragglerSpec> ParseStraggler(const std::string& spec) {
  StragglerSpec out;
  if (spec.empty() || spec == "none") return out;
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t colon = spec.find(':', start);
    parts.push_back(spec.substr(start, colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  const std::string& kind = parts[0];
  const size_t want = kind == "uniform" ? 3 : 2;
  if ((kind != "ms" && kind != "x" && kind != "exp" && kind != "uniform") || parts.size() != want) {
    return InvalidArgumentError("straggler '" + spec + "': expected none | ms:D | x:F | exp:MEAN | uniform:LO:HI");
  }
  ASSIGN_OR_RETURN(out.a, StragglerNumber(parts[1], spec));
  if (kind == "ms") out.kind = StragglerSpec::Kind::kFixed;
  if (kind == "exp") out.kind = StragglerSpec::Kind::kExponential;
  if (kind == "x") {
    out.kind = StragglerSpec::Kind::kMultiple;
    if (out.a < 1) return InvalidArgumentError("straggler '" + spec + "': the factor must be >= 1");
  }
  if (kind == "uniform") {
    out.kind = StragglerSpec::Kind::kUniform;
    ASSIGN_OR_RETURN(out.b, StragglerNumber(parts[2], spec));
    if (out.b < out.a) return InvalidArgumentError("straggler '" + spec + "': LO must not exceed HI");
  }
  if (out.a > 1e6 || out.b > 1e6) return InvalidArgumentError("straggler '" + spec + "': more than 1000 s per step");
  return out;
}

namespace {

// The mode and the settings that belong to some modes only.
void CheckMode(const TrainConfig& c, const Traits& t, Checker& k) {
  const Mode mode = t.mode;
  if (mode == config::MODE_UNSPECIFIED) k.Add("mode", std::string("{mode} must be ") + kModeNames);
  if (c.has_staleness()) {
    if (mode != config::SSP) k.Add("staleness", "{staleness} applies to {mode=ssp} only ({mode=asp} is unbounded)");
    if (c.staleness() < 0 || c.staleness() > 1000000) k.Add("staleness", "{staleness} must be in [0, 1000000]");
  }
  for (const char* f : {"recovery_timeout", "push_part_mib", "shm", "data_channel", "data_channel_min_mib"}) {
    if (!t.ps && Has(c, f)) k.Add(f, "{" + std::string(f) + "} applies to the PS modes (bsp|ssp|asp)");
  }
  if (c.has_row_cache() && mode != config::SSP) {
    k.Add("row_cache", "{row_cache} applies to {mode=ssp} only (bsp and asp keep no rows: every read asks the shards)");
  }
  for (const char* f : {"overlap", "busy_poll_ms"}) {
    if (!t.joins && Has(c, f)) k.Add(f, "{" + std::string(f) + "} applies to the modes that join a job only");
  }
  if (!(c.push_part_mib() >= 1e-6 && c.push_part_mib() <= 1024)) k.Add("push_part_mib", "{push_part_mib} must be in (0, 1024]");
  if (!(c.data_channel_min_mib() >= 0 && c.data_channel_min_mib() <= 1024)) {
    k.Add("data_channel_min_mib", "{data_channel_min_mib} must be in [0, 1024]");
  }
  if (!(c.busy_poll_ms() >= 0 && c.busy_poll_ms() <= 1000)) k.Add("busy_poll_ms", "{busy_poll_ms} must be in [0, 1000]");
  if (!t.allreduce) {
    for (const char* f : {"bucket_mib", "collective_timeout", "first_bucket_mib", "checkpoint_dir", "checkpoint_every", "resume",
                          "ring_encrypt", "allreduce_algo", "zero", "allreduce_shm"}) {
      if (Has(c, f)) k.Add(f, "{" + std::string(f) + "} applies to {mode=allreduce} only");
    }
  }
}

void CheckDevice(const TrainConfig& c, const Traits& t, Checker& k) {
  if (c.device() != "cpu" && !t.cuda) k.Add("device", "{device} must be cpu or cuda, not '", c.device() + "'");
  if (c.has_gpu() && !t.cuda) k.Add("gpu", "{gpu} applies to {device=cuda}");
  if (c.gpu() < -1) k.Add("gpu", "{gpu} must be >= 0");
  if (t.cuda) {
    if (t.keyed) k.Add("device", "{device=cuda} applies to {model=softmax|mlp}");
    if (c.accumulate() > 1) k.Add("accumulate", "{accumulate} is not supported with {device=cuda}");
    if (t.allreduce && c.compress() != "none") {
      k.Add("compress", "{compress} is not supported with {device=cuda} {mode=allreduce} (NCCL averages fp32 gradients)");
    }
    if (c.has_checkpoint_dir()) k.Add("checkpoint_dir", "{checkpoint_dir} is not supported with {device=cuda} yet");
  }
}

// All-reduce buckets and checkpoints.
void CheckAllReduce(const TrainConfig& c, const Traits& t, Checker& k) {
  if (!(c.bucket_mib() > 0)) k.Add("bucket_mib", "{bucket_mib} must be > 0");
  if (c.zero() < 0 || c.zero() > 2) k.Add("zero", "{zero} must be 0, 1 or 2");
  if (c.zero() > 0 && t.keyed) k.Add("zero", "{zero} applies to dense models (softmax, mlp)");
  if (!IsOneOf(kAllReduceAlgoNames, c.allreduce_algo())) {
    k.Add("allreduce_algo", "{allreduce_algo}: ", "unknown all-reduce algorithm '" + c.allreduce_algo() + "' (expected " +
                                                      kAllReduceAlgoNames + ")");
  }
  if (!(c.first_bucket_mib() > 0)) k.Add("first_bucket_mib", "{first_bucket_mib} must be > 0");
  if (c.checkpoint_every() < 1) k.Add("checkpoint_every", "{checkpoint_every} must be >= 1");
  if ((c.resume() || c.has_checkpoint_every()) && !c.has_checkpoint_dir()) {
    k.Add(c.resume() ? "resume" : "checkpoint_every", "{resume} and {checkpoint_every} need {checkpoint_dir}");
  }
  if (!(c.collective_timeout() > 0)) k.Add("collective_timeout", "{collective_timeout} must be > 0");
}

void CheckCompression(const TrainConfig& c, const Traits& t, Checker& k) {
  auto codec = ParseCodecSpec(c.compress());
  if (!codec.ok()) {
    k.Add("compress", "{compress}: ", codec.status().message());
  } else {
    const bool has_codec = codec->kind != CodecSpec::Kind::kNone;
    if (c.error_feedback() && !has_codec) k.Add("error_feedback", "{error_feedback} needs a {compress} codec");
    if (has_codec && !t.joins) k.Add("compress", "{compress} applies to the modes that join a job (bsp|ssp|asp|allreduce)");
    // Checked here, not first after the worker has joined and loaded its data.
    if (has_codec && t.keyed) k.Add("compress", "{compress} applies to the dense models, not {model=" + c.model() + "}");
    if (c.compress_pull()) {
      if (!has_codec) k.Add("compress_pull", "{compress_pull} needs a {compress} codec");
      if (t.allreduce) k.Add("compress_pull", "{compress_pull} applies to the PS modes (bsp|ssp|asp): all-reduce has no pulls");
    }
    if (!codec->on_ps() && t.ps) {
      // The second factor needs every worker's first averaged: a bsp round in two phases on the
      // shards, which ssp and asp do not have, and the shards cut matrices by range.
      k.Add("compress", "{compress=" + c.compress() +
                            "} applies to {mode=allreduce} (its second factor needs the average of every worker's first)");
    }
    if (!codec->on_device() && t.cuda) k.Add("compress", "{compress=" + c.compress() + "} runs on {device=cpu} only");
    if (c.momentum_correction()) {
      if (!codec->sparse()) k.Add("momentum_correction", "{momentum_correction} needs {compress=topk:R} or randomk:R");
      if (c.error_feedback()) {
        k.Add("momentum_correction", "{momentum_correction} and {error_feedback} contradict each other: DGC keeps its own residual");
      }
    }
  }
  if (c.momentum_correction() && !(c.momentum() > 0) && c.optimizer() != "adam" && c.optimizer() != "lamb") {
    k.Add("momentum_correction", "{momentum_correction} needs {momentum} > 0");
  }
  if (c.momentum_correction() && c.nesterov()) k.Add("momentum_correction", "{momentum_correction} does not combine with {nesterov}");
}

// The model and the data.
void CheckModelAndData(const TrainConfig& c, const Traits& t, Checker& k) {
  const bool sparse_model = t.sparse_model;
  const bool known_model = c.model() == "softmax" || c.model() == "mlp" || sparse_model || t.table_model;
  if (!known_model) k.Add("model", "{model}: ", "unknown model '" + c.model() + "' (expected " + kModelNames + ")");
  if (c.model() == "mlp") {
    if (c.hidden().size() > 256) {
      k.Add("hidden", "{hidden} is a list of sizes, like \"256,128\" (at most 256 characters)");
    } else if (auto h = ParseIntList(c.hidden(), 1, 1 << 20); !h.ok()) {
      k.Add("hidden", "{hidden}: ", h.status().message() + ", e.g. 256,128");
    }
  } else if (c.has_hidden()) {
    k.Add("hidden", "{hidden} applies to {model=mlp} only");
  }
  const std::string dataset = EffectiveDataset(c);
  if (dataset != "fashion-mnist" && dataset != "blobs" && dataset != "sparse-logistic" && dataset != "click-log") {
    k.Add("dataset", "{dataset}: ", "unknown dataset '" + dataset + "' (expected " + kDatasetNames + ")");
  } else if (known_model &&
             (sparse_model != (dataset == "sparse-logistic") || t.table_model != (dataset == "click-log"))) {
    k.Add(c.has_dataset() ? "dataset" : "model",
          "{model=" + c.model() + "} cannot train on {dataset=" + dataset +
              "} (sparse_logreg goes with sparse-logistic, dlrm with click-log, the dense models with the others)");
  }
  CheckTables(c, t, k);
  if ((sparse_model || dataset == "sparse-logistic") && (c.feature_bits() < 4 || c.feature_bits() > 30)) {
    k.Add("feature_bits", "{feature_bits} must be in [4, 30]");
  }
}

void CheckPrecision(const TrainConfig& c, const Traits& t, Checker& k) {
  if (auto precision = ParsePrecision(c.precision()); !precision.ok()) {
    k.Add("precision", "{precision} must be fp32, bf16 or fp16, not '", c.precision() + "'");
  } else if (*precision != Precision::kFp16 && c.has_initial_loss_scale()) {
    k.Add("initial_loss_scale", "{initial_loss_scale} applies to {precision=fp16}");
  } else if (*precision != Precision::kFp32) {
    if (!(std::isfinite(c.initial_loss_scale()) && c.initial_loss_scale() >= 1)) {
      k.Add("initial_loss_scale", "{initial_loss_scale} must be a finite number >= 1, not ", ShortestText(c.initial_loss_scale()));
    }
    if (t.keyed) k.Add("precision", "{precision=" + c.precision() + "} applies to the dense models, not {model=" + c.model() + "}");
    if (*precision == Precision::kFp16 && (c.error_feedback() || c.momentum_correction())) {
      k.Add(c.error_feedback() ? "error_feedback" : "momentum_correction",
            "{precision=fp16} skips the steps whose scaled gradient overflows, which a compression residual would take in: "
            "drop {error_feedback} / {momentum_correction}, or use {precision=bf16}");
    }
    if (t.cuda && t.allreduce && c.zero() > 0) {
      k.Add("zero", "{zero} with {device=cuda} is not supported with {precision=" + c.precision() + "} yet");
    }
  }
}

void CheckAdamBetas(const TrainConfig& c, Checker& k) {
  for (const auto& [field, beta] : {std::pair{"adam_beta1", c.adam_beta1()}, std::pair{"adam_beta2", c.adam_beta2()}}) {
    if (!(beta >= 0 && beta < 1)) k.Add(field, "{" + std::string(field) + "} must be in [0, 1), not ", ShortestText(beta));
  }
  if (!(std::isfinite(c.adam_eps()) && c.adam_eps() > 0)) k.Add("adam_eps", "{adam_eps} must be > 0");
}

// The optimizer and the settings that belong to some optimizers only.
void CheckOptimizer(const TrainConfig& c, const Traits& t, Checker& k) {
  const auto optimizer = ParseOptimizerKind(c.optimizer());
  const bool adam = optimizer.ok() && *optimizer == OptimizerKind::kAdam;
  const bool lars = optimizer.ok() && *optimizer == OptimizerKind::kLars;
  const bool lamb = optimizer.ok() && *optimizer == OptimizerKind::kLamb;
  if (!optimizer.ok()) k.Add("optimizer", "{optimizer} must be sgd, adam, lars or lamb, not '", c.optimizer() + "'");
  if (!(std::isfinite(c.momentum()) && c.momentum() >= 0 && c.momentum() < 1)) {
    k.Add("momentum", "{momentum} must be in [0, 1), not ", ShortestText(c.momentum()));
  }
  if (!(std::isfinite(c.weight_decay()) && c.weight_decay() >= 0)) k.Add("weight_decay", "{weight_decay} must be >= 0");
  if (c.nesterov() && c.momentum() == 0 && !adam && !lars && !lamb) k.Add("nesterov", "{nesterov} needs {momentum} > 0");
  if (lars || lamb) {
    // Layer-wise rates (common/optim/optimizer.h): dense models, the host's or the servers' optimizer.
    const std::string name = lars ? "lars" : "lamb";
    if (lamb && c.has_momentum() && c.momentum() != 0) {
      k.Add("momentum", "{momentum} is SGD's and LARS's: {optimizer=lamb} has {adam_beta1}");
    }
    if (c.nesterov()) k.Add("nesterov", "{nesterov} is SGD's, not {optimizer=" + name + "}'s");
    if (c.momentum_correction()) k.Add("momentum_correction", "{momentum_correction} applies to {optimizer=sgd}");
    if (t.sparse_model) k.Add("optimizer", "{optimizer=" + name + "} applies to the dense models, not {model=sparse_logreg}");
    if (t.cuda && !t.ps) {
      k.Add("optimizer", "{optimizer=" + name + "} with {device=cuda} runs in the PS modes only (the device optimizer is SGD's)");
    }
  }
  if (lars) {
    if (!(std::isfinite(c.trust_coefficient()) && c.trust_coefficient() > 0)) {
      k.Add("trust_coefficient", "{trust_coefficient} must be > 0, not ", ShortestText(c.trust_coefficient()));
    }
  } else if (Has(c, "trust_coefficient")) {
    k.Add("trust_coefficient", "{trust_coefficient} applies to {optimizer=lars}");
  }
  if (lamb) {
    CheckAdamBetas(c, k);
  } else if (adam) {
    // Adam has its own momentum (adam_beta1); SGD's default momentum is simply not used.
    if (c.has_momentum() && c.momentum() != 0) k.Add("momentum", "{momentum} is SGD's: {optimizer=adam} has {adam_beta1}");
    if (c.nesterov()) k.Add("nesterov", "{nesterov} is SGD's, not {optimizer=adam}'s");
    if (c.momentum_correction()) k.Add("momentum_correction", "{momentum_correction} applies to {optimizer=sgd}");
    if (t.sparse_model) k.Add("optimizer", "{optimizer=adam} applies to the dense models, not {model=sparse_logreg}");
    if (t.cuda && !t.ps) {
      k.Add("optimizer", "{optimizer=adam} with {device=cuda} runs in the PS modes only (the device optimizer is SGD's)");
    }
    CheckAdamBetas(c, k);
  } else {
    for (const char* f : {"adam_beta1", "adam_beta2", "adam_eps"}) {
      if (Has(c, f)) k.Add(f, "{" + std::string(f) + "} applies to {optimizer=adam} and {optimizer=lamb}");
    }
  }
}

// The learning rate's schedule, the batch, the length of the run and the timeouts.
void CheckSchedule(const TrainConfig& c, const Traits& t, Checker& k) {
  if (!(c.lr() > 0) || !std::isfinite(c.lr())) k.Add("lr", "{lr} must be > 0");
  if (auto s = ParseLrScheduleKind(c.lr_schedule()); !s.ok()) k.Add("lr_schedule", "{lr_schedule}: ", s.status().message());
  if (c.batch() < 1 || c.batch() > 1000000) k.Add("batch", "{batch} must be in [1, 1000000]");
  if (c.accumulate() < 1 || c.accumulate() > 4096) k.Add("accumulate", "{accumulate} must be in [1, 4096]");
  if (c.accumulate() > 1 && t.keyed) k.Add("accumulate", "{accumulate} applies to the dense models");
  if (c.lr_scaling() != "none" && c.lr_scaling() != "linear") {
    k.Add("lr_scaling", "{lr_scaling} must be none or linear, not '", c.lr_scaling() + "'");
  }
  if (c.base_batch() < 1) k.Add("base_batch", "{base_batch} must be > 0");
  if (c.has_base_batch() && c.lr_scaling() == "none") k.Add("base_batch", "{base_batch} applies to {lr_scaling=linear}");
  if (c.staleness_aware_lr() && t.mode != config::SSP && t.mode != config::ASP) {
    k.Add("staleness_aware_lr", "{staleness_aware_lr} applies to {mode=ssp|asp} (bsp gradients are never stale)");
  }
  if (!(c.warmup_epochs() >= 0 && c.warmup_epochs() <= 1000)) k.Add("warmup_epochs", "{warmup_epochs} must be in [0, 1000]");
  if (c.epochs() < 1 || c.epochs() > 1000000) k.Add("epochs", "{epochs} must be in [1, 1000000]");
  if (c.max_steps() < 0) k.Add("max_steps", "{max_steps} must be >= 0");
  if (c.log_every() < 0) k.Add("log_every", "{log_every} must be >= 0");
  if (c.eval_every() < 0) k.Add("eval_every", "{eval_every} must be >= 0");
  if (auto s = ParseStraggler(c.straggle()); !s.ok()) k.Add("straggle", "{straggle}: ", s.status().message());
  if (c.threads() < 1 || c.threads() > 256) k.Add("threads", "{threads} must be in [1, 256]");
  if (!(c.request_timeout() > 0)) k.Add("request_timeout", "{request_timeout} must be > 0");
  if (!(c.recovery_timeout() >= 0)) k.Add("recovery_timeout", "{recovery_timeout} must be >= 0");
}

// Local SGD and DiLoCo (sync_every): the outer SGD, and the settings it does not combine with yet.
void CheckPeriodic(const TrainConfig& c, const Traits& t, Checker& k) {
  if (c.sync_every() < 0 || c.sync_every() > 1000000) k.Add("sync_every", "{sync_every} must be in [0, 1000000]");
  if (c.sync_every() == 0) {
    for (const char* f : {"outer_lr", "outer_momentum", "outer_nesterov"}) {
      if (Has(c, f)) k.Add(f, "{" + std::string(f) + "} applies to {sync_every} > 0 (local SGD, DiLoCo)");
    }
    return;
  }
  if (!t.joins) k.Add("sync_every", "{sync_every} applies to {mode=bsp|ssp|asp|allreduce}");
  if (!(std::isfinite(c.outer_lr()) && c.outer_lr() > 0)) k.Add("outer_lr", "{outer_lr} must be > 0, not ", ShortestText(c.outer_lr()));
  if (!(std::isfinite(c.outer_momentum()) && c.outer_momentum() >= 0 && c.outer_momentum() < 1)) {
    k.Add("outer_momentum", "{outer_momentum} must be in [0, 1), not ", ShortestText(c.outer_momentum()));
  }
  if (c.outer_nesterov() && c.outer_momentum() == 0) k.Add("outer_nesterov", "{outer_nesterov} needs {outer_momentum} > 0");
  // Each of these changes what a step's exchange is; over rounds of local steps it is not built.
  if (t.keyed) k.Add("sync_every", "{sync_every} applies to the dense models, not {model=" + c.model() + "}");
  if (t.cuda) k.Add("sync_every", "{sync_every} runs on {device=cpu} only");
  if (c.compress_pull()) k.Add("compress_pull", "{compress_pull} does not combine with {sync_every}: a round starts from the exact global model");
  if (c.momentum_correction()) k.Add("momentum_correction", "{momentum_correction} corrects gradients, not {sync_every}'s pseudo-gradients");
  if (c.zero() > 0) k.Add("zero", "{zero} does not combine with {sync_every}");
  if (c.has_checkpoint_dir() || c.resume()) {
    k.Add(c.resume() ? "resume" : "checkpoint_dir", "all-reduce checkpoints do not combine with {sync_every} yet");
  }
}

// Delay-compensated ASGD: the servers' correction of stale gradients.
void CheckDelayCompensation(const TrainConfig& c, const Traits& t, Checker& k) {
  if (!c.has_delay_compensation()) {
    if (c.delay_compensation_adaptive()) k.Add("delay_compensation_adaptive", "{delay_compensation_adaptive} needs {delay_compensation}");
    return;
  }
  if (t.mode != config::SSP && t.mode != config::ASP) {
    k.Add("delay_compensation", "{delay_compensation} applies to {mode=ssp|asp} (bsp gradients are never stale)");
  }
  if (!(std::isfinite(c.delay_compensation()) && c.delay_compensation() >= 0)) {
    k.Add("delay_compensation", "{delay_compensation} must be >= 0, not ", ShortestText(c.delay_compensation()));
  }
  if (t.keyed) k.Add("delay_compensation", "{delay_compensation} applies to the dense models, not {model=" + c.model() + "}");
  if (c.compress_pull()) {
    k.Add("compress_pull", "{compress_pull} does not combine with {delay_compensation}: the correction needs the parameters the worker holds");
  }
  if (c.sync_every() > 0) k.Add("delay_compensation", "{delay_compensation} corrects gradients, not {sync_every}'s pseudo-gradients");
}

}  // namespace

std::vector<ConfigError> Validate(const TrainConfig& c, Naming naming) {
  std::vector<ConfigError> errors;
  Checker k(naming, &errors);
  const Traits t(c);
  CheckMode(c, t, k);
  CheckDevice(c, t, k);
  CheckAllReduce(c, t, k);
  CheckCompression(c, t, k);
  CheckModelAndData(c, t, k);
  CheckPrecision(c, t, k);
  CheckOptimizer(c, t, k);
  CheckSchedule(c, t, k);
  CheckPeriodic(c, t, k);
  CheckDelayCompensation(c, t, k);
  return errors;
}

std::vector<ConfigError> Validate(const TrainConfig& c, const config::WorkerProcess& p, Naming naming) {
  std::vector<ConfigError> errors;
  Checker k(naming, &errors);
  const bool joins = JoinsJob(c.mode());
  if (joins && !p.has_scheduler()) k.Add("scheduler", "{mode=" + ModeName(c.mode()) + "} needs {scheduler}=HOST:PORT");
  if (!joins) {
    for (const char* f : {"scheduler", "rank", "auth_dir"}) {
      if (Has(p, f)) k.Add(f, "{" + std::string(f) + "} applies to the modes that join a job only");
    }
  }
  if (c.mode() != config::ALLREDUCE && p.has_bind()) k.Add("bind", "{bind} applies to {mode=allreduce} only");
  if (p.local_rank() < -1) k.Add("local_rank", "{local_rank} must be >= 0");
  if (c.ring_encrypt() && !p.has_auth_dir()) {
    k.Add("ring_encrypt", "{ring_encrypt} needs {auth_dir}: the ring's keys come from the cluster's keys");
  }
  if (joins && p.has_scheduler()) {
    std::string host;
    uint16_t port = 0;
    if (Status s = ParseHostPort(p.scheduler(), &host, &port); !s.ok()) k.Add("scheduler", "{scheduler}: ", s.message());
  }
  if (joins && (!(p.heartbeat_interval() > 0) || !(p.heartbeat_timeout() > p.heartbeat_interval()))) {
    k.Add("heartbeat_interval", "{heartbeat_interval} must be > 0 and below {heartbeat_timeout}");
  }
  for (auto& e : Validate(c, naming)) errors.push_back(std::move(e));
  return errors;
}

std::string JoinErrors(const std::vector<ConfigError>& errors) {
  std::string s;
  for (const auto& e : errors) s += (s.empty() ? "" : "; ") + e.message;
  return s;
}

std::string JobFingerprint(const TrainConfig& c) {
  TrainConfig f = c;
  f.set_dataset(EffectiveDataset(c));
  SetEveryField(&f);
  // Per process: checked by the scheduler itself (mode, staleness), or free to differ.
  f.clear_mode();
  f.clear_staleness();
  f.clear_data_dir();
  f.clear_data_cache();
  f.clear_threads();
  f.clear_log_every();
  f.clear_eval_every();
  f.clear_straggle();
  f.clear_straggle_seed();
  f.clear_gpu();
  f.clear_request_timeout();
  f.clear_recovery_timeout();
  f.clear_collective_timeout();
  f.clear_checkpoint_dir();
  f.clear_checkpoint_every();
  f.clear_push_part_mib();
  // The optimizer's settings at their effective values: adam and lamb use no momentum, sgd and
  // lars no betas, only lars a trust coefficient.
  if (c.optimizer() == "adam" || c.optimizer() == "lamb") {
    f.set_momentum(0);
  } else {
    f.clear_adam_beta1();
    f.clear_adam_beta2();
    f.clear_adam_eps();
  }
  if (c.optimizer() != "lars") f.clear_trust_coefficient();
  if (c.mode() != config::ALLREDUCE) {  // every rank of a ring alike; PS workers each their own
    f.clear_device();
    f.clear_overlap();
    f.clear_bucket_mib();
    f.clear_first_bucket_mib();
    f.clear_resume();
    f.clear_ring_encrypt();
    f.clear_allreduce_algo();
    f.clear_zero();
    f.clear_allreduce_shm();
  }
  f.clear_shm();  // each worker's own way to its shards
  f.clear_data_channel();
  f.clear_data_channel_min_mib();
  f.clear_busy_poll_ms();
  f.clear_row_cache();  // how each worker reads its rows
  std::string out;
  {
    pb::io::StringOutputStream stream(&out);
    pb::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    f.SerializeToCodedStream(&coded);
  }
  return out;
}

FingerprintDifference DescribeFingerprintDifference(const std::string& mine, const std::string& theirs) {
  TrainConfig a, b;
  FingerprintDifference d;
  if (!a.ParseFromString(mine) || !b.ParseFromString(theirs)) {
    d.mine = "a fingerprint of " + std::to_string(mine.size()) + " bytes";
    d.theirs = "one of " + std::to_string(theirs.size()) + " bytes";
    return d;
  }
  const auto* desc = TrainConfig::descriptor();
  const auto* r = a.GetReflection();
  auto text = [&](const TrainConfig& m, const pb::FieldDescriptor* f) {
    const std::string name = FlagName(f->name());
    return r->HasField(m, f) ? name + "=" + FieldValueText(m, f) : name + " unset";
  };
  for (int i = 0; i < desc->field_count(); ++i) {
    const auto* f = desc->field(i);
    const std::string x = text(a, f), y = text(b, f);
    if (x == y) continue;
    d.mine += (d.mine.empty() ? "" : " ") + x;
    d.theirs += (d.theirs.empty() ? "" : " ") + y;
  }
  return d;
}

std::string ShortestText(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string ShortestText(float v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string FieldValueText(const pb::Message& m, const pb::FieldDescriptor* f) {
  const auto* r = m.GetReflection();
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32: return std::to_string(r->GetInt32(m, f));
    case pb::FieldDescriptor::CPPTYPE_INT64: return std::to_string(r->GetInt64(m, f));
    case pb::FieldDescriptor::CPPTYPE_UINT32: return std::to_string(r->GetUInt32(m, f));
    case pb::FieldDescriptor::CPPTYPE_UINT64: return std::to_string(r->GetUInt64(m, f));
    case pb::FieldDescriptor::CPPTYPE_FLOAT: return ShortestText(r->GetFloat(m, f));
    case pb::FieldDescriptor::CPPTYPE_DOUBLE: return ShortestText(r->GetDouble(m, f));
    case pb::FieldDescriptor::CPPTYPE_BOOL: return r->GetBool(m, f) ? "true" : "false";
    case pb::FieldDescriptor::CPPTYPE_ENUM:
      if (f->enum_type() == config::Mode_descriptor()) return ModeName(static_cast<Mode>(r->GetEnumValue(m, f)));
      return r->GetEnum(m, f)->name();
    case pb::FieldDescriptor::CPPTYPE_STRING: return r->GetString(m, f);
    case pb::FieldDescriptor::CPPTYPE_MESSAGE: break;
  }
  return "";
}

}  // namespace gradsync
