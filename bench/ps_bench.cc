// gradsync-bench-ps: parameter-server push, pull and push+pull throughput (GB/s of float values,
// 1 GB = 1e9 bytes) and per-operation latency, on loopback, with a raw ZeroMQ stream and memcpy
// measured in the same run as ceilings.
//
// Each configuration runs a real job in this process: the scheduler, S server shards and N
// workers as threads, talking ZeroMQ over 127.0.0.1 (asp mode, so that no consistency rule
// waits; the server applies every push with SGD, which costs what summing costs). One tensor of
// `size` floats is spread over the shards. Every worker issues `iters` operations back to back
// per repeat, waiting for each; throughput per repeat = all workers' value bytes / wall time;
// the table shows the median over repeats and latency p50/p99 over every operation.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/flags.h"
#include "common/security.h"
#include "common/transport.h"
#include "common/logging.h"
#include "common/scheduler_client.h"
#include "server/scheduler.h"
#include "server/server.h"
#include "worker/ps_client.h"

namespace gradsync {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

struct Row {
  bool curve = false;
  std::string op;
  int servers, workers;
  int64_t size;
  double gbps, p50_ms, p99_ms;
  int64_t wrong;
};

enum class Op { kPush, kPull, kPushPull };
const char* OpName(Op op) { return op == Op::kPush ? "push" : op == Op::kPull ? "pull" : "push+pull"; }

// Runs one job and measures the three operations in turn.
std::vector<Row> RunConfig(int servers, int workers, int64_t size, int iters, int repeats, const Security* security) {
  TransportContext ctx(2);
  std::unique_ptr<CurveAuthenticator> auth;  // CURVE on every socket of this job
  if (security) auth = std::move(EnableCurve(ctx, *security)).value();
  SchedulerOptions so;
  so.num_servers = servers;
  so.num_workers = workers;
  auto sched = std::move(Scheduler::Create(ctx, so)).value();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(sched->port());
  std::vector<std::unique_ptr<Server>> shards;
  for (int i = 0; i < servers; ++i) {
    ServerOptions o;
    o.scheduler_endpoint = endpoint;
    o.mode = ConsistencyMode::kAsp;
    o.requested_rank = i;
    shards.push_back(std::move(Server::Create(ctx, o)).value());
  }
  std::vector<std::thread> threads;
  threads.emplace_back([&] { (void)sched->Run(); });
  for (auto& s : shards) threads.emplace_back([srv = s.get()] { (void)srv->Run(); });

  const Op ops[] = {Op::kPush, Op::kPull, Op::kPushPull};
  std::vector<std::vector<double>> latencies(3), rates(3);
  std::atomic<int64_t> wrong{0};
  std::mutex mu;
  std::barrier sync(workers);
  std::vector<std::thread> wthreads;
  for (int w = 0; w < workers; ++w) {
    wthreads.emplace_back([&, w] {
      SchedulerClientOptions sc;
      sc.scheduler_endpoint = endpoint;
      sc.self.set_role(wire::WORKER);
      sc.self.set_host("127.0.0.1");
      sc.self.set_requested_rank(w);
      sc.mode = "asp";
      SchedulerClient client(ctx, sc);
      auto table = client.Register(30);
      GRADSYNC_CHECK(table.ok()) << table.status();
      std::vector<TensorInfo> layout = {{"w", {size}, 0, size, false}};
      auto ps = std::move(PsClient::Create(ctx, *table, w, layout, &client)).value();
      std::vector<float> params(static_cast<size_t>(size), 0.0f), grads(static_cast<size_t>(size), 0.0f);
      if (w == 0) {
        wire::JobConfig job;
        auto* t = job.add_tensors();
        t->set_name("w");
        t->set_size(static_cast<uint64_t>(size));
        job.set_num_params(static_cast<uint64_t>(size));
        job.set_num_workers(workers);
        job.set_lr(1.0f);
        job.set_lr_schedule("constant");
        GRADSYNC_CHECK(ps->Init(job, params, 60).ok());
      }
      GRADSYNC_CHECK(client.Barrier("init", "workers", 60).ok());
      int64_t clock = 0;
      for (int k = 0; k < 3; ++k) {
        const Op op = ops[k];
        auto one = [&] {
          auto t0 = Clock::now();
          if (op != Op::kPull) {
            auto id = ps->Push(clock, grads, {}, {});
            GRADSYNC_CHECK(id.ok() && ps->Wait(*id, 60).ok());
            ++clock;
          }
          if (op != Op::kPush) {
            auto id = ps->Pull(clock, params, {});
            GRADSYNC_CHECK(id.ok() && ps->Wait(*id, 60).ok());
          }
          return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        };
        for (int i = 0; i < 2; ++i) one();  // warm-up
        for (int r = 0; r < repeats; ++r) {
          sync.arrive_and_wait();
          auto t0 = Clock::now();
          std::vector<double> lat;
          for (int i = 0; i < iters; ++i) lat.push_back(one());
          sync.arrive_and_wait();
          const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
          std::lock_guard lock(mu);
          latencies[k].insert(latencies[k].end(), lat.begin(), lat.end());
          if (w == 0) {
            const double per_op = (op == Op::kPushPull ? 2.0 : 1.0) * static_cast<double>(size) * sizeof(float);
            rates[k].push_back(per_op * iters * workers / secs / 1e9);
          }
        }
      }
      // Gradients are zero and lr is 1: every pulled value must still be exactly 0.
      for (float v : params) wrong += v != 0.0f;
      client.Finished(OkStatus());
      client.Flush(1);
    });
  }
  for (auto& t : wthreads) t.join();
  for (auto& t : threads) t.join();
  std::vector<Row> rows;
  for (int k = 0; k < 3; ++k) {
    rows.push_back({security != nullptr, OpName(ops[k]), servers, workers, size, Median(rates[k]), Quantile(latencies[k], 0.5),
                    Quantile(latencies[k], 0.99), wrong.load()});
  }
  return rows;
}

// Raw ZeroMQ: one PUSH socket streaming `size`-float messages to a PULL socket over loopback.
double RawZmqGbps(int64_t size, int messages) {
  TransportContext ctx(1);
  zmq::socket_t rx(ctx, zmq::socket_type::pull), tx(ctx, zmq::socket_type::push);
  rx.bind("tcp://127.0.0.1:*");
  tx.connect(rx.get(zmq::sockopt::last_endpoint));
  std::vector<float> buf(static_cast<size_t>(size), 1.0f);
  std::thread reader([&] {
    zmq::message_t m;
    for (int i = 0; i < messages + 2; ++i) (void)rx.recv(m);
  });
  for (int i = 0; i < 2; ++i) tx.send(zmq::buffer(buf));
  auto t0 = Clock::now();
  for (int i = 0; i < messages; ++i) tx.send(zmq::buffer(buf));
  reader.join();
  return static_cast<double>(size) * sizeof(float) * messages / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
}

double MemcpyGbps(int64_t size) {
  std::vector<float> a(static_cast<size_t>(size), 1.0f), b(static_cast<size_t>(size));
  std::vector<double> r;
  for (int i = 0; i < 7; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), a.size() * sizeof(float));
    r.push_back(static_cast<double>(size) * sizeof(float) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
  }
  return Median(r);
}

int Main(int argc, char** argv) {
  FlagParser flags("gradsync-bench-ps", "Parameter-server push/pull throughput and latency on loopback.");
  flags.options().add_options()
      ("sizes", po::value<std::string>()->default_value("1048576,16777216"), "floats per tensor")
      ("configs", po::value<std::string>()->default_value("1x1,2x2"), "SERVERSxWORKERS list")
      ("iters", po::value<int>()->default_value(0), "operations per repeat (0: 20 for <= 4M floats, else 6)")
      ("repeats", po::value<int>()->default_value(5), "timed repeats (median reported)")
      ("curve", po::value<std::string>()->default_value("off"), "off|on|both: CURVE (--auth-dir's encryption) on every socket; both runs each config plain and then with CURVE")
      ("json", po::value<std::string>(), "also write the rows as JSON here");
  auto vm = flags.ParseOrExit(argc, argv);
  TuneAllocatorForLargeMessages();
  SetLogLevel(LogLevel::kWarning);
  auto sizes = ParseIntList(vm["sizes"].as<std::string>(), 1, int64_t{1} << 28);
  if (!sizes.ok()) flags.Fail("--sizes: " + sizes.status().message());
  std::vector<std::pair<int, int>> configs;
  {
    std::stringstream ss(vm["configs"].as<std::string>());
    std::string c;
    while (std::getline(ss, c, ',')) {
      int s = 0, w = 0;
      char x = 0;
      std::stringstream cs(c);
      if (!(cs >> s >> x >> w) || x != 'x' || s < 1 || w < 1 || s > 16 || w > 16) flags.Fail("--configs: bad entry '" + c + "'");
      configs.push_back({s, w});
    }
  }
  const std::string curve = vm["curve"].as<std::string>();
  if (curve != "off" && curve != "on" && curve != "both") flags.Fail("--curve must be off, on or both");
  std::vector<const Security*> modes;
  Security cluster;
  if (curve != "on") modes.push_back(nullptr);
  if (curve != "off") {
    auto server = GenerateKeyPair(), client = GenerateKeyPair();
    if (!server.ok() || !client.ok()) flags.Fail("--curve: " + server.status().message());
    cluster.server = *server;
    cluster.client = *client;
    cluster.authorized = {client->public_key};
    modes.push_back(&cluster);
  }
  const int repeats = vm["repeats"].as<int>();
  if (repeats < 1 || vm["iters"].as<int>() < 0) flags.Fail("--repeats must be >= 1 and --iters >= 0");
  std::printf("# gradsync-bench-ps: GB/s of values (1e9 B), median of %d repeats; latency per op over all repeats\n", repeats);
  std::printf("%-6s %-10s %7s %7s %10s %9s %9s %9s %7s\n", "curve", "op", "servers", "workers", "floats", "GB/s", "p50_ms",
              "p99_ms", "#wrong");
  std::vector<Row> all;
  for (int64_t size : *sizes) {
    const int iters = vm["iters"].as<int>() > 0 ? vm["iters"].as<int>() : (size <= (4 << 20) ? 20 : 6);
    for (auto [s, w] : configs) {
      for (const Security* sec : modes) {
        for (const Row& r : RunConfig(s, w, size, iters, repeats, sec)) {
          std::printf("%-6s %-10s %7d %7d %10lld %9.2f %9.3f %9.3f %7lld\n", r.curve ? "on" : "off", r.op.c_str(),
                      r.servers, r.workers, static_cast<long long>(r.size), r.gbps, r.p50_ms, r.p99_ms,
                      static_cast<long long>(r.wrong));
          std::fflush(stdout);
          all.push_back(r);
        }
      }
    }
  }
  std::printf("# ceilings on this machine, same run:");
  for (int64_t size : *sizes) {
    std::printf(" raw ZeroMQ stream %lld floats %.2f GB/s;", static_cast<long long>(size), RawZmqGbps(size, size <= (4 << 20) ? 200 : 20));
  }
  std::printf(" memcpy %.2f GB/s\n", MemcpyGbps((*sizes).back()));
  if (modes.size() == 2) {  // CURVE's cost, measured in this run
    for (const Row& on : all) {
      if (!on.curve || on.op != "push+pull") continue;
      for (const Row& off : all) {
        if (off.curve || off.op != on.op || off.servers != on.servers || off.workers != on.workers || off.size != on.size) continue;
        std::printf("# CURVE push+pull %dx%d %lld floats: %.2f vs %.2f GB/s plain (%.2fx), p50 %.3f vs %.3f ms\n", on.servers,
                    on.workers, static_cast<long long>(on.size), on.gbps, off.gbps, on.gbps / off.gbps, on.p50_ms, off.p50_ms);
      }
    }
  }
  int64_t wrong = 0;
  for (const Row& r : all) wrong += r.wrong;
  std::printf("# check: %s\n", wrong == 0 ? "every pulled value correct" : "WRONG VALUES");
  if (vm.count("json")) {
    std::ofstream f(vm["json"].as<std::string>());
    f << "[";
    for (size_t i = 0; i < all.size(); ++i) {
      const Row& r = all[i];
      f << (i ? ", " : "") << "{\"curve\": " << (r.curve ? "true" : "false") << ", \"op\": \"" << r.op << "\", \"servers\": " << r.servers << ", \"workers\": " << r.workers
        << ", \"floats\": " << r.size << ", \"gbps\": " << r.gbps << ", \"p50_ms\": " << r.p50_ms
        << ", \"p99_ms\": " << r.p99_ms << ", \"wrong\": " << r.wrong << "}";
    }
    f << "]\n";
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
