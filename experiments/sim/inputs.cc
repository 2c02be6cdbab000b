#include "experiments/sim/inputs.h"

#include <algorithm>
#include <exception>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/config/flags.h"
#include "common/obs/metrics.h"
#include "experiments/trace/trace_merge.h"

namespace gradsync::sim {
namespace {

constexpr int64_t kFashionInputs = 784, kFashionClasses = 10;

// A metrics file opened and its header checked; `field` names the setting that gave it.
Result<std::ifstream> OpenMetrics(const std::string& path, const std::string& field) {
  std::ifstream f(path);
  if (!f) {
    return NotFoundError(path + ": cannot read (" + field +
                         ": the metrics of a real run, which gradsync-run writes; run the spec that measures it "
                         "first, e.g. gradsync-run experiments/specs/sim_measure.textproto)");
  }
  std::string line;
  std::getline(f, line);
  if (line != MetricsWriter::kHeader)
    return DataLossError(path + ": not a metrics file (its header is '" + line + "')");
  return f;
}

}  // namespace

Result<double> MedianComputeMs(const std::string& path) {
  ASSIGN_OR_RETURN(std::ifstream f, OpenMetrics(path, "sim.compute_from"));
  std::string line;
  std::vector<double> ms;
  while (std::getline(f, line)) {
    auto v = SplitCsv(line);
    if (v.size() != kMetricsColumns || !v[kColTestAccuracy].empty() || v[kColCompute].empty()) continue;
    try {
      ms.push_back(std::stod(v[kColCompute]));
    } catch (const std::exception&) {
      return DataLossError(path + ": a row does not parse: " + line);
    }
  }
  if (ms.empty()) return DataLossError(path + ": no training rows (sim.compute_from)");
  return Median(std::move(ms));
}

Result<std::vector<AccuracyPoint>> AccuracyCurve(const std::string& path) {
  ASSIGN_OR_RETURN(std::ifstream f, OpenMetrics(path, "sim.accuracy_from"));
  std::string line;
  std::vector<AccuracyPoint> curve;
  while (std::getline(f, line)) {
    auto v = SplitCsv(line);
    if (v.size() != kMetricsColumns || v[kColTestAccuracy].empty() || v[kColWorker] != "0") continue;
    try {
      curve.push_back({std::stoll(v[kColStep]), std::stod(v[kColTestAccuracy])});
    } catch (const std::exception&) {
      return DataLossError(path + ": a row does not parse: " + line);
    }
  }
  if (curve.empty()) return DataLossError(path + ": no evaluation rows (sim.accuracy_from)");
  std::stable_sort(curve.begin(), curve.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return curve;
}

double AccuracyAt(const std::vector<AccuracyPoint>& curve, int64_t step) {
  if (step <= curve.front().step) return curve.front().accuracy;
  for (size_t i = 1; i < curve.size(); ++i) {
    if (step <= curve[i].step) {
      const auto& a = curve[i - 1];
      const auto& b = curve[i];
      const double f = static_cast<double>(step - a.step) / static_cast<double>(std::max<int64_t>(1, b.step - a.step));
      return a.accuracy + f * (b.accuracy - a.accuracy);
    }
  }
  return curve.back().accuracy;
}

Result<std::vector<std::vector<int64_t>>> ModelShapes(const config::TrainConfig& t) {
  std::vector<int64_t> widths{kFashionInputs};
  if (t.model() == "mlp") {
    ASSIGN_OR_RETURN(std::vector<int64_t> hidden, ParseIntList(t.hidden(), 1, 1 << 20));
    widths.insert(widths.end(), hidden.begin(), hidden.end());
  } else if (t.model() != "softmax") {
    return InvalidArgumentError("model '" + t.model() +
                                "': give its tensors (sim { tensors: ... } floats each, or tensor_shapes: "
                                "[\"32x1x5x5\", ...]) in forward order");
  }
  if (t.has_dataset() && t.dataset() != "fashion-mnist") {
    return InvalidArgumentError("dataset '" + t.dataset() + "': give the model's tensors (sim { tensors: ... })");
  }
  widths.push_back(kFashionClasses);
  std::vector<std::vector<int64_t>> shapes;
  for (size_t i = 1; i < widths.size(); ++i) {
    shapes.push_back({widths[i - 1], widths[i]});
    shapes.push_back({widths[i]});
  }
  return shapes;
}

Result<std::vector<int64_t>> ParseTensorShape(const std::string& text) {
  std::vector<int64_t> shape;
  size_t at = 0;
  while (true) {
    const size_t x = text.find('x', at);
    const std::string part = text.substr(at, x == std::string::npos ? std::string::npos : x - at);
    const bool digits = !part.empty() && part.size() <= 12 &&
                        std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int64_t d = digits ? std::stoll(part) : 0;
    if (d < 1) {
      return InvalidArgumentError("sim.tensor_shapes: '" + text +
                                  "' is not a shape (dimensions >= 1 joined by 'x', e.g. \"64x32x5x5\")");
    }
    shape.push_back(d);
    if (x == std::string::npos) break;
    at = x + 1;
  }
  int64_t size = 1;
  for (int64_t d : shape) {
    if (size > (int64_t{1} << 40) / d) return InvalidArgumentError("sim.tensor_shapes: '" + text + "' is too large");
    size *= d;
  }
  return shape;
}

namespace {

// An all-reduce worker's decode spans of all-gathered buckets (BucketAverager's "decode", with
// its `payloads`): microseconds per payload and float. The floats are the span's `values`, or,
// in traces written before it had them, those of the "all-reduce bucket" span around it.
std::vector<double> GatherDecodeTimes(const LoadedTrace& trace) {
  std::map<std::pair<int, int>, std::vector<const TraceEvent*>> buckets;  // per thread, in start order
  for (const TraceEvent& e : trace.events) {
    if (e.name == "all-reduce bucket" && !e.instant) buckets[{e.process, e.thread}].push_back(&e);
  }
  for (auto& [thread, spans] : buckets) {
    std::sort(spans.begin(), spans.end(), [](const TraceEvent* a, const TraceEvent* b) { return a->ts_us < b->ts_us; });
  }
  std::vector<double> out;
  for (const TraceEvent& e : trace.events) {
    const double payloads = e.Arg("payloads");
    if (e.name != "decode" || e.instant || payloads <= 0) continue;
    double values = e.Arg("values");
    if (values <= 0) {
      const auto thread = buckets.find({e.process, e.thread});
      if (thread == buckets.end()) continue;
      const auto& spans = thread->second;
      auto it = std::upper_bound(spans.begin(), spans.end(), e.ts_us,
                                 [](double ts, const TraceEvent* b) { return ts < b->ts_us; });
      if (it == spans.begin() || (*std::prev(it))->end_us() < e.end_us()) continue;
      values = (*std::prev(it))->Arg("floats");
    }
    if (values > 0) out.push_back(e.dur_us / (payloads * values));
  }
  return out;
}

}  // namespace

Status CodecTimesFromTrace(const std::string& path, SimSettings* s) {
  ASSIGN_OR_RETURN(LoadedTrace trace, LoadTrace(path));
  std::vector<double> worker, server;
  for (const TraceEvent& e : trace.events) {
    if (e.name != "encode" || e.instant) continue;
    const double values = e.Arg("values");
    if (values <= 0) continue;
    // The encode's own CPU time where the span has it: its wall time also holds the time other
    // processes had the core, which the simulator's CPU model shares out itself.
    const double cpu_us = e.Arg("cpu_us");
    const std::string& who = trace.processes.at(static_cast<size_t>(e.process));
    (who.rfind("worker", 0) == 0 ? worker : who.rfind("server", 0) == 0 ? server : worker)
        .push_back((cpu_us >= 0 ? cpu_us : e.dur_us) / values);
  }
  if (worker.empty())
    return InvalidArgumentError(path +
                                ": no worker encode spans with values (sim.codec_from needs a traced compressed run)");
  s->encode_us_per_float = Median(std::move(worker));
  if (!server.empty()) s->pull_encode_us_per_float = Median(std::move(server));
  if (std::vector<double> gather = GatherDecodeTimes(trace); !gather.empty()) {
    s->gather_decode_us_per_float = Median(std::move(gather));
  }
  s->codec_source = path;
  return OkStatus();
}

}  // namespace gradsync::sim
