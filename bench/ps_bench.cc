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
//
// --replicas=1,2 runs each configuration once per replica count (the scheduler's --replicas:
// every accepted push is forwarded to the shard's backups and acknowledged once they hold it).
// The jobs of one configuration are all started together and, within every repeat, timed one
// after the other (the order reversed every other repeat), so that the machine's noisy spells
// hit every count alike; vs_r1 is a row's median GB/s over the replicas=1 row's.
//
// --processes (bench/ps_bench_procs.cc): the same loops with the scheduler and shards as
// gradsync-server processes and every worker a process of its own, and the ceilings (ZeroMQ
// REQ/REP and PUSH/PULL, one TCP stream, memcpy) measured across processes in the same run; and,
// per configuration, small requests (--small-keys: sparse pushes and pulls of 1,000 keys) in
// round trips/s beside raw ZeroMQ REQ/REP round trips of the same bytes.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/ps_bench_procs.h"
#include "bench/ps_bench_rows.h"
#include "common/base/logging.h"
#include "common/config/flags.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/net/security.h"
#include "common/net/transport.h"
#include "server/scheduler/scheduler.h"
#include "server/server.h"
#include "worker/ps/client/ps_client.h"

namespace gradsync {
namespace {

using psbench::Median;
using psbench::Quantile;

using Clock = std::chrono::steady_clock;


struct Row {
  bool curve = false;
  std::string op;
  int servers, workers, replicas;
  int64_t size;
  double gbps, p50_ms, p99_ms;
  int64_t wrong;
  double vs_r1 = -1;  // gbps / the replicas=1 row's of the same op and configuration; < 0: none
};

enum class Op { kPush, kPull, kPushPull };
const char* OpName(Op op) { return op == Op::kPush ? "push" : op == Op::kPull ? "pull" : "push+pull"; }

// One job: its own context (CURVE on every socket when `security` is given), scheduler, shards
// and what its workers measured.
struct Job {
  int replicas = 1;
  std::unique_ptr<TransportContext> ctx;
  std::unique_ptr<CurveAuthenticator> auth;
  std::unique_ptr<Scheduler> sched;
  std::string endpoint;
  std::vector<std::unique_ptr<Server>> shards;
  std::vector<std::thread> threads;  // scheduler and shards
  std::vector<std::vector<double>> latencies = std::vector<std::vector<double>>(3), rates = std::vector<std::vector<double>>(3);
  std::atomic<int64_t> wrong{0};
};

std::unique_ptr<Job> StartJob(int servers, int workers, int replicas, const Security* security) {
  auto job = std::make_unique<Job>();
  job->replicas = replicas;
  job->ctx = std::make_unique<TransportContext>(2);
  if (security) job->auth = std::move(EnableCurve(*job->ctx, *security)).value();
  SchedulerOptions so;
  so.num_servers = servers;
  so.num_workers = workers;
  so.replicas = replicas;
  job->sched = std::move(Scheduler::Create(*job->ctx, so)).value();
  job->endpoint = "tcp://127.0.0.1:" + std::to_string(job->sched->port());
  for (int i = 0; i < servers; ++i) {
    ServerOptions o;
    o.link.scheduler_endpoint = job->endpoint;
    o.rule.mode = ConsistencyMode::kAsp;
    o.link.requested_rank = i;
    job->shards.push_back(std::move(Server::Create(*job->ctx, o)).value());
  }
  job->threads.emplace_back([s = job->sched.get()] { (void)s->Run(); });
  for (auto& s : job->shards) job->threads.emplace_back([srv = s.get()] { (void)srv->Run(); });
  return job;
}

// Runs one job per replica count, all alive at once, and measures the three operations in
// turn. Each repeat of an operation times the jobs one after the other (the order reversed every
// other repeat), so that a noisy spell of the machine hits every replica count alike.
std::vector<Row> RunConfig(int servers, int workers, int64_t size, int iters, int repeats, const Security* security,
                           const std::vector<int>& replicas) {
  std::vector<std::unique_ptr<Job>> jobs;
  for (int r : replicas) jobs.push_back(StartJob(servers, workers, r, security));
  const int num_jobs = static_cast<int>(jobs.size());
  const Op ops[] = {Op::kPush, Op::kPull, Op::kPushPull};
  std::mutex mu;
  std::barrier sync(workers * num_jobs);  // every worker of every job
  std::vector<std::thread> wthreads;
  for (int j = 0; j < num_jobs; ++j) {
    for (int w = 0; w < workers; ++w) {
      wthreads.emplace_back([&, j, w] {
        Job& job = *jobs[static_cast<size_t>(j)];
        TransportContext& ctx = *job.ctx;
        SchedulerClientOptions sc;
        sc.scheduler_endpoint = job.endpoint;
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
          GRADSYNC_CHECK(ps->Init(psbench::BenchJobConfig(size, workers), params, 60).ok());
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
            for (int turn = 0; turn < num_jobs; ++turn) {
              const bool mine = (r % 2 == 0 ? turn : num_jobs - 1 - turn) == j;
              sync.arrive_and_wait();
              auto t0 = Clock::now();
              std::vector<double> lat;
              if (mine) {
                for (int i = 0; i < iters; ++i) lat.push_back(one());
              }
              sync.arrive_and_wait();
              if (!mine) continue;
              const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
              std::lock_guard lock(mu);
              job.latencies[k].insert(job.latencies[k].end(), lat.begin(), lat.end());
              if (w == 0) {
                const double per_op = (op == Op::kPushPull ? 2.0 : 1.0) * static_cast<double>(size) * sizeof(float);
                job.rates[k].push_back(per_op * iters * workers / secs / 1e9);
              }
            }
          }
        }
        // Gradients are zero and lr is 1: every pulled value must still be exactly 0.
        for (float v : params) job.wrong += v != 0.0f;
        client.Finished(OkStatus());
        client.Flush(1);
      });
    }
  }
  for (auto& t : wthreads) t.join();
  for (auto& job : jobs) {
    for (auto& t : job->threads) t.join();
  }
  std::vector<Row> rows;
  for (int k = 0; k < 3; ++k) {
    double base = -1;
    for (auto& job : jobs) {
      if (job->replicas == 1) base = Median(job->rates[k]);
    }
    for (auto& job : jobs) {
      Row row{security != nullptr, OpName(ops[k]), servers, workers, job->replicas, size, Median(job->rates[k]),
              Quantile(job->latencies[k], 0.5), Quantile(job->latencies[k], 0.99), job->wrong.load()};
      if (base > 0) row.vs_r1 = row.gbps / base;
      rows.push_back(row);
    }
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
  if (psbench::IsRole(argc, argv)) return psbench::RunRole(argc, argv);  // a child of --processes
  FlagParser flags("gradsync-bench-ps", "Parameter-server push/pull throughput and latency on loopback.");
  flags.options().add_options()
      ("sizes", po::value<std::string>()->default_value("1048576,16777216"),
       "floats per tensor (--processes: none = only the small requests)")
      ("configs", po::value<std::string>()->default_value("1x1,2x2"), "SERVERSxWORKERS list")
      ("iters", po::value<int>()->default_value(0), "operations per repeat (0: 20 for <= 4M floats, else 6)")
      ("repeats", po::value<int>()->default_value(5), "timed repeats (median reported)")
      ("replicas", po::value<std::string>()->default_value("1"),
       "copies of every shard (the scheduler's --replicas; 1: no backups), comma-separated: each configuration runs once per "
       "count, the jobs alternating within every repeat; a configuration with fewer servers than a count skips it")
      ("curve", po::value<std::string>()->default_value("off"), "off|on|both: CURVE (--auth-dir's encryption) on every socket; both runs each config plain and then with CURVE")
      ("processes", po::bool_switch(), "run the scheduler and shards as gradsync-server processes (found next to this "
       "binary) and every worker as a process of its own, and measure the ceilings (ZeroMQ REQ/REP and PUSH/PULL with "
       "the shards' message sizes, one TCP stream, memcpy) in the same run, also across processes; each row gets "
       "vs_ceiling. Only with --curve=off and --replicas=1")
      ("paths", po::value<std::string>()->default_value("zmq,tcp,shm"),
       "--processes: zmq (values over ZeroMQ), tcp (large values over a data channel beside ZeroMQ, what a shard on "
       "another host gets), shm (through shared-memory lanes, headers over ZeroMQ), comma-separated; rows get vs_zmq "
       "and vs_tcp")
      ("small-keys", po::value<int>()->default_value(1000),
       "--processes: per configuration also small requests, a sparse push and a sparse pull of this many sorted unique "
       "random keys per op, in round trips/s beside a ZeroMQ REQ/REP ceiling of the same bytes; 0: off")
      ("small-iters", po::value<int>()->default_value(2000), "--processes: small-request ops per repeat")
      ("rows", po::value<std::string>()->default_value(""),
       "--processes: instead of the dense tensor, sparse push+pull of embedding rows (ps_bench_rows.h): BATCHxFEATURES, "
       "a batch of BATCH ids per table of FEATURES tables per worker and op, e.g. 4096x26; rows/s in every --paths of "
       "zmq (loopback TCP) and shm (lanes attached: co-located)")
      ("row-dims", po::value<std::string>()->default_value("16,64"), "--rows: the tables' dims, comma-separated")
      ("row-ids", po::value<uint64_t>()->default_value(100000000), "--rows: ids per table")
      ("row-zipf", po::value<double>()->default_value(1.05), "--rows: the ids' Zipf exponent")
      ("row-sets", po::value<int>()->default_value(8), "--rows: batches each worker draws and cycles through")
      ("row-keys-out", po::value<std::string>()->default_value(""),
       "--rows: write each worker's batches as ps-lite keys to PREFIX-<rank>.bin (bench/pslite/run.sh --rows-keys)")
      ("json", po::value<std::string>(), "also write the rows as JSON here");
  auto vm = flags.ParseOrExit(argc, argv);
  TuneAllocatorForLargeMessages();
  SetLogLevel(LogLevel::kWarning);
  const bool processes = vm["processes"].as<bool>();
  auto sizes = processes && vm["sizes"].as<std::string>() == "none"
                   ? Result<std::vector<int64_t>>(std::vector<int64_t>{})
                   : ParseIntList(vm["sizes"].as<std::string>(), 1, int64_t{1} << 28);
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
  std::vector<int> replicas;
  {
    auto list = ParseIntList(vm["replicas"].as<std::string>(), 1, 16);
    if (!list.ok()) flags.Fail("--replicas: " + list.status().message());
    for (int64_t r : *list) {
      if (std::find(replicas.begin(), replicas.end(), r) != replicas.end()) flags.Fail("--replicas: " + std::to_string(r) + " given twice");
      replicas.push_back(static_cast<int>(r));
    }
  }
  const bool ratio = replicas.size() > 1;
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
  if (processes) {
    if (curve != "off") flags.Fail("--processes runs with --curve=off only");
    if (replicas != std::vector<int>{1}) flags.Fail("--processes runs with --replicas=1 only");
    std::vector<std::string> paths;
    std::stringstream ps(vm["paths"].as<std::string>());
    for (std::string p; std::getline(ps, p, ',');) {
      if (p != "zmq" && p != "tcp" && p != "shm") flags.Fail("--paths: '" + p + "' is not zmq, tcp or shm");
      if (std::find(paths.begin(), paths.end(), p) != paths.end()) flags.Fail("--paths: " + p + " given twice");
      paths.push_back(p);
    }
    if (paths.empty()) flags.Fail("--paths names no path");
    if (!vm["rows"].as<std::string>().empty()) {
      psbench::RowsOptions ro;
      char x = 0;
      std::stringstream rs(vm["rows"].as<std::string>());
      if (!(rs >> ro.batch >> x >> ro.features) || x != 'x' || !rs.eof() || ro.batch < 1 || ro.batch > 65536 ||
          ro.features < 1 || ro.features > 1024) {
        flags.Fail("--rows: BATCHxFEATURES (batch in [1, 65536], features in [1, 1024]), not '" + vm["rows"].as<std::string>() + "'");
      }
      auto dims = ParseIntList(vm["row-dims"].as<std::string>(), 1, 4096);
      if (!dims.ok()) flags.Fail("--row-dims: " + dims.status().message());
      ro.dims.assign(dims->begin(), dims->end());
      ro.ids = vm["row-ids"].as<uint64_t>();
      if (ro.ids < 1 || ro.ids > (uint64_t{1} << 40)) flags.Fail("--row-ids must be in [1, 2^40]");
      ro.zipf = vm["row-zipf"].as<double>();
      if (!(ro.zipf > 0 && ro.zipf <= 3)) flags.Fail("--row-zipf must be in (0, 3]");
      ro.sets = vm["row-sets"].as<int>();
      if (ro.sets < 1 || ro.sets > 1024) flags.Fail("--row-sets must be in [1, 1024]");
      for (const std::string& p : paths) {
        if (p == "tcp") flags.Fail("--rows: rows travel over ZeroMQ (zmq), with or without lanes (shm); no data channel (tcp)");
      }
      ro.paths = paths;
      ro.configs = configs;
      ro.iters = vm["iters"].as<int>() > 0 ? vm["iters"].as<int>() : 10;
      ro.repeats = repeats;
      ro.keys_out = vm["row-keys-out"].as<std::string>();
      ro.json = vm.count("json") ? vm["json"].as<std::string>() : std::string();
      return psbench::RunRowsProcs(ro);
    }
    const int small_keys = vm["small-keys"].as<int>(), small_iters = vm["small-iters"].as<int>();
    if (small_keys < 0 || small_keys > 65536) flags.Fail("--small-keys must be in [0, 65536]");
    if (small_iters < 1) flags.Fail("--small-iters must be >= 1");
    if (sizes->empty() && small_keys == 0) flags.Fail("--sizes=none with --small-keys=0 measures nothing");
    return psbench::RunProcesses(*sizes, configs, paths, vm["iters"].as<int>(), repeats, small_keys, small_iters,
                                 vm.count("json") ? vm["json"].as<std::string>() : std::string());
  }
  std::printf("# gradsync-bench-ps: GB/s of values (1e9 B), median of %d repeats; latency per op over all repeats\n", repeats);
  if (ratio) {
    std::printf("# replicas: one job per count, all alive at once, timed in turn within every repeat; vs_r1 = GB/s over the "
                "replicas=1 row's (same op and configuration)\n");
  }
  std::printf("%-6s %-10s %7s %7s %8s %10s %9s %9s %9s %7s", "curve", "op", "servers", "workers", "replicas", "floats", "GB/s",
              "p50_ms", "p99_ms", "#wrong");
  std::printf(ratio ? " %6s\n" : "\n", "vs_r1");
  std::vector<Row> all;
  for (int64_t size : *sizes) {
    const int iters = vm["iters"].as<int>() > 0 ? vm["iters"].as<int>() : (size <= (4 << 20) ? 20 : 6);
    for (auto [s, w] : configs) {
      std::vector<int> counts;
      for (int r : replicas) {
        if (r <= s) {
          counts.push_back(r);
        } else {
          std::printf("# %dx%d %lld floats: replicas=%d skipped (it needs at least %d servers)\n", s, w,
                      static_cast<long long>(size), r, r);
        }
      }
      if (counts.empty()) continue;
      for (const Security* sec : modes) {
        for (const Row& r : RunConfig(s, w, size, iters, repeats, sec, counts)) {
          std::printf("%-6s %-10s %7d %7d %8d %10lld %9.2f %9.3f %9.3f %7lld", r.curve ? "on" : "off", r.op.c_str(), r.servers,
                      r.workers, r.replicas, static_cast<long long>(r.size), r.gbps, r.p50_ms, r.p99_ms,
                      static_cast<long long>(r.wrong));
          if (ratio && r.vs_r1 >= 0) std::printf(" %6.2f", r.vs_r1);
          if (ratio && r.vs_r1 < 0) std::printf(" %6s", "-");
          std::printf("\n");
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
        if (off.curve || off.op != on.op || off.servers != on.servers || off.workers != on.workers || off.size != on.size ||
            off.replicas != on.replicas) {
          continue;
        }
        std::printf("# CURVE push+pull %dx%d%s %lld floats: %.2f vs %.2f GB/s plain (%.2fx), p50 %.3f vs %.3f ms\n", on.servers,
                    on.workers, ratio ? (" replicas=" + std::to_string(on.replicas)).c_str() : "",
                    static_cast<long long>(on.size), on.gbps, off.gbps, on.gbps / off.gbps, on.p50_ms, off.p50_ms);
      }
    }
  }
  if (ratio) {  // replication's cost, measured in this run
    for (const Row& r : all) {
      if (r.op != "push+pull" || r.replicas == 1) continue;
      for (const Row& one : all) {
        if (one.op != r.op || one.replicas != 1 || one.curve != r.curve || one.servers != r.servers ||
            one.workers != r.workers || one.size != r.size) {
          continue;
        }
        std::printf("# replicas=%d push+pull %dx%d %lld floats%s: %.2f vs %.2f GB/s with replicas=1 (%.2fx), p50 %.3f vs %.3f ms\n",
                    r.replicas, r.servers, r.workers, static_cast<long long>(r.size), r.curve ? " CURVE" : "", r.gbps, one.gbps,
                    r.vs_r1, r.p50_ms, one.p50_ms);
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
        << ", \"replicas\": " << r.replicas << ", \"floats\": " << r.size << ", \"gbps\": " << r.gbps << ", \"p50_ms\": " << r.p50_ms
        << ", \"p99_ms\": " << r.p99_ms << ", \"wrong\": " << r.wrong;
      if (r.vs_r1 >= 0) f << ", \"vs_replicas1\": " << r.vs_r1;
      f << "}";
    }
    f << "]\n";
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
