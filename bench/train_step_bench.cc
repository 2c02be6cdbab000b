// gradsync-bench-train-step: samples/s of one training step (forward, softmax cross-entropy,
// backward, plain SGD update) for softmax regression and the MLP, against PyTorch measured in
// the same run (bench/torch_train_step.py, when /usr/bin/python3 can import torch).
//
// Method: 16 fixed random batches cycled (no data loading in the timing), `warmup` steps, then
// `repeats` timed runs of `iters` steps; samples/s per run = iters * batch / seconds; the table
// shows the median (and min..max) over runs. Both sides use OpenBLAS with the same thread count.
// --precision=bf16|fp16 runs our side in that precision (16-bit operands rounded in place, fp32
// sgemm: what 16 bits cost on a CPU whose BLAS has no 16-bit GEMM); PyTorch's side stays fp32.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/random_batches.h"
#include "common/base/numeric/blas_threads.h"
#include "common/base/check.h"
#include "common/base/clock.h"
#include "common/config/flags.h"
#include "common/optim/optimizer.h"
#include "models/model.h"

namespace gradsync {
namespace {

struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats Summarize(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

std::vector<double> RunGradsync(const std::string& model_name, const std::vector<int64_t>& hidden,
                                int64_t batch, int warmup, int iters, int repeats, Precision precision) {
  ModelOptions mo;
  mo.name = model_name;
  mo.hidden = hidden;
  mo.precision = precision;
  auto model = std::move(CreateModel(mo)).value();
  model->Initialize(0);
  Optimizer opt({}, model->num_params());
  const RandomBatches batches(batch);
  auto step = [&](int i) {
    model->ForwardBackward(batches.Get(i));
    opt.Step(model->params(), model->grads(), 0.01f);
  };
  for (int i = 0; i < warmup; ++i) step(i);
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    Stopwatch sw;
    for (int i = 0; i < iters; ++i) step(i);
    rates.push_back(static_cast<double>(iters) * static_cast<double>(batch) / sw.Seconds());
  }
  return rates;
}

// Runs the PyTorch twin; returns its per-repeat rates, or empty (with a note) if unavailable.
std::vector<double> RunTorch(const std::string& python, const std::string& script,
                             const std::string& model, const std::string& hidden, int64_t batch,
                             int threads, int warmup, int iters, int repeats, std::string* version,
                             std::string* why) {
  std::ostringstream cmd;
  cmd << python << " " << script << " --model " << model << " --hidden " << hidden << " --batch "
      << batch << " --threads " << threads << " --warmup " << warmup << " --iters " << iters
      << " --repeats " << repeats << " 2>&1";
  FILE* p = popen(cmd.str().c_str(), "r");
  if (!p) return {};
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  if (pclose(p) != 0) {
    // Its last line says why (no torch, or its BLAS would not run on `threads` threads).
    while (!out.empty() && out.back() == '\n') out.pop_back();
    *why = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
    return {};
  }
  // Tiny parser for the one JSON line: "torch": "x", "samples_per_s": [a, b, ...]
  std::vector<double> rates;
  auto v = out.find("\"torch\": \"");
  if (v != std::string::npos) *version = out.substr(v + 10, out.find('"', v + 10) - v - 10);
  // (The script's stderr now shares the pipe: look for the rates after their key, not for the
  // first bracket, which a warning line may hold.)
  const auto key = out.find("\"samples_per_s\": [");
  if (key == std::string::npos) return {};
  auto lb = out.find('[', key), rb = out.find(']', key);
  if (lb == std::string::npos || rb == std::string::npos) return {};
  std::stringstream ss(out.substr(lb + 1, rb - lb - 1));
  std::string item;
  while (std::getline(ss, item, ',')) rates.push_back(std::stod(item));
  return rates;
}

int Main(int argc, char** argv) {
  FlagParser flags("gradsync-bench-train-step",
                   "Training-step throughput (samples/s) of gradsync's CPU models vs PyTorch, "
                   "measured in the same run.");
  flags.options().add_options()
      ("models", po::value<std::string>()->default_value("softmax,mlp"), "models to time")
      ("hidden", po::value<std::string>()->default_value("256,128"), "mlp hidden sizes")
      ("batches", po::value<std::string>()->default_value("64,256,1024"), "batch sizes")
      ("threads", po::value<int>()->default_value(1), "BLAS threads (both sides)")
      ("warmup", po::value<int>()->default_value(50), "untimed steps first")
      ("iters", po::value<int>()->default_value(200), "steps per timed run")
      ("repeats", po::value<int>()->default_value(7), "timed runs (the median is reported)")
      ("precision", po::value<std::string>()->default_value("fp32"), "fp32|bf16|fp16: our side's precision (PyTorch's stays fp32)")
      ("torch", po::value<std::string>()->default_value("auto"), "auto|off: run the PyTorch baseline")
      ("python", po::value<std::string>()->default_value("/usr/bin/python3"), "python with torch")
      ("script", po::value<std::string>()->default_value(""), "path of torch_train_step.py (default: next to the sources)")
      ("json", po::value<std::string>(), "also write the results as JSON here");
  auto vm = flags.ParseOrExit(argc, argv);
  const int threads = vm["threads"].as<int>(), warmup = vm["warmup"].as<int>();
  const int iters = vm["iters"].as<int>(), repeats = vm["repeats"].as<int>();
  if (threads < 1 || warmup < 0 || iters < 1 || repeats < 1) flags.Fail("--threads, --iters and --repeats must be >= 1, --warmup >= 0");
  const std::string torch_mode = vm["torch"].as<std::string>();
  if (torch_mode != "auto" && torch_mode != "off") flags.Fail("--torch must be auto or off");
  std::string script = vm["script"].as<std::string>();
  if (script.empty()) script = std::string(GRADSYNC_SOURCE_DIR) + "/bench/torch_train_step.py";
  const std::string hidden_text = vm["hidden"].as<std::string>();
  auto hidden = ParseIntList(hidden_text, 1, 1 << 20);
  if (!hidden.ok()) flags.Fail("--hidden: " + hidden.status().message());
  auto batches = ParseIntList(vm["batches"].as<std::string>(), 1, 1 << 20);
  if (!batches.ok()) flags.Fail("--batches: " + batches.status().message());
  std::vector<std::string> models;
  {
    std::stringstream ss(vm["models"].as<std::string>());
    std::string m;
    while (std::getline(ss, m, ',')) {
      if (m != "softmax" && m != "mlp") flags.Fail("--models: only softmax and mlp, not '" + m + "'");
      models.push_back(m);
    }
  }
  auto precision = ParsePrecision(vm["precision"].as<std::string>());
  if (!precision.ok()) flags.Fail("--precision: " + precision.status().message());
  SetBlasThreads(threads);

  // Both sides run every sgemm on `threads` OpenBLAS threads (the PyTorch script checks its own).
  GRADSYNC_CHECK(BlasThreads() == threads) << "OpenBLAS runs " << BlasThreads() << " threads, not " << threads;
  std::printf("# gradsync-bench-train-step: threads=%d (OpenBLAS, both sides) warmup=%d iters=%d repeats=%d precision=%s (ours; PyTorch fp32) (samples/s, median [min..max])\n",
              threads, warmup, iters, repeats, PrecisionName(*precision));
  std::printf("%-8s %6s %28s %28s %7s\n", "model", "batch", "gradsync", "pytorch", "ratio");
  std::ostringstream json;
  json << "{\"threads\": " << threads << ", \"rows\": [";
  std::string torch_version, torch_why;
  bool torch_missing = false;
  double worst_ratio = 1e300;
  for (size_t mi = 0; mi < models.size(); ++mi) {
    for (size_t bi = 0; bi < batches->size(); ++bi) {
      const auto& m = models[mi];
      const int64_t b = (*batches)[bi];
      Stats g = Summarize(RunGradsync(m, *hidden, b, warmup, iters, repeats, *precision));
      std::vector<double> t_rates;
      if (torch_mode == "auto" && !torch_missing) {
        t_rates = RunTorch(vm["python"].as<std::string>(), script, m, hidden_text, b, threads,
                           warmup, iters, repeats, &torch_version, &torch_why);
        torch_missing = t_rates.empty();
      }
      Stats t = Summarize(t_rates);
      char gcol[64], tcol[64] = "-", rcol[16] = "-";
      std::snprintf(gcol, sizeof(gcol), "%.0f [%.0f..%.0f]", g.median, g.min, g.max);
      if (!t_rates.empty()) {
        std::snprintf(tcol, sizeof(tcol), "%.0f [%.0f..%.0f]", t.median, t.min, t.max);
        std::snprintf(rcol, sizeof(rcol), "%.2f", g.median / t.median);
        worst_ratio = std::min(worst_ratio, g.median / t.median);
      }
      std::printf("%-8s %6lld %28s %28s %7s\n", m.c_str(), static_cast<long long>(b), gcol, tcol, rcol);
      std::fflush(stdout);
      json << (mi + bi ? ", " : "") << "{\"model\": \"" << m << "\", \"batch\": " << b
           << ", \"gradsync_median\": " << g.median << ", \"torch_median\": "
           << (t_rates.empty() ? std::string("null") : std::to_string(t.median)) << "}";
    }
  }
  json << "], \"torch\": \"" << torch_version << "\"}\n";
  if (torch_missing || torch_mode == "off") {
    std::printf("# pytorch baseline not run (%s)\n",
                torch_mode == "off"                            ? "--torch=off"
                : torch_why.find("No module named") != std::string::npos || torch_why.empty()
                    ? "no torch for /usr/bin/python3: scripts/setup.sh --bench installs python3-torch"
                    : torch_why.c_str());
  } else {
    std::printf("# pytorch %s; worst ratio gradsync/pytorch %.2f: %s\n", torch_version.c_str(), worst_ratio,
                worst_ratio >= 1.0 ? "gradsync at least as fast everywhere" : "gradsync slower somewhere");
  }
  if (vm.count("json")) std::ofstream(vm["json"].as<std::string>()) << json.str();
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
