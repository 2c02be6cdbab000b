// Gloo's all-reduces, ring_chunked and halving_doubling, timed like gradsync-bench-allreduce (for
// allreduce_compare.sh).
// Usage: gloo_allreduce RANK SIZE STORE_DIR ITERS BYTES...
// Prints "RESULT algo bytes p50_us p99_us busbw_GBps wrong" on rank 0 for each algorithm and size.
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 6) return 2;
  const int rank = std::atoi(argv[1]), size = std::atoi(argv[2]), iters = std::atoi(argv[4]);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(argv[3]);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->connectFullMesh(store, dev);
  for (int a = 5; a < argc; ++a) for (const char* name : {"ring_chunked", "halving_doubling"}) {
    const size_t bytes = std::strtoull(argv[a], nullptr, 10), count = bytes / sizeof(float);
    std::vector<float> x(count);
    std::vector<float*> ptrs = {x.data()};
    std::unique_ptr<gloo::Algorithm> algo;
    if (name[0] == 'r') algo = std::make_unique<gloo::AllreduceRingChunked<float>>(ctx, ptrs, static_cast<int>(count));
    else algo = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(ctx, ptrs, static_cast<int>(count));
    const int n_iters = std::max<int>(3, std::min<long long>(iters, (2LL << 30) / static_cast<long long>(bytes)));
    std::vector<double> times;
    for (int it = 0; it < n_iters + 2; ++it) {
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
      gloo::BarrierAllToOne(ctx).run();
      auto t0 = std::chrono::steady_clock::now();
      algo->run();
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (it >= 2) times.push_back(us);
    }
    long long wrong = 0;
    const float total = static_cast<float>(size * (size + 1) / 2);
    for (size_t i = 0; i < count; ++i) wrong += x[i] != total * static_cast<float>(i % 7 + 1);
    std::sort(times.begin(), times.end());
    const double p50 = times[times.size() / 2], p99 = times[std::min(times.size() - 1, times.size() * 99 / 100)];
    if (rank == 0) {
      std::printf("RESULT %s %zu %.1f %.1f %.4f %lld\n", name, bytes, p50, p99, bytes / (p50 * 1e-6) / 1e9 * 2.0 * (size - 1) / size,
                  wrong);
      std::fflush(stdout);
    }
  }
  return 0;
}
