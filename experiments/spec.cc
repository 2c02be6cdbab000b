#include "experiments/spec.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "compression/compressor.h"
#include "experiments/launcher.h"

namespace gradsync {
namespace {

namespace pb = google::protobuf;

class Collector final : public pb::io::ErrorCollector {
 public:
  explicit Collector(std::string path) : path_(std::move(path)) {}
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (first_.empty()) first_ = path_ + ":" + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  void AddWarning(int, pb::io::ColumnNumber, const std::string&) override {}
  const std::string& first() const { return first_; }

 private:
  std::string path_;
  std::string first_;
};

// Strings matched by a std::regex are bounded first: libstdc++'s matcher recurses once per
// character and overflows the stack on a long enough string (found by fuzz/fuzz_spec).
constexpr size_t kMaxMatchedChars = 256;

std::string Flag(const std::string& name, const std::string& value) { return "--" + name + "=" + value; }

std::string Num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

const char* ModeName(spec::Mode m) {
  switch (m) {
    case spec::BSP: return "bsp";
    case spec::SSP: return "ssp";
    case spec::ASP: return "asp";
    case spec::ALLREDUCE: return "allreduce";
    default: return "";
  }
}

// Resolves one run and checks it; `where(field)` gives "path:line:col" of a field of this run
// (or of the defaults, when the run inherits it).
Result<RunPlan> Plan(const spec::Run& defaults, const spec::Run& own, const std::function<std::string(const std::string&)>& where) {
  RunPlan p;
  p.run = defaults;
  if (own.straggler_size() > 0) p.run.clear_straggler();  // a run's stragglers replace the defaults'
  p.run.MergeFrom(own);
  const spec::Run& r = p.run;
  auto fail = [&](const std::string& field, const std::string& problem) {
    return InvalidArgumentError(where(field) + ": run '" + (r.has_name() ? r.name() : std::string("?")) + "': " + problem);
  };
  if (!own.has_name() || own.name().empty()) return fail("name", "every run needs a name");
  p.name = r.name();
  if (!std::regex_match(p.name, std::regex("[A-Za-z0-9][A-Za-z0-9._+-]{0,63}"))) {
    return fail("name", "names are letters, digits and . _ + - (at most 64), not '" + p.name + "'");
  }
  if (!r.has_mode() || r.mode() == spec::MODE_UNSPECIFIED) return fail("mode", "needs a mode (BSP, SSP, ASP or ALLREDUCE)");
  p.mode = ModeName(r.mode());
  const bool allreduce = r.mode() == spec::ALLREDUCE;
  if (r.has_staleness()) {
    if (r.mode() != spec::SSP) return fail("staleness", "staleness applies to mode SSP only (ASP is unbounded)");
    if (r.staleness() < 0 || r.staleness() > 1000000) return fail("staleness", "staleness must be in [0, 1000000]");
  } else if (r.mode() == spec::SSP) {
    return fail("mode", "SSP needs a staleness bound (staleness: S)");
  }
  p.staleness = r.staleness();
  p.workers = r.has_workers() ? r.workers() : 1;
  if (p.workers < 1 || p.workers > 64) return fail("workers", "workers must be in [1, 64]");
  if (allreduce) {
    // (a servers default for the PS runs of the spec does not apply here)
    if (own.has_servers() && own.servers() != 0) return fail("servers", "ALLREDUCE runs without servers");
    p.servers = 0;
  } else {
    p.servers = r.has_servers() ? r.servers() : 1;
    if (p.servers < 1 || p.servers > 16) return fail("servers", "servers must be in [1, 16]");
  }
  auto& args = p.worker_args;
  args.push_back(Flag("run", p.name));
  if (r.has_model()) {
    if (r.model() != "mlp" && r.model() != "softmax" && r.model() != "sparse_logreg") {
      return fail("model", "unknown model '" + r.model() + "' (mlp, softmax or sparse_logreg)");
    }
    args.push_back(Flag("model", r.model()));
  }
  if (r.has_hidden()) {
    if (r.hidden().size() > kMaxMatchedChars || !std::regex_match(r.hidden(), std::regex("[0-9]+(,[0-9]+)*"))) {
      return fail("hidden", "hidden is a list of sizes, like \"256,128\" (at most " + std::to_string(kMaxMatchedChars) + " characters)");
    }
    args.push_back(Flag("hidden", r.hidden()));
  }
  if (r.has_dataset()) {
    if (r.dataset() != "fashion-mnist" && r.dataset() != "blobs" && r.dataset() != "sparse-logistic") {
      return fail("dataset", "unknown dataset '" + r.dataset() + "' (fashion-mnist, blobs or sparse-logistic)");
    }
    args.push_back(Flag("dataset", r.dataset()));
  }
  p.epochs = r.has_epochs() ? r.epochs() : 10;
  if (p.epochs < 1 || p.epochs > 10000) return fail("epochs", "epochs must be in [1, 10000]");
  args.push_back(Flag("epochs", std::to_string(p.epochs)));
  p.batch = r.has_batch() ? r.batch() : 64;
  if (p.batch < 1 || p.batch > 1000000) return fail("batch", "batch must be in [1, 1000000]");
  args.push_back(Flag("batch", std::to_string(p.batch)));
  p.max_steps = r.max_steps();
  if (p.max_steps < 0) return fail("max_steps", "max_steps must be >= 0");
  if (p.max_steps > 0) args.push_back(Flag("max-steps", std::to_string(p.max_steps)));
  if (r.has_lr()) {
    if (!(r.lr() > 0) || !std::isfinite(r.lr())) return fail("lr", "lr must be > 0");
    args.push_back(Flag("lr", Num(r.lr())));
  }
  if (r.has_lr_schedule()) {
    if (r.lr_schedule() != "constant" && r.lr_schedule() != "cosine") return fail("lr_schedule", "lr_schedule is constant or cosine");
    args.push_back(Flag("lr-schedule", r.lr_schedule()));
  }
  if (r.has_momentum()) {
    if (!(r.momentum() >= 0 && r.momentum() < 1)) return fail("momentum", "momentum must be in [0, 1)");
    args.push_back(Flag("momentum", Num(r.momentum())));
  }
  if (r.has_seed()) args.push_back(Flag("seed", std::to_string(r.seed())));
  // Compression.
  const std::string codec = r.has_compress() ? r.compress() : "none";
  auto c = CreateCompressor(codec, 0);
  if (!c.ok()) return fail("compress", c.status().message());
  p.compression = codec;
  if (*c) args.push_back(Flag("compress", codec));
  if (r.error_feedback()) {
    if (!*c) return fail("error_feedback", "error_feedback needs a codec (compress)");
    if (r.momentum_correction()) return fail("error_feedback", "error_feedback and momentum_correction contradict each other");
    args.push_back("--error-feedback");
    p.compression += "+ef";
  }
  if (r.momentum_correction()) {
    if (!*c || !(*c)->sparse()) return fail("momentum_correction", "momentum_correction needs compress topk:R or randomk:R");
    args.push_back("--momentum-correction");
    p.compression += "+dgc";
  }
  if (r.compress_pull()) {
    if (!*c) return fail("compress_pull", "compress_pull needs a codec (compress)");
    if (allreduce) return fail("compress_pull", "compress_pull applies to the PS modes: all-reduce has no pulls");
    args.push_back("--compress-pull");
    p.compression += "+pull";
  }
  if (r.has_eval_every()) {
    if (r.eval_every() < 0) return fail("eval_every", "eval_every must be >= 0");
    args.push_back(Flag("eval-every", std::to_string(r.eval_every())));
  }
  if (r.has_timeout_s()) {
    if (!(r.timeout_s() > 0)) return fail("timeout_s", "timeout_s must be > 0");
    p.timeout_s = r.timeout_s();
  }
  for (const auto& a : r.worker_args()) {
    const char* owned = LauncherOwnedFlag(a);
    for (const char* mine : {"--run", "--straggle"}) {  // set per run and per worker from the spec
      if (!owned && (a == mine || a.rfind(std::string(mine) + "=", 0) == 0 || a.rfind(std::string(mine) + "-", 0) == 0)) owned = mine;
    }
    if (owned) return fail("worker_args", std::string(owned) + " is set by gradsync-run; leave it out of worker_args");
    if (a.rfind("--", 0) != 0) return fail("worker_args", "'" + a + "' is not a flag (--name=value)");
    args.push_back(a);
  }
  // Stragglers.
  std::set<int> slowed;
  for (const auto& s : r.straggler()) {
    if (s.worker() < 0 || s.worker() >= p.workers) {
      return fail("straggler", "straggler worker " + std::to_string(s.worker()) + " is not in [0, " + std::to_string(p.workers) + ")");
    }
    if (!slowed.insert(s.worker()).second) return fail("straggler", "worker " + std::to_string(s.worker()) + " has two stragglers");
    std::string flag, label;
    switch (s.delay_case()) {
      case spec::Straggler::kFixedMs:
        if (!(s.fixed_ms() >= 0 && s.fixed_ms() <= 1e6)) return fail("straggler", "fixed_ms must be in [0, 1e6]");
        flag = "ms:" + Num(s.fixed_ms());
        label = "+" + Num(s.fixed_ms()) + "ms";
        break;
      case spec::Straggler::kMultiple:
        if (!(s.multiple() >= 1 && s.multiple() <= 1000)) return fail("straggler", "multiple must be in [1, 1000]");
        flag = "x:" + Num(s.multiple());
        label = Num(s.multiple()) + "x";
        break;
      case spec::Straggler::kExpMeanMs:
        if (!(s.exp_mean_ms() >= 0 && s.exp_mean_ms() <= 1e6)) return fail("straggler", "exp_mean_ms must be in [0, 1e6]");
        flag = "exp:" + Num(s.exp_mean_ms());
        label = "exp(" + Num(s.exp_mean_ms()) + "ms)";
        break;
      case spec::Straggler::kUniform:
        if (!(s.uniform().low_ms() >= 0 && s.uniform().low_ms() <= s.uniform().high_ms() && s.uniform().high_ms() <= 1e6)) {
          return fail("straggler", "uniform needs 0 <= low_ms <= high_ms <= 1e6");
        }
        flag = "uniform:" + Num(s.uniform().low_ms()) + ":" + Num(s.uniform().high_ms());
        label = "U(" + Num(s.uniform().low_ms()) + "," + Num(s.uniform().high_ms()) + ")ms";
        break;
      default:
        return fail("straggler", "a straggler needs one of fixed_ms, multiple, exp_mean_ms, uniform");
    }
    p.worker_extra[s.worker()] = {Flag("straggle", flag), Flag("straggle-seed", std::to_string(s.seed()))};
    p.straggler += (p.straggler.empty() ? "" : " ") + ("w" + std::to_string(s.worker()) + " " + label);
  }
  // The link.
  if (r.has_link()) {
    if (r.link().rate().size() > kMaxMatchedChars ||
        !std::regex_match(r.link().rate(), std::regex("[0-9]+(\\.[0-9]+)?(bit|kbit|mbit|gbit)"))) {
      return fail("link", "link rate '" + r.link().rate() + "' is not a tc rate like 1gbit, 100mbit or 500kbit");
    }
    if (!(r.link().delay_ms() >= 0 && r.link().delay_ms() <= 10000)) return fail("link", "link delay_ms must be in [0, 10000]");
    p.link = r.link().rate() + (r.link().delay_ms() > 0 ? " +" + Num(r.link().delay_ms()) + "ms" : "");
  }
  return p;
}

}  // namespace

Result<Experiment> ParseExperiment(const std::string& text, const std::string& path) {
  spec::Experiment proto;
  pb::TextFormat::Parser parser;
  Collector errors(path);
  parser.RecordErrorsTo(&errors);
  pb::TextFormat::ParseInfoTree tree;
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(text, &proto)) {
    return InvalidArgumentError(errors.first().empty() ? path + ": not a valid experiment spec" : errors.first());
  }
  const auto* exp_desc = spec::Experiment::descriptor();
  const auto* run_desc = spec::Run::descriptor();
  auto at = [&](const pb::TextFormat::ParseInfoTree* t, const pb::FieldDescriptor* f, int index) -> std::string {
    if (!t || !f) return "";
    auto loc = t->GetLocation(f, f->is_repeated() ? (index < 0 ? 0 : index) : -1);
    if (loc.line < 0) return "";
    return path + ":" + std::to_string(loc.line + 1) + ":" + std::to_string(loc.column + 1);
  };
  Experiment e;
  e.path = path;
  e.name = proto.name();
  auto top = [&](const std::string& field) {
    std::string w = at(&tree, exp_desc->FindFieldByName(field), -1);
    return w.empty() ? path : w;
  };
  if (!std::regex_match(e.name, std::regex("[A-Za-z0-9][A-Za-z0-9._-]{0,63}"))) {
    return InvalidArgumentError(top("name") + ": the experiment needs a name (letters, digits, . _ -), not '" + e.name + "'");
  }
  e.description = proto.description();
  if (proto.target_accuracy() != 0) {
    if (!(proto.target_accuracy() > 0 && proto.target_accuracy() <= 1)) {
      return InvalidArgumentError(top("target_accuracy") + ": target_accuracy is a fraction in (0, 1]");
    }
    e.target_accuracy = proto.target_accuracy();
  }
  if (proto.run_size() == 0) return InvalidArgumentError(path + ": the experiment has no runs");
  const auto* defaults_tree = tree.GetTreeForNested(exp_desc->FindFieldByName("defaults"), -1);
  std::set<std::string> names;
  for (int i = 0; i < proto.run_size(); ++i) {
    const auto* run_tree = tree.GetTreeForNested(exp_desc->FindFieldByName("run"), i);
    const spec::Run& own = proto.run(i);
    auto where = [&](const std::string& field) {
      const auto* f = run_desc->FindFieldByName(field);
      const auto* refl = own.GetReflection();
      const bool own_has = f && (f->is_repeated() ? refl->FieldSize(own, f) > 0 : refl->HasField(own, f));
      std::string w = own_has ? at(run_tree, f, -1) : at(defaults_tree, f, -1);
      if (w.empty()) w = at(&tree, exp_desc->FindFieldByName("run"), i);  // the run itself
      return w.empty() ? path : w;
    };
    ASSIGN_OR_RETURN(RunPlan plan, Plan(proto.defaults(), own, where));
    if (!names.insert(plan.name).second) return InvalidArgumentError(where("name") + ": two runs are named '" + plan.name + "'");
    e.runs.push_back(std::move(plan));
  }
  return e;
}

Result<Experiment> LoadExperiment(const std::string& path) {
  std::ifstream f(path);
  if (!f) return NotFoundError(path + ": cannot open the spec");
  std::stringstream text;
  text << f.rdbuf();
  return ParseExperiment(text.str(), path);
}

}  // namespace gradsync
