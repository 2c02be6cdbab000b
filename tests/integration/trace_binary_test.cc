// Traces of a real job: every process of a 2-server, 4-worker ssp job with a straggler writes its
// trace, each on a clock of its own (GRADSYNC_TEST_CLOCK_SKEW_US: seconds apart, as other hosts'
// clocks would be); merged on the scheduler's clock, every push a worker sent ends before the
// shard's apply of it ends, to within the alignment's own error bound (half the best round trip
// of each process to the scheduler, recorded in its trace: tens of microseconds), and no apply
// begins before its push began; each process's offset undoes the skew it was given, to within
// that bound. And gradsync-run's `trace: true`: trace.json and the timeline picture.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "experiments/launch/launcher.h"
#include "experiments/process/process.h"
#include "experiments/trace/trace_merge.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace gradsync::testing {
namespace {

namespace fs = std::filesystem;

// Each process's clock skew: far larger than any step, so that a trace written on unaligned
// clocks would put pushes seconds after their applies (servers behind, workers ahead).
std::string Skew(const std::string& role, int rank) {
  if (role == "scheduler") return "0";
  return std::to_string(role == "server" ? -3e6 * (rank + 1) : 1e6 * (rank + 1));
}

TEST(TraceBinaryTest, MergedTraceOfAnSspJobOnSkewedClocksPutsEveryPushBeforeItsApply) {
  TempDir dir;
  LaunchOptions o;
  o.bin_dir = fs::path(BinaryPath("gradsync-server")).parent_path().string();
  o.out_dir = dir.path();
  o.mode = config::SSP;
  o.staleness = 2;
  o.num_servers = 2;
  o.num_workers = 4;
  o.heartbeat_timeout_s = 10;
  o.trace = true;
  o.worker_args = {"--dataset=blobs", "--hidden=32,16", "--epochs=1", "--batch=16", "--max-steps=40", "--lr=0.1",
                   "--lr-schedule=constant", "--eval-every=20", "--log-every=10"};
  o.worker_extra_args[3] = {"--straggle=ms:3"};
  fs::create_directories(o.out_dir + "/logs");
  fs::create_directories(o.out_dir + "/traces");

  ProcessGroup group;
  const std::string port_file = o.out_dir + "/logs/scheduler.port";
  ChildSpec sched = SchedulerSpec(o, "127.0.0.1", {"--port-file=" + port_file});
  sched.env = {{"GRADSYNC_TEST_CLOCK_SKEW_US", Skew("scheduler", 0)}};
  ASSERT_TRUE(group.Spawn(sched).ok());
  std::string port;
  for (int i = 0; i < 500 && port.empty(); ++i) {  // at most 10 s
    std::ifstream(port_file) >> port;
    if (port.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(port.empty()) << "the scheduler did not start";
  const std::string endpoint = "127.0.0.1:" + port;
  for (int s = 0; s < o.num_servers; ++s) {
    ChildSpec c = ServerSpec(o, s, endpoint, "127.0.0.1", o.out_dir + "/logs/server-" + std::to_string(s) + ".log");
    c.env = {{"GRADSYNC_TEST_CLOCK_SKEW_US", Skew("server", s)}};
    ASSERT_TRUE(group.Spawn(c).ok());
  }
  for (int w = 0; w < o.num_workers; ++w) {
    ChildSpec c = WorkerSpec(o, w, endpoint, "127.0.0.1", o.out_dir + "/logs/worker-" + std::to_string(w) + ".log");
    c.env = {{"GRADSYNC_TEST_CLOCK_SKEW_US", Skew("worker", w)}};
    ASSERT_TRUE(group.Spawn(c).ok());
  }
  ASSERT_TRUE(group.WaitAll(120).ok()) << "logs in " << o.out_dir << "/logs";

  auto merged = MergeJobTraces(o);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->processes, 7);
  EXPECT_TRUE(merged->missing.empty());
  auto trace = LoadTrace(o.out_dir + "/trace.json");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->processes, (std::vector<std::string>{"scheduler 0", "server 0", "server 1", "worker 0", "worker 1",
                                                        "worker 2", "worker 3"}));

  // Each shard's applies, by (worker, clock): when they ended.
  std::map<std::tuple<int, int, int>, double> apply_end, apply_begin;  // (shard, worker, clock)
  for (const auto& e : trace->events) {
    const std::string& p = trace->processes[static_cast<size_t>(e.process)];
    if (e.name == "apply" && p.starts_with("server ")) {
      const int shard = std::stoi(p.substr(7));
      apply_end[{shard, static_cast<int>(e.Arg("worker")), static_cast<int>(e.Arg("clock"))}] = e.end_us();
      apply_begin[{shard, static_cast<int>(e.Arg("worker")), static_cast<int>(e.Arg("clock"))}] = e.ts_us;
    }
  }
  ASSERT_EQ(apply_end.size(), 2u * 4 * 40);  // every push of every worker, on both shards
  // Each process's alignment is good to half its best round trip to the scheduler, which it
  // recorded: tens of microseconds here, against skews of seconds.
  ASSERT_EQ(trace->clock_error_us.size(), 7u);
  for (size_t p = 1; p < 7; ++p) {
    EXPECT_GE(trace->clock_error_us[p], 0) << trace->processes[p];
    EXPECT_LT(trace->clock_error_us[p], 5000) << trace->processes[p];
  }
  // Each process's offset to the scheduler's clock, against the skew this test gave it: the
  // scheduler runs on the host's clock, so the offset must undo the skew, to within its bound.
  for (const auto& [role, rank] : std::vector<std::pair<std::string, int>>{
           {"server", 0}, {"server", 1}, {"worker", 0}, {"worker", 1}, {"worker", 2}, {"worker", 3}}) {
    const std::string file = ReadFile(o.out_dir + "/traces/" + role + "-" + std::to_string(rank) + ".json");
    const size_t at = file.find("\"name\": \"clock_correction\"");
    ASSERT_NE(at, std::string::npos) << role << " " << rank << " recorded no clock correction";
    const double error = std::strtod(file.c_str() + file.find("\"error_us\": ", at) + 12, nullptr);
    const double offset = std::strtod(file.c_str() + file.find("\"offset_us\": ", at) + 13, nullptr);
    const double skew = std::stod(Skew(role, rank));
    EXPECT_NEAR(offset, -skew, error + 1.0) << role << " " << rank << ": offset " << offset << " us for a skew of " << skew
                                            << " us (bound " << error << " us)";
  }
  auto error_of = [&](const std::string& name) { return std::max(0.0, trace->clock_error_us[static_cast<size_t>(trace->Process(name))]); };
  std::map<int, int> pushes;                 // worker -> push spans checked
  int held_for_straggler = 0;
  int within_error = 0;  // pushes that end after their apply, but within the alignment's error
  for (const auto& e : trace->events) {
    const std::string& p = trace->processes[static_cast<size_t>(e.process)];
    if (e.name == "pull held" && e.Arg("waited for worker") == 3) ++held_for_straggler;
    if (e.name != "push" || !p.starts_with("worker ")) continue;
    const int w = std::stoi(p.substr(7));
    const auto key = std::make_tuple(static_cast<int>(e.Arg("shard")), w, static_cast<int>(e.Arg("clock")));
    auto it = apply_end.find(key);
    ASSERT_NE(it, apply_end.end()) << "worker " << w << "'s push of clock " << std::get<2>(key) << " to shard "
                                   << std::get<0>(key) << " has no apply";
    // Before the apply's end, to within the two processes' alignment error.
    const double error = error_of(p) + error_of("server " + std::to_string(std::get<0>(key)));
    EXPECT_LT(e.end_us(), it->second + error) << "worker " << w << "'s push of clock " << std::get<2>(key) << " to shard "
                                              << std::get<0>(key) << " ends " << e.end_us() - it->second
                                              << " us after the shard applied it (alignment error bound " << error << " us)";
    // And the other way: the shard cannot begin applying a gradient before the worker began
    // sending it.
    EXPECT_GT(apply_begin[key] + error, e.ts_us) << "shard " << std::get<0>(key) << " began applying worker " << w
                                                 << "'s push of clock " << std::get<2>(key) << " "
                                                 << e.ts_us - apply_begin[key] << " us before the push began";
    if (e.end_us() >= it->second) ++within_error;
    EXPECT_GT(e.Arg("bytes"), 0);
    ++pushes[w];
  }
  ASSERT_EQ(pushes.size(), 4u);
  int total = 0;
  for (const auto& [w, n] : pushes) total += n;
  EXPECT_LE(within_error, total / 20) << "pushes that needed the error bound";
  for (const auto& [w, n] : pushes) EXPECT_GE(n, 2 * 40) << "worker " << w;  // a push (or its parts) per shard and step
  // The fast workers' pulls waited for the straggler (ssp's bound at work).
  EXPECT_GT(held_for_straggler, 0);
}

TEST(TraceBinaryTest, GradsyncRunMergesARunsTracesAndDrawsItsTimeline) {
  TempDir dir;
  const std::string spec = dir.File("spec.textproto");
  std::ofstream(spec) << R"(
name: "traced"
target_accuracy: 0.25
defaults { workers: 2 servers: 2 train { dataset: "blobs" hidden: "16" epochs: 1 batch: 16 max_steps: 30 lr: 0.1
           lr_schedule: "constant" eval_every: 10 log_every: 10 } }
run { name: "bsp" trace: true train { mode: BSP } straggler { worker: 1 fixed_ms: 2 } }
run { name: "asp" train { mode: ASP } }
)";
  const std::string out = dir.File("results");
  ProcessResult r = RunProcess({BinaryPath("gradsync-run"), spec, "--out=" + out}, 180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string exp = out + "/traced";
  EXPECT_TRUE(fs::exists(exp + "/timeline-bsp.png") && fs::file_size(exp + "/timeline-bsp.png") > 0);
  EXPECT_FALSE(fs::exists(exp + "/timeline-asp.png"));  // not traced
  EXPECT_FALSE(fs::exists(exp + "/asp/trace.json"));
  EXPECT_NE(ReadFile(exp + "/summary.md").find("![timeline of bsp](timeline-bsp.png)"), std::string::npos);
  auto trace = LoadTrace(exp + "/bsp/trace.json");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->processes.size(), 5u);  // the scheduler, 2 servers, 2 workers
  std::map<std::string, int> count;
  for (const auto& e : trace->events) count[e.name]++;
  // bsp: the rounds, what they waited for, and the straggler's delays.
  EXPECT_EQ(count["apply round"], 2 * 30);
  EXPECT_GT(count["round wait"], 0);
  EXPECT_EQ(count["straggler delay"], 30);  // worker 1's steps
  EXPECT_EQ(count["forward"], 2 * 30);
  EXPECT_EQ(count["backward"], 2 * 2 * 30);  // two layers
}

}  // namespace
}  // namespace gradsync::testing
