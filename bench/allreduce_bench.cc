// gradsync-bench-allreduce: the CPU all-reduce algorithms in the nccl-tests format.
//
// For each world size n (ranks are threads of this process, each with its own collective and
// TCP connections over 127.0.0.1; with --processes ranks 1..n-1 are forked processes), each
// algorithm (--algos) and each buffer size S (bytes per rank): `warmup` untimed operations, then
// `iters` timed ones; before each, the buffers are refilled (untimed) and the
// ranks pass a barrier, and rank 0 times its AllReduce. time = p50 over iterations;
// algbw = S / time; busbw = algbw * 2(n-1)/n (nccl-tests doc/PERFORMANCE.md); 1 GB = 1e9 B.
// Inputs are small integers, so the sums are exact: #wrong counts elements that differ from the
// known result after the last iteration, on every rank.
//
// --security=plain,auth,encrypt measures the ring plaintext, authenticated (the handshake at
// Connect only: the data path is the plaintext one) and encrypted (ChaCha20-Poly1305 frames),
// one after the other for each size and round, and ends with a Markdown table of busbw per
// mode and its ratio to plaintext. --rounds=R repeats the modes in turn R times (the p50 is
// then over every round's iterations), so that a noisy spell hits all of them alike.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "allreduce/ring_security.h"
#include "allreduce/tcp_ring.h"
#include "common/config/flags.h"
#include "common/net/transport.h"

namespace gradsync {
namespace {

using Clock = std::chrono::steady_clock;
double g_poll_ms = CollectiveOptions{}.mesh_wait.busy_poll_ms;
size_t g_shm_block = CollectiveOptions{}.shm_block_bytes;
size_t g_socket_buffer = CollectiveOptions{}.socket_buffer_bytes;
size_t g_exchange_segment = CollectiveOptions{}.exchange_segment_bytes;
bool g_processes = false;

struct Row {
  int ranks;
  size_t bytes;
  std::string security;
  std::string algo;
  double p50_us, p99_us, algbw, busbw;
  int64_t wrong;
};

RingSecurity SecurityOf(const std::string& mode) {
  if (mode == "plain") return {};
  const auto secret = ring_handshake::RandomNonce();  // a throw-away cluster secret
  return RingSecurity{true, mode == "encrypt", DeriveRingKey(secret)};
}

// Rank 0's AllReduce times (us) of `iters` timed operations; adds the wrong elements to *wrong.
std::vector<double> Measure(int n, size_t bytes, int warmup, int iters, size_t segment_bytes, const RingSecurity& security,
                            AllReduceAlgo algo, int64_t* wrong_out) {
  const size_t count = bytes / sizeof(float);
  CollectiveOptions opt;
  opt.timeout_s = 120;
  opt.segment_bytes = segment_bytes;
  opt.algorithm = algo;
  opt.mesh_wait.busy_poll_ms = g_poll_ms;
  opt.shm_block_bytes = g_shm_block;
  opt.socket_buffer_bytes = g_socket_buffer;
  opt.exchange_segment_bytes = g_exchange_segment;
  opt.shm = algo == AllReduceAlgo::kShm || algo == AllReduceAlgo::kHier;  // the others: TCP only
  std::vector<double> times;
  // One rank's loop: refill, barrier, time the all-reduce; returns its wrong elements.
  auto rank_loop = [&](int r, RingCollective& ring, const std::vector<std::string>& peers) -> int64_t {
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
    return bad;
  };
  if (g_processes && n > 1) {
    // Ranks 1..n-1 in processes of their own (as Gloo's and MPI's are): each tells rank 0 its
    // port through a pipe and learns every rank's address back; the exit status says whether
    // its sums were exact. Forked before this process starts any thread of its own.
    std::vector<std::array<int, 2>> up(static_cast<size_t>(n)), down(static_cast<size_t>(n));
    std::vector<pid_t> children;
    for (int r = 1; r < n; ++r) {
      GRADSYNC_CHECK(pipe(up[r].data()) == 0 && pipe(down[r].data()) == 0);
      const pid_t pid = fork();
      GRADSYNC_CHECK(pid >= 0);
      if (pid == 0) {
        auto ring = std::move(RingCollective::Listen("127.0.0.1", opt, security)).value();
        const uint16_t port = ring->port();
        GRADSYNC_CHECK(write(up[r][1], &port, sizeof(port)) == sizeof(port));
        std::vector<std::string> peers;
        for (int q = 0; q < n; ++q) {
          uint16_t p = 0;
          GRADSYNC_CHECK(read(down[r][0], &p, sizeof(p)) == sizeof(p));
          peers.push_back("127.0.0.1:" + std::to_string(p));
        }
        const int64_t bad = rank_loop(r, *ring, peers);
        ring.reset();
        _exit(bad == 0 ? 0 : 1);
      }
      children.push_back(pid);
    }
    auto ring = std::move(RingCollective::Listen("127.0.0.1", opt, security)).value();
    std::vector<uint16_t> ports(static_cast<size_t>(n));
    ports[0] = ring->port();
    for (int r = 1; r < n; ++r) GRADSYNC_CHECK(read(up[r][0], &ports[r], sizeof(uint16_t)) == sizeof(uint16_t));
    std::vector<std::string> peers;
    for (uint16_t p : ports) peers.push_back("127.0.0.1:" + std::to_string(p));
    for (int r = 1; r < n; ++r) {
      for (uint16_t p : ports) GRADSYNC_CHECK(write(down[r][1], &p, sizeof(p)) == sizeof(p));
    }
    *wrong_out += rank_loop(0, *ring, peers);
    for (pid_t pid : children) {
      int status = 0;
      waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) *wrong_out += 1;
    }
    for (int r = 1; r < n; ++r) {
      for (int fd : {up[r][0], up[r][1], down[r][0], down[r][1]}) close(fd);
    }
    return times;
  }
  std::vector<std::unique_ptr<RingCollective>> rings;
  std::vector<std::string> peers;
  for (int r = 0; r < n; ++r) {
    rings.push_back(std::move(RingCollective::Listen("127.0.0.1", opt, security)).value());
    peers.push_back("127.0.0.1:" + std::to_string(rings.back()->port()));
  }
  std::atomic<int64_t> wrong{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { wrong += rank_loop(r, *rings[r], peers); });
  for (auto& t : threads) t.join();
  *wrong_out += wrong.load();
  return times;
}

Row Summarize(int n, size_t bytes, const std::string& security, const std::string& algo, std::vector<double> times,
              int64_t wrong) {
  std::sort(times.begin(), times.end());
  Row row;
  row.ranks = n;
  row.bytes = bytes;
  row.security = security;
  row.algo = algo;
  row.p50_us = times[times.size() / 2];
  row.p99_us = times[std::min(times.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(times.size())))];
  row.algbw = static_cast<double>(bytes) / (row.p50_us * 1e-6) / 1e9;
  row.busbw = row.algbw * 2.0 * (n - 1) / n;
  row.wrong = wrong;
  return row;
}

int Main(int argc, char** argv) {
  FlagParser flags("gradsync-bench-allreduce", "CPU all-reduce (ring, rhd, rd, tree, auto): time, algbw, busbw, #wrong (nccl-tests format).");
  flags.options().add_options()
      ("sizes", po::value<std::string>()->default_value("1048576,4194304,16777216,67108864,268435456"), "bytes per rank")
      ("ranks", po::value<std::string>()->default_value("2,4"), "world sizes")
      ("warmup", po::value<int>()->default_value(2), "untimed operations per size")
      ("iters", po::value<int>()->default_value(20), "timed operations per size (p50 reported)")
      ("max-iters-bytes", po::value<int64_t>()->default_value(int64_t{2} << 30), "cap iters so that iters * size stays below this")
      ("segment-bytes", po::value<int64_t>()->default_value(1 << 20), "pipelining segment")
      ("shm-block-bytes", po::value<int64_t>()->default_value(static_cast<int64_t>(CollectiveOptions{}.shm_block_bytes)), "shm: the block each step copies and reduces")
      ("socket-buffer-bytes", po::value<int64_t>()->default_value(static_cast<int64_t>(CollectiveOptions{}.socket_buffer_bytes)), "SO_SNDBUF / SO_RCVBUF of every connection (0: the kernel's)")
      ("exchange-segment-bytes", po::value<int64_t>()->default_value(static_cast<int64_t>(CollectiveOptions{}.exchange_segment_bytes)), "rhd/rd swaps: lockstep segment (0: whole buffers at once)")
      ("processes", po::value<bool>()->default_value(false)->implicit_value(true), "ranks 1..n-1 as processes of their own instead of threads")
      ("poll-ms", po::value<double>()->default_value(CollectiveOptions{}.mesh_wait.busy_poll_ms, "1"), "poll this long (ms) before sleeping while waiting for a peer")
      ("security", po::value<std::string>()->default_value("plain"), "ring modes to measure, in turn: plain,auth,encrypt")
      ("algos", po::value<std::string>()->default_value("auto"), "all-reduce algorithms to measure, in turn: auto,ring,rhd,rd,tree (TCP), shm (shared memory)")
      ("rounds", po::value<int>()->default_value(1), "times each size runs every --security mode in turn")
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
  std::vector<std::string> modes;
  {
    std::string list = vm["security"].as<std::string>(), item;
    std::stringstream in(list);
    while (std::getline(in, item, ',')) {
      if (item != "plain" && item != "auth" && item != "encrypt") flags.Fail("--security: '" + item + "' is not plain, auth or encrypt");
      modes.push_back(item);
    }
    if (modes.empty()) flags.Fail("--security: name at least one mode");
  }
  std::vector<std::string> algos;
  {
    std::stringstream in(vm["algos"].as<std::string>());
    std::string item;
    while (std::getline(in, item, ',')) {
      if (!ParseAllReduceAlgo(item).ok()) flags.Fail("--algos: " + ParseAllReduceAlgo(item).status().message());
      algos.push_back(item);
    }
    if (algos.empty()) flags.Fail("--algos: name at least one algorithm");
  }
  // Every (algorithm, security) pair is one mode, measured in turn.
  struct Mode {
    std::string algo, security;
  };
  std::vector<Mode> modes_all;
  for (const auto& a : algos) {
    for (const auto& m : modes) modes_all.push_back({a, m});
  }
  const int rounds = vm["rounds"].as<int>();
  g_poll_ms = vm["poll-ms"].as<double>();
  g_processes = vm["processes"].as<bool>();
  if (vm["shm-block-bytes"].as<int64_t>() < 4096) flags.Fail("--shm-block-bytes must be >= 4096");
  g_shm_block = static_cast<size_t>(vm["shm-block-bytes"].as<int64_t>());
  if (vm["socket-buffer-bytes"].as<int64_t>() < 0) flags.Fail("--socket-buffer-bytes must be >= 0");
  g_socket_buffer = static_cast<size_t>(vm["socket-buffer-bytes"].as<int64_t>());
  if (vm["exchange-segment-bytes"].as<int64_t>() < 0) flags.Fail("--exchange-segment-bytes must be >= 0");
  g_exchange_segment = static_cast<size_t>(vm["exchange-segment-bytes"].as<int64_t>());
  if (!(g_poll_ms >= 0)) flags.Fail("--poll-ms must be >= 0");
  if (rounds < 1) flags.Fail("--rounds must be >= 1");
  std::vector<Row> rows;
  for (int64_t n : *ranks) {
    std::printf("# ranks %lld (%s, TCP over 127.0.0.1), segment %lld bytes\n", static_cast<long long>(n), g_processes ? "processes" : "threads",
                static_cast<long long>(seg));
    std::printf("#%14s %12s %6s %6s %12s %12s %12s %12s %8s %9s %5s\n", "size", "count", "type", "redop", "time(us)p50",
                "p99(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "security", "algo");
    for (int64_t bytes : *sizes) {
      const int it = static_cast<int>(std::max<int64_t>(3, std::min<int64_t>(iters, vm["max-iters-bytes"].as<int64_t>() / bytes)));
      std::vector<std::vector<double>> times(modes_all.size());
      std::vector<int64_t> wrong(modes_all.size(), 0);
      for (int round = 0; round < rounds; ++round) {
        for (size_t m = 0; m < modes_all.size(); ++m) {
          auto t = Measure(static_cast<int>(n), static_cast<size_t>(bytes), warmup, it, static_cast<size_t>(seg),
                           SecurityOf(modes_all[m].security), *ParseAllReduceAlgo(modes_all[m].algo), &wrong[m]);
          times[m].insert(times[m].end(), t.begin(), t.end());
        }
      }
      for (size_t m = 0; m < modes_all.size(); ++m) {
        Row r = Summarize(static_cast<int>(n), static_cast<size_t>(bytes), modes_all[m].security, modes_all[m].algo, times[m],
                          wrong[m]);
        std::printf(" %14zu %12zu %6s %6s %12.1f %12.1f %12.3f %12.3f %8lld %9s %5s\n", r.bytes, r.bytes / 4, "float", "sum",
                    r.p50_us, r.p99_us, r.algbw, r.busbw, static_cast<long long>(r.wrong), r.security.c_str(), r.algo.c_str());
        rows.push_back(r);
      }
      std::fflush(stdout);
    }
  }
  if (modes.size() > 1 && algos.size() == 1) {
    // busbw per mode, side by side, with each mode's ratio to the first (plaintext, usually).
    std::printf("\n| ranks | floats |");
    for (size_t m = 0; m < modes.size(); ++m) {
      std::printf(" %s busbw (GB/s) |%s", modes[m].c_str(), m ? (" " + modes[m] + " / " + modes[0] + " |").c_str() : "");
    }
    std::printf("\n|---:|---:|");
    for (size_t m = 0; m < modes.size(); ++m) std::printf(m ? "---:|---:|" : "---:|");
    std::printf("\n");
    for (size_t i = 0; i + modes.size() <= rows.size(); i += modes.size()) {
      const size_t floats = rows[i].bytes / 4;
      if (floats % (size_t{1} << 20) == 0) std::printf("| %d | %zuM |", rows[i].ranks, floats >> 20);
      else std::printf("| %d | %zu |", rows[i].ranks, floats);
      for (size_t m = 0; m < modes.size(); ++m) {
        const Row& r = rows[i + m];
        std::printf(" %.3f |", r.busbw);
        if (m) std::printf(" %.2fx |", r.busbw / rows[i].busbw);
      }
      std::printf("\n");
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
      f << (i ? ", " : "") << "{\"ranks\": " << r.ranks << ", \"bytes\": " << r.bytes << ", \"security\": \"" << r.security
        << "\", \"algo\": \"" << r.algo << "\", \"p50_us\": " << r.p50_us << ", \"p99_us\": " << r.p99_us
        << ", \"algbw\": " << r.algbw << ", \"busbw\": " << r.busbw << ", \"wrong\": " << r.wrong << "}";
    }
    f << "]\n";
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
