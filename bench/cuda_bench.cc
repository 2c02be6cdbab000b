// gradsync-bench-cuda: the GPU against the CPU on one training step, and NCCL all-reduce
// bandwidth. Built with CUDA and NCCL; scripts/gpu-check.sh runs it on a GPU machine.
//
// Step: forward, softmax cross-entropy, backward and the optimizer (SGD with momentum), on 16
// fixed random batches cycled (no data loading timed). CPU: the OpenBLAS model and Optimizer
// with --threads; GPU: the CUDA model, its device optimizer, and the one wait per step for the
// loss. `warmup` steps, then `repeats` timed runs of `iters` steps; the median ms/step and the
// GPU's speed-up over the CPU measured in the same run. --precisions: the same step per
// precision (models/model.h); fp16's step includes dynamic loss scaling's check (the gradient
// through 16 bits with the scale divided out, and the wait for its verdict).
//
// NCCL: one process drives every visible GPU (ncclCommInitAll), out-of-place ncclAllReduce of S
// bytes of floats (sum); time per op is the median of `repeats` runs of `iters` ops after 5
// warm-up ops. algbw = S / time, busbw = algbw * 2(n-1)/n as nccl-tests reports it (0 for one
// rank, where nothing crosses a link); 1 GB = 1e9 bytes. With one rank the op is a copy on the
// GPU (in place it would do nothing at all and time only the launch): the row says so.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/random_batches.h"
#include "common/base/numeric/blas_threads.h"
#include "common/base/clock.h"
#include "common/config/flags.h"
#include "common/optim/optimizer.h"
#include "models/cuda/cuda_model.h"
#include "models/model.h"

namespace gradsync {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Median ms per training step of `model` (CPU or CUDA) at `batch`.
double StepMs(Model& model, int64_t batch, int warmup, int iters, int repeats) {
  const RandomBatches batches(batch);
  OptimizerOptions oo;
  oo.momentum = 0.9f;
  Optimizer cpu_opt(oo, model.on_device() ? 0 : model.num_params());
  if (model.on_device()) GRADSYNC_CHECK(model.SetOptimizer(oo).ok());
  const bool scaled = model.precision() == Precision::kFp16;
  const float scale = scaled ? 1024.0f : 1.0f;
  model.set_loss_scale(scale);
  auto step = [&](int i) {
    model.ForwardBackward(batches.Get(i));
    if (model.on_device()) {
      if (scaled) {
        GRADSYNC_CHECK(model.PackGrads16(1.0f).ok());
        GRADSYNC_CHECK(model.UnpackGrads16(1.0f / scale).ok());
        auto finite = model.GradsFinite();
        GRADSYNC_CHECK(finite.ok()) << finite.status();
        if (!*finite) return;
      }
      GRADSYNC_CHECK(model.OptimizerStep(0.01f).ok());
    } else {
      if (scaled && !AllFinite(model.grads())) return;
      cpu_opt.Step(model.params(), model.grads(), 0.01f, 0, 1.0f / scale);
    }
  };
  for (int i = 0; i < warmup; ++i) step(i);
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    Stopwatch sw;
    for (int i = 0; i < iters; ++i) step(i);
    GRADSYNC_CHECK(model.ParamsToHost().ok());  // the last optimizer step is inside the timing
    ms.push_back(sw.Millis() / iters);
  }
  return Median(ms);
}

#define BENCH_CUDA(call)                                                                  \
  do {                                                                                    \
    cudaError_t e = (call);                                                               \
    if (e != cudaSuccess) return InternalError(std::string(#call) + ": " + cudaGetErrorString(e)); \
  } while (0)
#define BENCH_NCCL(call)                                                                  \
  do {                                                                                    \
    ncclResult_t r = (call);                                                              \
    if (r != ncclSuccess) return InternalError(std::string(#call) + ": " + ncclGetErrorString(r)); \
  } while (0)

// Prints one row per size for an all-reduce over the first `n` GPUs.
Status NcclBandwidth(int n, const std::vector<int64_t>& sizes_mb, int iters, int repeats) {
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  std::vector<int> devs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) devs[i] = i;
  BENCH_NCCL(ncclCommInitAll(comms.data(), n, devs.data()));
  std::vector<cudaStream_t> streams(static_cast<size_t>(n));
  std::vector<float*> bufs(static_cast<size_t>(n), nullptr), outs(static_cast<size_t>(n), nullptr);
  const size_t max_count = static_cast<size_t>(*std::max_element(sizes_mb.begin(), sizes_mb.end())) * 1000000 / 4;
  for (int i = 0; i < n; ++i) {
    BENCH_CUDA(cudaSetDevice(i));
    BENCH_CUDA(cudaStreamCreate(&streams[i]));
    BENCH_CUDA(cudaMalloc(&bufs[i], max_count * sizeof(float)));
    BENCH_CUDA(cudaMemset(bufs[i], 0, max_count * sizeof(float)));
    BENCH_CUDA(cudaMalloc(&outs[i], max_count * sizeof(float)));
  }
  auto run = [&](size_t count, int ops) -> Status {
    for (int k = 0; k < ops; ++k) {
      BENCH_NCCL(ncclGroupStart());
      for (int i = 0; i < n; ++i) {
        BENCH_NCCL(ncclAllReduce(bufs[i], outs[i], count, ncclFloat32, ncclSum, comms[i], streams[i]));
      }
      BENCH_NCCL(ncclGroupEnd());
    }
    for (int i = 0; i < n; ++i) {
      BENCH_CUDA(cudaSetDevice(i));
      BENCH_CUDA(cudaStreamSynchronize(streams[i]));
    }
    return OkStatus();
  };
  for (int64_t mb : sizes_mb) {
    const size_t count = static_cast<size_t>(mb) * 1000000 / 4;
    RETURN_IF_ERROR(run(count, 5));
    std::vector<double> us;
    for (int r = 0; r < repeats; ++r) {
      Stopwatch sw;
      RETURN_IF_ERROR(run(count, iters));
      us.push_back(sw.Seconds() * 1e6 / iters);
    }
    const double t_us = Median(us);
    const double bytes = static_cast<double>(count) * 4;
    const double algbw = bytes / (t_us * 1e-6) / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    std::printf("nccl   ranks=%d  %6lld MB  %10.1f us  algbw %7.2f GB/s  busbw %7.2f GB/s%s\n", n,
                static_cast<long long>(mb), t_us, algbw, busbw, n == 1 ? "  (one rank: a copy on the GPU)" : "");
    std::fflush(stdout);
  }
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(i);
    cudaFree(bufs[i]);
    cudaFree(outs[i]);
    cudaStreamDestroy(streams[i]);
    ncclCommDestroy(comms[i]);
  }
  return OkStatus();
}

int Main(int argc, char** argv) {
  FlagParser flags("gradsync-bench-cuda", "GPU vs CPU training-step time, and NCCL all-reduce bandwidth.");
  flags.options().add_options()
      ("hidden", po::value<std::string>()->default_value("256,128"), "MLP hidden sizes")
      ("batches", po::value<std::string>()->default_value("64,1024"), "batch sizes")
      ("threads", po::value<int>()->default_value(1), "OpenBLAS threads of the CPU side")
      ("warmup", po::value<int>()->default_value(20), "untimed steps first")
      ("iters", po::value<int>()->default_value(50), "steps per timed run")
      ("repeats", po::value<int>()->default_value(5), "timed runs (the median is reported)")
      ("nccl-mb", po::value<std::string>()->default_value("4,64,256"), "all-reduce sizes in MB (none: skip NCCL)")
      ("precisions", po::value<std::string>()->default_value("fp32"), "comma-separated: fp32, bf16, fp16");
  auto vm = flags.ParseOrExit(argc, argv);
  const int threads = vm["threads"].as<int>(), warmup = vm["warmup"].as<int>();
  const int iters = vm["iters"].as<int>(), repeats = vm["repeats"].as<int>();
  if (threads < 1 || warmup < 0 || iters < 1 || repeats < 1) flags.Fail("--threads, --iters, --repeats >= 1, --warmup >= 0");
  auto hidden = ParseIntList(vm["hidden"].as<std::string>(), 1, 1 << 20);
  if (!hidden.ok()) flags.Fail("--hidden: " + hidden.status().message());
  auto batches = ParseIntList(vm["batches"].as<std::string>(), 1, 1 << 20);
  if (!batches.ok()) flags.Fail("--batches: " + batches.status().message());
  std::vector<int64_t> nccl_mb;
  if (vm["nccl-mb"].as<std::string>() != "none") {
    auto m = ParseIntList(vm["nccl-mb"].as<std::string>(), 1, 4096);
    if (!m.ok()) flags.Fail("--nccl-mb: " + m.status().message());
    nccl_mb = *m;
  }
  std::vector<Precision> precisions;
  {
    std::string list = vm["precisions"].as<std::string>() + ",";
    for (size_t at = 0, comma; (comma = list.find(',', at)) != std::string::npos; at = comma + 1) {
      auto p = ParsePrecision(list.substr(at, comma - at));
      if (!p.ok()) flags.Fail("--precisions: " + p.status().message());
      precisions.push_back(*p);
    }
  }
  const int gpus = CudaDeviceCount();
  if (gpus == 0) {
    std::fprintf(stderr, "gradsync-bench-cuda: error: no CUDA device is visible\n");
    return 1;
  }
  SetBlasThreads(threads);
  std::printf("# gradsync-bench-cuda: %d GPU(s), GPU 0 = %s; CPU side %d OpenBLAS thread(s); median of %d runs of %d steps\n",
              gpus, CudaDeviceName(0).c_str(), threads, repeats, iters);
  ModelOptions mo;
  mo.name = "mlp";
  mo.hidden = *hidden;
  std::printf("%-6s %-16s %-5s %6s %12s %12s %9s\n", "step", "model", "prec", "batch", "cpu ms", "gpu ms", "speed-up");
  for (Precision precision : precisions)
  for (int64_t b : *batches) {
    mo.precision = precision;
    auto cpu = std::move(CreateModel(mo)).value();
    auto gpu = CreateCudaModel(mo, {});
    if (!gpu.ok()) {
      std::fprintf(stderr, "gradsync-bench-cuda: error: %s\n", gpu.status().message().c_str());
      return 1;
    }
    cpu->Initialize(0);
    (*gpu)->Initialize(0);
    const double c = StepMs(*cpu, b, warmup, iters, repeats);
    const double g = StepMs(**gpu, b, warmup, iters, repeats);
    std::printf("%-6s %-16s %-5s %6lld %12.3f %12.3f %8.1fx\n", "mlp", ("784-" + vm["hidden"].as<std::string>() + "-10").c_str(),
                PrecisionName(precision), static_cast<long long>(b), c, g, c / g);
    std::fflush(stdout);
  }
  if (!nccl_mb.empty()) {
    for (int n : {1, 2}) {
      if (n > gpus) break;
      if (Status s = NcclBandwidth(n, nccl_mb, 20, repeats); !s.ok()) {
        std::fprintf(stderr, "gradsync-bench-cuda: error: NCCL with %d rank(s): %s\n", n, s.message().c_str());
        return 1;
      }
    }
    if (gpus > 2) {
      if (Status s = NcclBandwidth(gpus, nccl_mb, 20, repeats); !s.ok()) {
        std::fprintf(stderr, "gradsync-bench-cuda: error: NCCL with %d ranks: %s\n", gpus, s.message().c_str());
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
