// gradsync-worker: trains a model. --mode=local trains in this one process; the parameter
// server (bsp|ssp|asp) and all-reduce modes join a job through --scheduler.
#include <cmath>
#include <cstdio>
#include <iostream>

#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "models/model.h"
#include "worker/data_source.h"
#include "worker/local_trainer.h"

namespace gradsync {
namespace {

int Main(int argc, char** argv) {
  FlagParser flags("gradsync-worker",
                   "Trains a model on one process (--mode=local). Prints per-epoch loss, test "
                   "accuracy and samples/s;\n--out=DIR writes DIR/worker-0.csv.");
  flags.options().add_options()
      ("mode", po::value<std::string>()->default_value("local"), "local (bsp|ssp|asp|allreduce join a job; not in this build yet)")
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
      ("out", po::value<std::string>(), "directory for worker-<rank>.csv")
      ("run", po::value<std::string>()->default_value("local"), "run name written in the metrics");
  auto vm = flags.ParseOrExit(argc, argv);

  const std::string mode = vm["mode"].as<std::string>();
  if (mode == "bsp" || mode == "ssp" || mode == "asp" || mode == "allreduce") {
    flags.Fail("--mode=" + mode + " is not available in this build yet; use --mode=local");
  }
  if (mode != "local") flags.Fail("--mode must be local|bsp|ssp|asp|allreduce, not '" + mode + "'");

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
  train.lr.base = vm["lr"].as<float>();
  if (!(train.lr.base > 0.0f) || !std::isfinite(train.lr.base)) flags.Fail("--lr must be > 0");
  auto schedule = ParseLrScheduleKind(vm["lr-schedule"].as<std::string>());
  if (!schedule.ok()) flags.Fail(schedule.status().message());
  train.lr.kind = *schedule;
  train.batch = vm["batch"].as<int64_t>();
  if (train.batch <= 0) flags.Fail("--batch must be > 0");
  train.epochs = vm["epochs"].as<int>();
  if (train.epochs <= 0) flags.Fail("--epochs must be > 0");
  train.max_steps = vm["max-steps"].as<int64_t>();
  if (train.max_steps < 0) flags.Fail("--max-steps must be >= 0");
  train.seed = vm["seed"].as<uint64_t>();
  train.log_every = vm["log-every"].as<int64_t>();
  if (train.log_every < 0) flags.Fail("--log-every must be >= 0");
  const int threads = vm["threads"].as<int>();
  if (threads <= 0 || threads > 256) flags.Fail("--threads must be in [1, 256]");
  SetBlasThreads(threads);

  auto data = LoadTrainTest(data_options);
  if (!data.ok()) {
    std::cerr << "gradsync-worker: error: " << data.status().message() << std::endl;
    return 1;
  }
  if (!sparse_model) {
    model_options.input_dim = data->train.dim;
    model_options.num_classes = data->train.num_classes;
  }
  auto model = CreateModel(model_options);
  if (!model.ok()) flags.Fail(model.status().message());
  (*model)->Initialize(train.seed);

  std::optional<MetricsWriter> metrics;
  if (vm.count("out")) {
    auto w = MetricsWriter::Open(vm["out"].as<std::string>() + "/worker-0.csv",
                                 vm["run"].as<std::string>(), 0);
    if (!w.ok()) {
      std::cerr << "gradsync-worker: error: " << w.status().message() << std::endl;
      return 1;
    }
    metrics.emplace(std::move(w).value());
  }

  std::printf("gradsync-worker: mode=local model=%s params=%lld dataset=%s train=%lld test=%lld "
              "batch=%lld lr=%g (%s) momentum=%g%s weight_decay=%g epochs=%d seed=%llu threads=%d\n",
              (*model)->name().c_str(), static_cast<long long>((*model)->num_params()),
              data_options.name.c_str(), static_cast<long long>(data->train.n),
              static_cast<long long>(data->test.n), static_cast<long long>(train.batch),
              train.lr.base, vm["lr-schedule"].as<std::string>().c_str(), train.optimizer.momentum,
              train.optimizer.nesterov ? " (nesterov)" : "", train.optimizer.weight_decay,
              train.epochs, static_cast<unsigned long long>(train.seed), threads);
  std::fflush(stdout);
  LocalTrainer trainer(train, model->get(), &data->train, &data->test, metrics ? &*metrics : nullptr);
  double best = -1.0;
  int best_epoch = 0;
  auto reports = trainer.Run([&](const EpochReport& r) {
    if (r.test_accuracy > best) best = r.test_accuracy, best_epoch = r.epoch;
    std::printf("epoch %2d/%d  train_loss %.4f  test_loss %.4f  test_acc %6.2f%%  samples/s %8.0f  "
                "elapsed %.1fs\n",
                r.epoch, train.epochs, r.train_loss, r.test_loss, 100.0 * r.test_accuracy,
                r.samples_per_s, r.wall_s);
    std::fflush(stdout);
  });
  if (!reports.ok()) {
    std::cerr << "gradsync-worker: error: " << reports.status().message() << std::endl;
    return 1;
  }
  if (!reports->empty()) {
    std::printf("final test_acc %.2f%% (best %.2f%% at epoch %d), %lld steps, %.1fs\n",
                100.0 * reports->back().test_accuracy, 100.0 * best, best_epoch,
                static_cast<long long>(reports->back().steps), reports->back().wall_s);
  }
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
