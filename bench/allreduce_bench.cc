// gradsync-bench-allreduce: the CPU ring all-reduce in the nccl-tests format.
//
// For each world size n (ranks are threads of this process, each with its own ring and TCP
// connections over 127.0.0.1) and each buffer size S (bytes per rank): `warmup` untimed
// operations, then `iters` timed ones; before each, the buffers are refilled (untimed) and the
// ranks pass a barrier, and rank 0 times its AllReduce. time = p50 over iterations;
// algbw = S / time; busbw = algbw * 2(n-1)/n (nccl-tests doc/PERFORMANCE.md); 1 GB = 1e9 B.
// Inputs are small integers, so the sums are exact: #wrong counts elements that differ from the
// known result after the last iteration, on every rank.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "allreduce/tcp_ring.h"
#include "common/flags.h"
#include "common/transport.h"

namespace gradsync {
namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  int ranks;
  size_t bytes;
  double p50_us, p99_us, algbw, busbw;
  int64_t wrong;
};

Row Measure(int n, size_t bytes, int warmup, int iters, size_t segment_bytes) {
  const size_t count = bytes / sizeof(float);
  CollectiveOptions opt;
  opt.timeout_s = 120;
  opt.segment_bytes = segment_bytes;
  std::vector<std::unique_ptr<RingCollective>> rings;
  std::vector<std::string> peers;
  for (int r = 0; r < n; ++r) {
    rings.push_back(std::move(RingCollective::Listen("127.0.0.1", opt)).value());
    peers.push_back("127.0.0.1:" + std::to_string(rings.back()->port()));
  }
  std::vector<double> times;
  std::atomic<int64_t> wrong{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      RingCollective& ring = *rings[r];
      GRADSYNC_CHECK(ring.Connect(r, peers, 30).ok());
      std::vector<float> x(count);
      auto fill = [&] {
        for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1));
      };
      for (int it = 0; it < warmup + iters; ++it) {
        fill();
        GRADSYNC_CHECK(ring.Barrier().ok());
        auto t0 = Clock::now();
        Status s = ring.AllReduce(x, ReduceOp::kSum);
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        GRADSYNC_CHECK(s.ok()) << s;
        if (r == 0 && it >= warmup) times.push_back(us);
      }
      const float total = static_cast<float>(n * (n + 1) / 2);
      int64_t bad = 0;
      for (size_t i = 0; i < count; ++i) bad += x[i] != total * static_cast<float>(i % 7 + 1);
      wrong += bad;
    });
  }
  for (auto& t : threads) t.join();
  std::sort(times.begin(), times.end());
  Row row;
  row.ranks = n;
  row.bytes = bytes;
  row.p50_us = times[times.size() / 2];
  row.p99_us = times[std::min(times.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(times.size())))];
  row.algbw = static_cast<double>(bytes) / (row.p50_us * 1e-6) / 1e9;
  row.busbw = row.algbw * 2.0 * (n - 1) / n;
  row.wrong = wrong.load();
  return row;
}

int Main(int argc, char** argv) {
  FlagParser flags("gradsync-bench-allreduce", "CPU ring all-reduce: time, algbw, busbw, #wrong (nccl-tests format).");
  flags.options().add_options()
      ("sizes", po::value<std::string>()->default_value("1048576,4194304,16777216,67108864,268435456"), "bytes per rank")
      ("ranks", po::value<std::string>()->default_value("2,4"), "world sizes")
      ("warmup", po::value<int>()->default_value(2), "untimed operations per size")
      ("iters", po::value<int>()->default_value(20), "timed operations per size (p50 reported)")
      ("max-iters-bytes", po::value<int64_t>()->default_value(int64_t{2} << 30), "cap iters so that iters * size stays below this")
      ("segment-bytes", po::value<int64_t>()->default_value(1 << 20), "pipelining segment")
      ("json", po::value<std::string>(), "also write the rows as JSON here");
  auto vm = flags.ParseOrExit(argc, argv);
  TuneAllocatorForLargeMessages();
  auto sizes = ParseIntList(vm["sizes"].as<std::string>(), 4, int64_t{1} << 32);
  if (!sizes.ok()) flags.Fail("--sizes: " + sizes.status().message());
  auto ranks = ParseIntList(vm["ranks"].as<std::string>(), 1, 64);
  if (!ranks.ok()) flags.Fail("--ranks: " + ranks.status().message());
  const int warmup = vm["warmup"].as<int>(), iters = vm["iters"].as<int>();
  if (warmup < 0 || iters < 1) flags.Fail("--warmup must be >= 0 and --iters >= 1");
  const int64_t seg = vm["segment-bytes"].as<int64_t>();
  if (seg < 4) flags.Fail("--segment-bytes must be >= 4");
  std::vector<Row> rows;
  for (int64_t n : *ranks) {
    std::printf("# ranks %lld (threads, TCP over 127.0.0.1), segment %lld bytes\n", static_cast<long long>(n),
                static_cast<long long>(seg));
    std::printf("#%14s %12s %6s %6s %12s %12s %12s %12s %8s\n", "size", "count", "type", "redop", "time(us)p50",
                "p99(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    for (int64_t bytes : *sizes) {
      const int it = static_cast<int>(std::max<int64_t>(3, std::min<int64_t>(iters, vm["max-iters-bytes"].as<int64_t>() / bytes)));
      Row r = Measure(static_cast<int>(n), static_cast<size_t>(bytes), warmup, it, static_cast<size_t>(seg));
      std::printf(" %14zu %12zu %6s %6s %12.1f %12.1f %12.3f %12.3f %8lld\n", r.bytes, r.bytes / 4, "float", "sum",
                  r.p50_us, r.p99_us, r.algbw, r.busbw, static_cast<long long>(r.wrong));
      std::fflush(stdout);
      rows.push_back(r);
    }
  }
  int64_t wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(wrong), wrong == 0 ? "OK" : "FAILED");
  if (vm.count("json")) {
    std::ofstream f(vm["json"].as<std::string>());
    f << "[";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      f << (i ? ", " : "") << "{\"ranks\": " << r.ranks << ", \"bytes\": " << r.bytes << ", \"p50_us\": " << r.p50_us
        << ", \"algbw\": " << r.algbw << ", \"busbw\": " << r.busbw << ", \"wrong\": " << r.wrong << "}";
    }
    f << "]\n";
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
