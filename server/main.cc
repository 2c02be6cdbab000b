// gradsync-server: the scheduler of a job (--role=scheduler) or one parameter-server shard
// (--role=server).
#include <sodium.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "common/base/atomic_file.h"
#include "common/base/clock.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/config/cluster.h"
#include "common/config/flags.h"
#include "common/config/train_config.h"
#include "common/net/security.h"
#include "common/net/transport.h"
#include "common/obs/metrics.h"
#include "common/obs/process_summary.h"
#include "common/obs/trace.h"
#include "server/scheduler/scheduler.h"
#include "server/server.h"

namespace gradsync {
namespace {

// SHA-256 of parameters as float32 in order (lowercase hex), as a Python worker's summary has it.
std::string ParamsSha256(const std::vector<float>& params) {
  if (sodium_init() < 0) return "";
  unsigned char digest[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(digest, reinterpret_cast<const unsigned char*>(params.data()), params.size() * sizeof(float));
  char hex[2 * crypto_hash_sha256_BYTES + 1];
  sodium_bin2hex(hex, sizeof(hex), digest, sizeof(digest));
  return hex;
}

// DIR/server-<rank>.json (common/proto/summary.proto).
void WriteServerSummary(const std::string& dir, const Server& server, const ServerOptions& o, const Status& status,
                        double wall_s) {
  const ServerStats& st = server.stats();
  summary::ProcessSummary s;
  s.set_role("server");
  s.set_rank(server.rank());
  s.set_mode(ConsistencyModeName(o.rule.mode));
  if (o.rule.mode == ConsistencyMode::kSsp) s.set_staleness_bound(o.rule.staleness);
  s.set_ok(status.ok());
  if (!status.ok()) s.set_error(status.message());
  s.set_wall_s(wall_s);
  s.set_pushes(st.requests.pushes);
  s.set_pulls(st.requests.pulls);
  s.set_compressed_pulls(st.channels.compressed_pulls);
  s.set_rejected(st.requests.rejected);
  s.set_malformed(st.requests.malformed);
  s.set_checkpoints(st.recovery.checkpoints);
  s.set_checkpoint_ms_max(st.recovery.checkpoint_ms_max);
  s.set_checkpoint_age_s(server.checkpoint_age_s());
  s.set_checkpoint_failures(st.recovery.checkpoint_failures);
  s.set_restored(st.recovery.restored);
  s.set_adopted(st.recovery.adopted);
  s.set_lost_updates(st.recovery.lost_updates);
  s.set_version(server.version());
  s.set_params_sha256(ParamsSha256(server.params()));
  s.set_bytes_sent(static_cast<int64_t>(st.traffic.bytes_sent));
  s.set_bytes_received(static_cast<int64_t>(st.traffic.bytes_received));
  SetHistogram(st.requests.version_lag, s.mutable_version_lag());
  SetHistogram(st.requests.clock_staleness, s.mutable_clock_staleness());
  if (const auto [rows, bytes] = server.table_size(); rows > 0) {
    s.set_table_rows(rows);
    s.set_table_mib(static_cast<double>(bytes) / (1 << 20));
  }
  s.set_peak_rss_mib(PeakRssMib());
  if (const DelayCompensation* dc = server.delay_compensation()) {
    s.set_delay_compensation_bytes(static_cast<int64_t>(dc->bytes()));
    s.set_compensated_pushes(dc->corrected());
    s.set_uncompensated_pushes(dc->uncorrected());
    s.set_delay_compensation_relative(dc->relative_correction());
  }
  if (Status w = WriteProcessSummary(dir, s); !w.ok()) {
    std::cerr << "gradsync-server: warning: summary not written: " << w.message() << std::endl;
  }
}

// Writes the trace (when one was recorded) and says where, or why not.
void ReportTrace(const std::string& path) {
  if (path.empty() || !Trace::on()) return;
  size_t events = 0;
  if (Status t = Trace::Stop(&events); !t.ok()) {
    std::cerr << "gradsync-server: the trace was not written: " << t.message() << std::endl;
  } else {
    GRADSYNC_LOG(INFO) << "trace: " << events << " events in " << path;
  }
}

// --role=scheduler: the job's control plane, until every worker finished or died.
int RunScheduler(const FlagParser& flags, const po::variables_map& vm, TransportContext& ctx, config::Mode mode,
                 int staleness, int port, double hb_timeout) {
  for (const char* f : {"scheduler", "rank", "out", "host", "checkpoint-dir", "checkpoint-every", "checkpoint-interval"})
    if (FlagGiven(vm, f)) flags.Fail(std::string("--") + f + " does not apply to --role=scheduler");
  if (!vm.count("num-servers") || !vm.count("num-workers")) flags.Fail("the scheduler needs --num-servers and --num-workers");
  SchedulerOptions o;
  o.bind_host = vm["bind"].as<std::string>();
  o.port = static_cast<uint16_t>(port);
  o.num_servers = vm["num-servers"].as<int>();
  o.num_workers = vm["num-workers"].as<int>();
  if (o.num_servers < 0 || o.num_workers < 1) flags.Fail("--num-servers must be >= 0 and --num-workers >= 1");
  o.mode = ModeName(mode);  // "" when not given
  if (FlagGiven(vm, "staleness")) o.staleness = staleness;
  o.heartbeat_timeout_s = hb_timeout;
  o.register_timeout_s = vm["register-timeout"].as<double>();
  o.replicas = vm["replicas"].as<int>();
  if (o.replicas < 1 || o.replicas > std::max(1, o.num_servers)) {
    flags.Fail("--replicas must be between 1 and --num-servers (" + std::to_string(o.num_servers) + ")");
  }
  auto sched = Scheduler::Create(ctx, o);
  if (!sched.ok()) {
    std::cerr << "gradsync-server: error: " << sched.status().message() << std::endl;
    return 1;
  }
  TraceStopper trace_stopper;  // the trace is written however this returns
  if (vm.count("trace")) {
    // The scheduler's clock is the job's: its offset is 0.
    if (Status t = Trace::Start(vm["trace"].as<std::string>(), "scheduler", 0); !t.ok()) flags.Fail("--trace: " + t.message());
  }
  std::printf("scheduler listening on %s:%u\n", o.bind_host.c_str(), (*sched)->port());
  std::fflush(stdout);
  if (vm.count("port-file")) {
    const std::string path = vm["port-file"].as<std::string>();
    std::ofstream(path + ".tmp") << (*sched)->port() << "\n";
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
  Status s = (*sched)->Run();
  ReportTrace(vm.count("trace") ? vm["trace"].as<std::string>() : "");
  if (!s.ok()) {
    std::cerr << "gradsync-server: error: " << s.message() << std::endl;
    return 1;
  }
  return 0;
}

// --role=server: one shard, until the scheduler shuts the job down.
// The shard's options from its flags (a bad or contradictory one: flags.Fail, exit code 2).
ServerOptions ShardOptions(const FlagParser& flags, const po::variables_map& vm, config::Mode mode, int staleness,
                           int port, double hb_interval, double hb_timeout) {
  for (const char* f : {"num-servers", "num-workers", "port-file", "replicas"})
    if (FlagGiven(vm, f)) flags.Fail(std::string("--") + f + " does not apply to --role=server");
  if (mode == config::MODE_UNSPECIFIED) flags.Fail("--mode is required for a server (bsp|ssp|asp)");
  if (!vm.count("scheduler")) flags.Fail("--scheduler=HOST:PORT is required for a server");
  ServerOptions o;
  std::string host;
  uint16_t sport = 0;
  if (Status s = ParseHostPort(vm["scheduler"].as<std::string>(), &host, &sport); !s.ok()) flags.Fail("--scheduler: " + s.message());
  o.link.scheduler_endpoint = "tcp://" + host + ":" + std::to_string(sport);
  o.channels.bind_host = vm["bind"].as<std::string>();
  o.link.advertise_host = vm["host"].as<std::string>();
  o.channels.port = static_cast<uint16_t>(port);
  o.link.requested_rank = vm["rank"].as<int>();
  if (o.link.requested_rank < 0) {  // the launcher's (Slurm, mpirun, torchrun), else the scheduler assigns one
    auto launched = RankFromLaunchers(ProcessEnv());
    if (!launched.ok()) flags.Fail(launched.status().message() + ", or give --rank");
    if (*launched) o.link.requested_rank = (*launched)->rank;
  }
  o.rule.mode = *ParseConsistencyMode(ModeName(mode));
  o.rule.staleness = staleness;
  o.link.heartbeat_interval_s = hb_interval;
  o.link.scheduler_timeout_s = hb_timeout;
  o.link.register_timeout_s = vm["register-timeout"].as<double>();
  if (vm.count("checkpoint-dir")) {
    o.checkpoints.dir = vm["checkpoint-dir"].as<std::string>();
    // Found out now, not once a second for the whole job: a directory that cannot take a file.
    if (Status w = CheckWritableDirectory(o.checkpoints.dir); !w.ok()) flags.Fail("--checkpoint-dir: " + w.message());
  } else if (FlagGiven(vm, "checkpoint-every") || FlagGiven(vm, "checkpoint-interval")) {
    flags.Fail("--checkpoint-every and --checkpoint-interval need --checkpoint-dir");
  }
  o.checkpoints.every = vm["checkpoint-every"].as<int64_t>();
  o.checkpoints.interval_s = vm["checkpoint-interval"].as<double>();
  if (o.checkpoints.every < 0) flags.Fail("--checkpoint-every must be >= 0");
  if (!(o.checkpoints.interval_s > 0)) flags.Fail("--checkpoint-interval must be > 0");
  o.rule.apply_threads = vm["apply-threads"].as<int>();
  if (o.rule.apply_threads < 1 || o.rule.apply_threads > 64) flags.Fail("--apply-threads must be in [1, 64]");
  if (vm.count("trace")) {
    o.trace_path = vm["trace"].as<std::string>();
    // Found out now, not at the end: a file that cannot be created (the trace starts once the
    // shard has its rank and its clock offset).
    if (Status t = CheckTraceFile(o.trace_path); !t.ok()) flags.Fail("--trace: " + t.message());
  }
  return o;
}

// The shard's last words: what it applied and answered, and its checkpoints.
void LogShardSummary(const Server& server, const ServerOptions& o) {
  const auto& st = server.stats();
  auto p50_99_max = [](const Histogram& h) {
    return std::to_string(HistogramQuantile(h, 0.5)) + "/" + std::to_string(HistogramQuantile(h, 0.99)) + "/" +
           std::to_string(h.empty() ? 0 : h.rbegin()->first);
  };
  GRADSYNC_LOG(INFO) << "server " << server.rank() << ": " << st.requests.pushes << " gradients applied (version lag p50/p99/max "
                     << p50_99_max(st.requests.version_lag) << " updates), " << st.requests.pulls
                     << " pulls answered (clock staleness p50/p99/max " << p50_99_max(st.requests.clock_staleness) << " clocks), "
                     << st.requests.rejected << " rejected (" << st.requests.malformed << " malformed), " << st.traffic.bytes_received
                     << " bytes in, " << st.traffic.bytes_sent << " out";
  if (const auto [rows, bytes] = server.table_size(); rows > 0) {
    char mib[32];
    std::snprintf(mib, sizeof mib, "%.1f", static_cast<double>(bytes) / (1 << 20));
    GRADSYNC_LOG(INFO) << "server " << server.rank() << ": holds " << rows << " table rows (" << mib
                       << " MiB with their index and optimizer state)";
  }
  if (const DelayCompensation* dc = server.delay_compensation()) {
    char relative[32];
    std::snprintf(relative, sizeof relative, "%.2f%%", 100 * dc->relative_correction());
    GRADSYNC_LOG(INFO) << "server " << server.rank() << ": delay compensation corrected " << dc->corrected()
                       << " pushes (" << dc->uncorrected() << " applied uncorrected), changing them by " << relative
                       << " (root mean square of the correction over that of the gradients)";
  }
  if (!o.checkpoints.dir.empty()) {
    GRADSYNC_LOG(INFO) << "server " << server.rank() << ": " << st.recovery.checkpoints << " checkpoints (slowest "
                       << st.recovery.checkpoint_ms_max << " ms)"
                       << (st.recovery.restored ? "; restored from a checkpoint, " + std::to_string(st.recovery.lost_updates) +
                                             " updates lost"
                                       : "");
  }
}

int RunShard(const FlagParser& flags, const po::variables_map& vm, TransportContext& ctx, config::Mode mode,
             int staleness, int port, double hb_interval, double hb_timeout) {
  const ServerOptions o = ShardOptions(flags, vm, mode, staleness, port, hb_interval, hb_timeout);
  TraceStopper trace_stopper;  // the trace is written however this returns
  Stopwatch wall;
  auto server = Server::Create(ctx, o);
  if (!server.ok()) {
    std::cerr << "gradsync-server: error: " << server.status().message() << std::endl;
    return 1;
  }
  Status s = (*server)->Run();
  ReportTrace(o.trace_path);
  if ((*server)->rank() < 0) {  // never joined the job: nothing was served, nothing to report
    if (s.ok()) return 0;
    std::cerr << "gradsync-server: error: " << s.message() << std::endl;
    // Refused by the scheduler (a mode or bound that is not the job's): a usage error, as for
    // a worker.
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  LogShardSummary(**server, o);
  if (vm.count("out")) {
    WriteServerSummary(vm["out"].as<std::string>(), **server, o, s, wall.Seconds());
    // Shards of dead servers this one took over (--replicas) report under their own rank.
    for (const Server* a : (*server)->adopted()) WriteServerSummary(vm["out"].as<std::string>(), *a, o, s, wall.Seconds());
  }
  if (!s.ok()) {
    std::cerr << "gradsync-server: error: " << s.message() << std::endl;
    return 1;
  }
  return 0;
}

int Main(int argc, char** argv) {
  FlagParser flags("gradsync-server",
                   "The scheduler of a gradsync job (--role=scheduler) or one parameter-server shard "
                   "(--role=server).");
  flags.options().add_options()
      ("role", po::value<std::string>(), "scheduler|server (required)")
      ("mode", po::value<std::string>(), "bsp|ssp|asp (server: required; scheduler: optional, then nodes must match)")
      ("staleness", po::value<int>()->default_value(0), "ssp staleness bound s >= 0")
      ("scheduler", po::value<std::string>(), "server: the scheduler's HOST:PORT")
      ("port", po::value<int>()->default_value(0), "port to bind (0: ephemeral; the real one is advertised)")
      ("bind", po::value<std::string>()->default_value("127.0.0.1"), "address to bind")
      ("host", po::value<std::string>()->default_value("127.0.0.1"), "server: address advertised to workers")
      ("rank", po::value<int>()->default_value(-1), "server: requested rank (default: the launcher's, as for gradsync-worker; else assigned)")
      ("num-servers", po::value<int>(), "scheduler: servers in the job")
      ("num-workers", po::value<int>(), "scheduler: workers in the job")
      ("port-file", po::value<std::string>(), "scheduler: write the bound port to this file")
      ("replicas", po::value<int>()->default_value(1), "scheduler: copies of every shard, each on another server (2: one backup that takes over when the shard's server dies)")
      ("heartbeat-interval", po::value<double>()->default_value(1.0), "seconds between heartbeats")
      ("heartbeat-timeout", po::value<double>()->default_value(10.0), "seconds of silence before a node is declared dead")
      ("register-timeout", po::value<double>()->default_value(300.0), "seconds to wait for the job to fill up")
      ("out", po::value<std::string>(), "server: write its summary, server-<rank>.json (counts, bytes, version-lag and clock-staleness histograms), into DIR")
      ("auth-dir", po::value<std::string>(), "authenticate and encrypt every socket with CURVE, using the keys gradsync-keygen wrote in DIR")
      ("checkpoint-dir", po::value<std::string>(), "server: checkpoint the shard to DIR/shard-<rank>.ckpt; a restarted server rejoining the job restores from it")
      ("checkpoint-every", po::value<int64_t>()->default_value(0), "server: checkpoint after this many updates (0: by time only)")
      ("checkpoint-interval", po::value<double>()->default_value(5.0), "server: checkpoint at most this many seconds after an update")
      ("trace", po::value<std::string>(), "write a Chrome trace-event JSON timeline of this process (Perfetto, chrome://tracing) to FILE: a server's receive, validate, decode, apply, held pulls, bsp round waits and checkpoints; the scheduler's deaths, rejoins and barriers")
      ("apply-threads", po::value<int>()->default_value(2), "server: threads that apply a large dense update together (1: the server's loop alone; the result is the same bit for bit)");
  auto vm = flags.ParseOrExit(argc, argv);
  TuneAllocatorForLargeMessages();
  if (!vm.count("role")) flags.Fail("--role is required (scheduler|server)");
  const std::string role = vm["role"].as<std::string>();
  const int port = vm["port"].as<int>();
  if (port < 0 || port > 65535) flags.Fail("--port must be in [0, 65535]");
  const double hb_interval = vm["heartbeat-interval"].as<double>();
  const double hb_timeout = vm["heartbeat-timeout"].as<double>();
  if (!(hb_interval > 0) || !(hb_timeout > hb_interval)) {
    flags.Fail("--heartbeat-interval must be > 0 and below --heartbeat-timeout");
  }
  const int staleness = vm["staleness"].as<int>();
  if (staleness < 0) flags.Fail("--staleness must be >= 0");
  config::Mode mode = config::MODE_UNSPECIFIED;  // the scheduler's may stay unset: the first node sets it
  if (vm.count("mode")) {
    const std::string name = vm["mode"].as<std::string>();
    auto m = ParseMode(name);
    if (!m.ok() || !(IsPsMode(*m) || (role == "scheduler" && *m == config::ALLREDUCE))) {
      flags.Fail("--mode must be bsp, ssp or asp, not '" + name + "'");
    }
    mode = *m;
  }
  if (FlagGiven(vm, "staleness") && mode != config::SSP) flags.Fail("--staleness applies to --mode=ssp only");
  TransportContext ctx(1);
  // --auth-dir: CURVE on every socket of this context (declared after it: stops first).
  std::unique_ptr<CurveAuthenticator> auth;
  if (vm.count("auth-dir")) {
    auto a = EnableCurveFromDir(ctx, vm["auth-dir"].as<std::string>(), KeyRole::kServer);
    if (!a.ok()) flags.Fail("--auth-dir: " + a.status().message());
    auth = std::move(a).value();
  }

  if (role == "scheduler") return RunScheduler(flags, vm, ctx, mode, staleness, port, hb_timeout);
  if (role != "server") flags.Fail("--role must be scheduler or server, not '" + role + "'");
  return RunShard(flags, vm, ctx, mode, staleness, port, hb_interval, hb_timeout);
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
