#include "experiments/spec/spec.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "common/config/train_config.h"
#include "common/config/train_flags.h"
#include "experiments/spec/link.h"

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

std::string Flag(const std::string& name, const std::string& value) { return "--" + name + "=" + value; }

// A number as the shortest text that reads back exactly (a flag must not round it).
std::string Num(double v) { return ShortestText(v); }

// A run's error: "path:line:col: run 'NAME': problem", at the field's place (where(field)).
class RunError {
 public:
  RunError(const spec::Run& r, const std::function<std::string(const std::string&)>& where) : r_(r), where_(where) {}
  Status operator()(const std::string& field, const std::string& problem) const {
    return InvalidArgumentError(where_(field) + ": run '" + (r_.has_name() ? r_.name() : std::string("?")) + "': " +
                                problem);
  }

 private:
  const spec::Run& r_;
  const std::function<std::string(const std::string&)>& where_;
};

// The run's name, mode and size.
Status ResolveShape(const spec::Run& own, const RunError& fail, RunPlan& p) {
  const spec::Run& r = p.run;
  const config::TrainConfig& t = r.train();
  if (!own.has_name() || own.name().empty()) return fail("name", "every run needs a name");
  p.name = r.name();
  if (!std::regex_match(p.name, std::regex("[A-Za-z0-9][A-Za-z0-9._+-]{0,63}"))) {
    return fail("name", "names are letters, digits and . _ + - (at most 64), not '" + p.name + "'");
  }
  if (!t.has_mode() || t.mode() == config::MODE_UNSPECIFIED) return fail("train.mode", "needs a mode (train { mode: BSP }, SSP, ASP or ALLREDUCE)");
  if (!JoinsJob(t.mode())) return fail("train.mode", "mode LOCAL trains one process: a run is BSP, SSP, ASP or ALLREDUCE");
  p.mode = t.mode();
  const bool allreduce = t.mode() == config::ALLREDUCE;
  if (t.mode() == config::SSP && !t.has_staleness()) return fail("train.mode", "SSP needs a staleness bound (staleness: S)");
  p.staleness = t.staleness();
  if (t.has_straggle()) return fail("train.straggle", "straggle is set per worker: straggler { worker: W multiple: 3 }");
  if (t.has_straggle_seed()) return fail("train.straggle_seed", "straggle_seed is set per worker: straggler { worker: W ... seed: S }");
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
  return OkStatus();
}

// The training settings, the workers' command and flags, the timeout and the trace.
Status ResolveTraining(const RunError& fail, RunPlan& p) {
  const spec::Run& r = p.run;
  const config::TrainConfig& t = r.train();
  // The training settings: the same checks as gradsync-worker's flags, every one reported.
  if (auto errors = Validate(t, Naming::kSpec); !errors.empty()) {
    std::string all;
    for (const ConfigError& e : errors) {
      all += (all.empty() ? "" : "; ") + fail("train." + e.field, e.message).message();
    }
    return InvalidArgumentError(all);
  }
  p.epochs = t.epochs();
  p.batch = t.batch();
  p.max_steps = t.max_steps();
  p.compression = t.compress();
  p.precision = t.precision();
  if (t.error_feedback()) p.compression += "+ef";
  if (t.momentum_correction()) p.compression += "+dgc";
  if (t.compress_pull()) p.compression += "+pull";
  if (r.has_command()) {
    std::istringstream words(r.command());
    for (std::string word; words >> word;) p.command.push_back(word);
    if (p.command.empty()) return fail("command", "command is empty: give the workers' command line (command: \"python3 train.py\")");
  }
  if (r.has_timeout_s()) {
    if (!(r.timeout_s() > 0)) return fail("timeout_s", "timeout_s must be > 0");
    p.timeout_s = r.timeout_s();
  }
  p.trace = r.trace();
  // The workers' flags, through gradsync-worker's own table; gradsync-run gives the mode and the
  // staleness itself (to the servers too).
  p.worker_args.push_back(Flag("run", p.name));
  for (std::string& a : ConfigToFlags(t, {"mode", "staleness"})) p.worker_args.push_back(std::move(a));
  return OkStatus();
}

// A straggler's --straggle flag, and its label in the report ("w1 3x").
Status StragglerFlag(const spec::Straggler& s, const RunError& fail, std::string* flag, std::string* label) {
  switch (s.delay_case()) {
    case spec::Straggler::kFixedMs:
      *flag = "ms:" + Num(s.fixed_ms());
      *label = "+" + Num(s.fixed_ms()) + "ms";
      break;
    case spec::Straggler::kMultiple:
      *flag = "x:" + Num(s.multiple());
      *label = Num(s.multiple()) + "x";
      break;
    case spec::Straggler::kExpMeanMs:
      *flag = "exp:" + Num(s.exp_mean_ms());
      *label = "exp(" + Num(s.exp_mean_ms()) + "ms)";
      break;
    case spec::Straggler::kUniform:
      *flag = "uniform:" + Num(s.uniform().low_ms()) + ":" + Num(s.uniform().high_ms());
      *label = "U(" + Num(s.uniform().low_ms()) + "," + Num(s.uniform().high_ms()) + ")ms";
      break;
    default:
      return fail("straggler", "a straggler needs one of fixed_ms, multiple, exp_mean_ms, uniform");
  }
  return OkStatus();
}

Status ResolveStragglers(const RunError& fail, RunPlan& p) {
  std::set<int> slowed;
  for (const auto& s : p.run.straggler()) {
    if (s.worker() < 0 || s.worker() >= p.workers) {
      return fail("straggler", "straggler worker " + std::to_string(s.worker()) + " is not in [0, " + std::to_string(p.workers) + ")");
    }
    if (!slowed.insert(s.worker()).second) return fail("straggler", "worker " + std::to_string(s.worker()) + " has two stragglers");
    std::string flag, label;
    RETURN_IF_ERROR(StragglerFlag(s, fail, &flag, &label));
    // The worker's own parser checks the ranges (the flag is what the worker gets).
    if (auto parsed = ParseStraggler(flag); !parsed.ok()) return fail("straggler", parsed.status().message());
    config::TrainConfig slow;
    slow.set_straggle(flag);
    slow.set_straggle_seed(s.seed());
    p.worker_extra[s.worker()] = ConfigToFlags(slow);
    p.stragglers[s.worker()] = {flag, s.seed()};
    p.straggler += (p.straggler.empty() ? "" : " ") + ("w" + std::to_string(s.worker()) + " " + label);
  }
  return OkStatus();
}

Status ResolveLink(const RunError& fail, RunPlan& p) {
  const spec::Run& r = p.run;
  if (!r.has_link()) return OkStatus();
  // No rate: the namespaces and veth pairs, unshaped.
  if (!r.link().rate().empty()) {
    if (auto bits = TcRateBitsPerSecond(r.link().rate()); !bits.ok()) return fail("link", "link rate " + std::string(bits.status().message()));
  }
  if (!(r.link().delay_ms() >= 0 && r.link().delay_ms() <= 10000)) return fail("link", "link delay_ms must be in [0, 10000]");
  if (!r.link().congestion_control().empty() && !IsCongestionControlName(r.link().congestion_control())) {
    return fail("link", "link congestion_control '" + r.link().congestion_control() + "' is not a TCP congestion control name (cubic, bbr, reno)");
  }
  p.link = (r.link().rate().empty() ? std::string("unshaped") : r.link().rate()) +
           (r.link().delay_ms() > 0 ? " +" + Num(r.link().delay_ms()) + "ms" : "") +
           (r.link().congestion_control().empty() ? "" : " " + r.link().congestion_control());
  return OkStatus();
}

// Resolves one run and checks it; `where(field)` gives "path:line:col" of a field of this run
// ("train.lr" for a training setting), or of the defaults when the run inherits it.
Result<RunPlan> Plan(const spec::Run& defaults, const spec::Run& own, const std::function<std::string(const std::string&)>& where) {
  RunPlan p;
  p.run = defaults;
  if (own.straggler_size() > 0) p.run.clear_straggler();  // a run's stragglers replace the defaults'
  if (own.sim().tensors_size() > 0 || own.sim().tensor_shapes_size() > 0) {  // and its tensors the defaults'
    p.run.mutable_sim()->clear_tensors();
    p.run.mutable_sim()->clear_tensor_shapes();
  }
  p.run.MergeFrom(own);  // train merges field by field (proto2 presence)
  const RunError fail(p.run, where);
  RETURN_IF_ERROR(ResolveShape(own, fail, p));
  RETURN_IF_ERROR(ResolveTraining(fail, p));
  RETURN_IF_ERROR(ResolveStragglers(fail, p));
  RETURN_IF_ERROR(ResolveLink(fail, p));
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
  const spec::Run& defaults = proto.defaults();
  std::set<std::string> names;
  for (int i = 0; i < proto.run_size(); ++i) {
    const auto* run_tree = tree.GetTreeForNested(exp_desc->FindFieldByName("run"), i);
    const spec::Run& own = proto.run(i);
    // A field of the run, or "train.<field>" of its training settings: where the run sets it,
    // else where the defaults do, else the train block, else the run itself.
    auto where = [&](const std::string& field) {
      const auto* train_f = run_desc->FindFieldByName("train");
      std::string w;
      if (field.rfind("train.", 0) == 0) {
        const auto* f = config::TrainConfig::descriptor()->FindFieldByName(field.substr(6));
        auto nested = [&](const pb::TextFormat::ParseInfoTree* t) {
          return t ? t->GetTreeForNested(train_f, -1) : nullptr;
        };
        const config::TrainConfig& own_train = own.train();
        const bool own_has = f && own_train.GetReflection()->HasField(own_train, f);
        const bool defaults_has = f && defaults.train().GetReflection()->HasField(defaults.train(), f);
        if (own_has) w = at(nested(run_tree), f, -1);
        else if (defaults_has) w = at(nested(defaults_tree), f, -1);
        if (w.empty()) w = at(run_tree, train_f, -1);
        if (w.empty()) w = at(defaults_tree, train_f, -1);
      } else {
        const auto* f = run_desc->FindFieldByName(field);
        const auto* refl = own.GetReflection();
        const bool own_has = f && (f->is_repeated() ? refl->FieldSize(own, f) > 0 : refl->HasField(own, f));
        w = own_has ? at(run_tree, f, -1) : at(defaults_tree, f, -1);
      }
      if (w.empty()) w = at(&tree, exp_desc->FindFieldByName("run"), i);  // the run itself
      return w.empty() ? path : w;
    };
    ASSIGN_OR_RETURN(RunPlan plan, Plan(defaults, own, where));
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
