// Faults injected into parameter-server jobs of real processes: a worker killed (-9) in every
// mode, a worker restarted into the running job, a server killed and restarted from its
// checkpoint, a worker stopped (SIGSTOP) past the heartbeat timeout. Every job is bounded in
// time and its process group is killed at the end whatever happens.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "common/base/atomic_file.h"
#include "common/net/transport.h"
#include "common/obs/process_summary.h"
#include "experiments/process/process.h"
#include "gradsync.pb.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tests/support/wire_request.h"

namespace gradsync::testing {
namespace {

size_t CountLines(const std::string& path) {
  const std::string s = ReadFile(path);
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

// Seconds since local midnight of a log line's "HH:MM:SS.mmm" stamp (the logger's format).
double LogSeconds(const std::string& line) {
  int h = 0, m = 0;
  double s = 0;
  if (std::sscanf(line.c_str() + 2, "%d:%d:%lf", &h, &m, &s) != 3) return -1;
  return h * 3600.0 + m * 60.0 + s;
}

double NowSecondsOfDay() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  const double frac = std::chrono::duration<double>(now.time_since_epoch()).count() - static_cast<double>(t);
  return tm.tm_hour * 3600.0 + tm.tm_min * 60.0 + tm.tm_sec + frac;
}

// The shared-memory regions (common/net/shared_region.h: anonymous memory files named
// "gradsync-<token>") process `pid` maps or holds a descriptor of, by name.
std::set<std::string> SharedRegionsOf(pid_t pid) {
  std::set<std::string> names;
  const std::string proc = "/proc/" + std::to_string(pid);
  auto take = [&](const std::string& text) {
    for (size_t at = text.find("/memfd:gradsync-"); at != std::string::npos; at = text.find("/memfd:gradsync-", at + 1)) {
      const size_t begin = at + 7;
      names.insert(text.substr(begin, text.find_first_of(" \n", begin) - begin));
    }
  };
  take(ReadFile(proc + "/maps"));
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(proc + "/fd", ec)) {
    std::error_code lec;
    take(std::filesystem::read_symlink(e.path(), lec).string());
  }
  return names;
}

// The first line of `text` containing `what`, or "".
std::string LineWith(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.find(what) != std::string::npos) return line;
  return "";
}

constexpr double kHeartbeatTimeout = 1.0;

// A job of a scheduler, 2 servers (checkpointing) and 3 workers unless said, as separate processes.
class FaultJob {
 public:
  // `replicas`: the scheduler's --replicas; `checkpoint_interval`: the servers' (seconds).
  // `mode` may end in a value channel: "_data" (every value over data channels: no shared
  // memory, every request large enough), "_lane" (shared-memory lanes, no data channel) or
  // "_zmq" (ZeroMQ frames alone); without one, the workers' defaults.
  explicit FaultJob(const std::string& mode, int replicas = 1, const std::string& checkpoint_interval = "0.2")
      : mode_(mode.substr(0, mode.find('_'))),
        channel_(mode.find('_') == std::string::npos ? "" : mode.substr(mode.find('_') + 1)),
        replicas_(replicas),
        checkpoint_interval_(checkpoint_interval) {}

  // Before Start: the job's workers (3 unless said), and flags of one of them (each replaces its
  // default here, if any).
  void WithWorkers(int n) { num_workers_ = n; }
  // Before Start: the job's servers (2 unless said), and every node's heartbeat timeout.
  void WithServers(int n) { num_servers_ = n; }
  void WithHeartbeatTimeout(double s) { heartbeat_timeout_ = std::to_string(s); }
  void WithWorkerFlags(int rank, std::vector<std::string> flags) { worker_flags_[rank] = std::move(flags); }
  // Before Start: every worker's model and data flags instead of the MLP on blobs.
  void WithModel(std::vector<std::string> flags) { model_flags_ = std::move(flags); }

  void Start() {
    const std::string port_file = dir_.File("port");
    ASSERT_TRUE(group_.Spawn({"scheduler",
                              {BinaryPath("gradsync-server"), "--role=scheduler",
                               "--num-servers=" + std::to_string(num_servers_),
                               "--num-workers=" + std::to_string(num_workers_),
                               "--port-file=" + port_file, "--heartbeat-interval=0.2",
                               "--heartbeat-timeout=" + heartbeat_timeout_,
                               "--replicas=" + std::to_string(replicas_)},
                              dir_.File("scheduler.log")})
                    .ok());
    port_ = ReadPortFile(port_file);
    ASSERT_FALSE(port_.empty());
    for (int s = 0; s < num_servers_; ++s) StartServer(s, "");
    for (int w = 0; w < num_workers_; ++w) StartWorker(w, "");
  }

  // The servers started from now on keep no checkpoints.
  void WithoutCheckpoints() { checkpoints_ = false; }

  void StartServer(int rank, const std::string& suffix) {
    std::vector<std::string> argv{BinaryPath("gradsync-server"), "--role=server", "--mode=" + mode_,
                                  "--scheduler=127.0.0.1:" + port_, "--rank=" + std::to_string(rank),
                                  "--heartbeat-interval=0.2", "--heartbeat-timeout=" + heartbeat_timeout_,
                                  "--out=" + dir_.File("s")};
    if (checkpoints_) {
      argv.push_back("--checkpoint-dir=" + dir_.File("ckpt"));
      argv.push_back("--checkpoint-interval=" + checkpoint_interval_);
    }
    if (mode_ == "ssp") argv.push_back("--staleness=2");
    ASSERT_TRUE(group_.Spawn({"server " + std::to_string(rank) + suffix, argv,
                              dir_.File("server-" + std::to_string(rank) + suffix + ".log")})
                    .ok());
  }

  void StartWorker(int rank, const std::string& suffix) {
    std::vector<std::string> argv{BinaryPath("gradsync-worker"), "--mode=" + mode_, "--scheduler=127.0.0.1:" + port_,
                                  "--rank=" + std::to_string(rank), "--epochs=100",
                                  "--batch=16", "--max-steps=500", "--straggle=ms:4", "--log-every=10",
                                  "--heartbeat-interval=0.2", "--heartbeat-timeout=" + heartbeat_timeout_,
                                  "--recovery-timeout=20", "--out=" + dir_.path() + "/w" + std::to_string(rank) + suffix};
    argv.insert(argv.end(), model_flags_.begin(), model_flags_.end());
    if (mode_ == "ssp") argv.push_back("--staleness=2");
    if (channel_ == "data") {
      argv.push_back("--shm=false");
      argv.push_back("--data-channel-min-mib=0");
    } else if (channel_ == "lane") {
      argv.push_back("--data-channel=false");
    } else if (channel_ == "zmq") {
      argv.push_back("--shm=false");
      argv.push_back("--data-channel=false");
    }
    if (auto extra = worker_flags_.find(rank); extra != worker_flags_.end()) {
      for (const std::string& flag : extra->second) {  // replaces the same flag's default above
        const std::string name = flag.substr(0, flag.find('=') + 1);
        std::erase_if(argv, [&](const std::string& a) { return a.rfind(name, 0) == 0; });
        argv.push_back(flag);
      }
    }
    ASSERT_TRUE(group_.Spawn({"worker " + std::to_string(rank) + suffix, argv,
                              dir_.File("worker-" + std::to_string(rank) + suffix + ".log")})
                    .ok());
  }

  // Waits until worker 0 has written `rows` metrics rows (training runs).
  void WaitForProgress(size_t rows) {
    const std::string csv = dir_.path() + "/w0/worker-0.csv";
    for (int i = 0; i < 800 && CountLines(csv) < rows + 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    ASSERT_GE(CountLines(csv), rows + 1) << "no progress: " << Log("worker-0");
  }

  // Waits until `log` contains `what` (at most timeout_s).
  bool WaitForLog(const std::string& log, const std::string& what, double timeout_s) {
    for (int i = 0; i < static_cast<int>(timeout_s * 40); ++i) {
      if (Log(log).find(what) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  }

  pid_t Pid(const std::string& name) const { return group_.Pid(name); }

  void Kill(const std::string& name, int sig = SIGKILL) {
    killed_at_ = NowSecondsOfDay();
    ASSERT_TRUE(group_.Signal(name, sig).ok());
  }
  // Seconds from the last Kill to the scheduler's "declared dead" line.
  double DetectedAfter() {
    const std::string line = LineWith(Log("scheduler"), "declared dead");
    if (line.empty()) return -1;
    // Both are seconds of the local day: a kill at 23:59:59.8 seen at 00:00:00.9 is 1.1 s.
    double after = LogSeconds(line) - killed_at_;
    if (after < -43200) after += 86400;
    return after;
  }

  Result<int> Wait(const std::string& name, double timeout_s) { return group_.WaitFor(name, timeout_s); }
  std::string File(const std::string& name) { return dir_.File(name); }
  // A server's summary (protobuf JSON), written when it exits.
  std::string ServerSummaryPath(int rank) { return dir_.File("s/server-" + std::to_string(rank) + ".json"); }
  std::string ServerSummary(int rank) { return ReadFile(ServerSummaryPath(rank)); }
  // A shard's version at the end, from its summary: the gradients applied to it since INIT.
  int64_t ShardVersion(int rank) {
    auto s = ReadProcessSummary(ServerSummaryPath(rank));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->version() : -1;
  }
  // A shard's final parameters, by their digest in its summary.
  std::string ShardDigest(int rank) {
    auto s = ReadProcessSummary(ServerSummaryPath(rank));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->params_sha256() : "";
  }
  // The training steps the workers say they finished (their own summaries, each read once it
  // has exited), summed: every step pushed one gradient to each shard.
  int64_t WorkerSteps(int workers = 3) {
    int64_t steps = 0;
    for (int w = 0; w < workers; ++w) {
      const std::string name = "worker " + std::to_string(w);
      (void)Wait(name, 30);
      auto summary = ReadProcessSummary(dir_.path() + "/w" + std::to_string(w) + "/worker-" + std::to_string(w) + ".json");
      EXPECT_TRUE(summary.ok()) << name << ": " << summary.status();
      const int64_t n = summary.ok() ? summary->steps() : 0;
      EXPECT_GT(n, 0) << name << " says it finished no step";
      steps += n;
    }
    return steps;
  }
  // The last evaluation row's test loss in worker 0's metrics (as written: every digit).
  std::string FinalTestLoss() {
    std::istringstream in(ReadFile(dir_.path() + "/w0/worker-0.csv"));
    std::string line, last;
    while (std::getline(in, line)) {
      std::vector<std::string> cols;
      std::stringstream row(line);
      for (std::string c; std::getline(row, c, ',');) cols.push_back(c);
      if (cols.size() > 13 && !cols[13].empty() && cols[13] != "test_loss") last = cols[13];
    }
    return last;
  }
  // Worker w's bytes_sent / bytes_received columns never go down.
  bool ByteCountersMonotonic(int w) {
    std::istringstream in(ReadFile(dir_.path() + "/w" + std::to_string(w) + "/worker-" + std::to_string(w) + ".csv"));
    std::string line;
    double sent = 0, received = 0;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::vector<std::string> cols;
      std::stringstream row(line);
      for (std::string c; std::getline(row, c, ',');) cols.push_back(c);
      if (cols.size() < 10) continue;
      const double s = std::strtod(cols[8].c_str(), nullptr), r = std::strtod(cols[9].c_str(), nullptr);
      if (s < sent || r < received) return false;
      sent = s;
      received = r;
    }
    return sent > 0;
  }
  std::string Log(const std::string& name) { return ReadFile(dir_.File(name + ".log")); }
  std::string Logs() {
    std::string all;
    for (const auto& e : std::filesystem::directory_iterator(dir_.path()))
      if (e.path().extension() == ".log") all += "=== " + e.path().filename().string() + "\n" + ReadFile(e.path());
    return all;
  }
  // The evaluating worker's "final test_acc X%". Worker 0 prints it after the scheduler may
  // have shut the job down and exited: it is read once worker 0 has exited.
  double FinalAccuracy() {
    (void)Wait("worker 0", 30);
    const std::string line = LineWith(Log("worker-0"), "final test_acc ");
    return line.empty() ? -1 : std::strtod(line.c_str() + line.find("final test_acc ") + 15, nullptr);
  }

 private:
  std::string mode_;
  std::string channel_;  // data | lane | zmq | "" (the workers' defaults)
  int replicas_;
  int num_workers_ = 3;
  int num_servers_ = 2;
  std::string heartbeat_timeout_ = std::to_string(kHeartbeatTimeout);
  std::map<int, std::vector<std::string>> worker_flags_;
  std::string checkpoint_interval_;
  bool checkpoints_ = true;
  TempDir dir_;
  ProcessGroup group_;
  std::string port_;
  double killed_at_ = 0;
  std::vector<std::string> model_flags_ = {"--dataset=blobs", "--hidden=32"};
};

// The final test loss of the same job without any fault (every digit); `model`: its model flags
// (empty: the MLP on blobs).
void CleanRunFinalTestLoss(const std::string& mode, int replicas, std::string* loss,
                           const std::vector<std::string>& model = {}) {
  FaultJob clean(mode, replicas);
  if (!model.empty()) clean.WithModel(model);
  ASSERT_NO_FATAL_FAILURE(clean.Start());
  auto done = clean.Wait("scheduler", 90);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(*done, 0) << clean.Logs();
  (void)clean.FinalAccuracy();
  *loss = clean.FinalTestLoss();
}

class KilledWorkerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KilledWorkerTest, TheOthersFinishTheRun) {
  FaultJob job(GetParam());
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(5));
  job.Kill("worker 2");
  auto sched = job.Wait("scheduler", 60);
  ASSERT_TRUE(sched.ok()) << sched.status() << job.Logs();
  EXPECT_EQ(*sched, 0) << job.Logs();
  const double detected = job.DetectedAfter();
  RecordProperty("detected_after_s", std::to_string(detected));
  EXPECT_GT(detected, 0) << job.Log("scheduler");
  EXPECT_LT(detected, kHeartbeatTimeout + 1.0);
  EXPECT_NE(job.Log("scheduler").find("went missing: worker 2"), std::string::npos) << job.Log("scheduler");
  EXPECT_GT(job.FinalAccuracy(), 50.0) << job.Log("worker-0");
  for (int w = 0; w < 2; ++w) {
    auto code = job.Wait("worker " + std::to_string(w), 10);
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0) << job.Log("worker-" + std::to_string(w));
  }
  if (GetParam().find("_data") != std::string::npos) {
    EXPECT_NE(job.Log("worker-0").find("with a data channel"), std::string::npos) << job.Log("worker-0");
    EXPECT_NE(job.Log("worker-0").find("pulled over data channels"), std::string::npos) << job.Log("worker-0");
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, KilledWorkerTest, ::testing::Values("bsp", "ssp", "asp", "bsp_data"),
                         [](const auto& p) { return p.param; });

// Shared memory outlives no process that dies: a worker's lanes (one per shard, created by the
// worker, mapped by the shard) are freed once the shards let go of a worker declared dead; a
// killed server's lanes are let go by the workers when they reconnect to its successor, which
// gets new ones. Nothing is ever in /dev/shm.
TEST(FaultTest, SharedMemoryOfADeadProcessIsLetGoByEveryOther) {
  const int in_dev_shm = GradsyncFilesInDevShm();
  FaultJob job("bsp");
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(5));
  std::vector<std::set<std::string>> worker(3), server(2);
  for (int w = 0; w < 3; ++w) worker[w] = SharedRegionsOf(job.Pid("worker " + std::to_string(w)));
  for (int s = 0; s < 2; ++s) server[s] = SharedRegionsOf(job.Pid("server " + std::to_string(s)));
  for (int w = 0; w < 3; ++w) ASSERT_EQ(worker[w].size(), 2u) << "worker " << w << ": a lane per shard";
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(server[s].size(), 3u) << "server " << s << ": a lane per worker";
    for (int w = 0; w < 3; ++w) {
      std::vector<std::string> shared;
      std::set_intersection(worker[w].begin(), worker[w].end(), server[s].begin(), server[s].end(),
                            std::back_inserter(shared));
      EXPECT_EQ(shared.size(), 1u) << "server " << s << " and worker " << w;
    }
  }
  EXPECT_EQ(GradsyncFilesInDevShm(), in_dev_shm);

  // A worker dies: once it is declared dead, no shard holds any of its lanes.
  job.Kill("worker 2");
  ASSERT_TRUE(job.WaitForLog("scheduler", "declared dead", 10)) << job.Log("scheduler");
  auto holders = [&](const std::set<std::string>& regions) {
    std::vector<std::string> who;
    for (const std::string name : {"server 0", "server 1", "worker 0", "worker 1"}) {
      const pid_t pid = job.Pid(name);
      if (pid <= 0) continue;
      for (const std::string& r : SharedRegionsOf(pid))
        if (regions.count(r)) who.push_back(name + " holds " + r);
    }
    return who;
  };
  for (int i = 0; i < 200 && !holders(worker[2]).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(holders(worker[2]), std::vector<std::string>{});

  // A server dies and is restarted from its checkpoint: the workers let its lanes go and attach
  // new ones to its successor.
  job.Kill("server 1");
  job.StartServer(1, "b");
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(job.WaitForLog("worker-" + std::to_string(w), "going on with the restarted shard", 60)) << job.Logs();
  }
  for (int i = 0; i < 100; ++i) {
    const std::set<std::string> now = SharedRegionsOf(job.Pid("worker 0"));
    if (now.size() == 2 && now != worker[0]) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (int w = 0; w < 2; ++w) {
    const std::set<std::string> now = SharedRegionsOf(job.Pid("worker " + std::to_string(w)));
    EXPECT_EQ(now.size(), 2u) << "worker " << w << ": a lane per shard, no more";
    std::vector<std::string> shared;
    std::set_intersection(now.begin(), now.end(), server[1].begin(), server[1].end(), std::back_inserter(shared));
    EXPECT_EQ(shared, std::vector<std::string>{}) << "worker " << w << " still holds the dead server's lane";
  }
  EXPECT_EQ(GradsyncFilesInDevShm(), in_dev_shm);
  auto sched = job.Wait("scheduler", 90);
  ASSERT_TRUE(sched.ok()) << job.Logs();
  EXPECT_EQ(*sched, 0) << job.Logs();
}

TEST(FaultTest, ARestartedWorkerRejoinsTheRunningJob) {
  FaultJob job("bsp");
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(5));
  job.Kill("worker 2");
  ASSERT_TRUE(job.WaitForLog("scheduler", "declared dead", 10)) << job.Log("scheduler");
  job.StartWorker(2, "b");
  auto code = job.Wait("worker 2b", 60);
  ASSERT_TRUE(code.ok()) << job.Logs();
  EXPECT_EQ(*code, 0) << job.Log("worker-2b");
  EXPECT_NE(job.Log("worker-2b").find("rejoined the job at step"), std::string::npos) << job.Log("worker-2b");
  EXPECT_NE(job.Log("server-0").find("worker 2 rejoins at clock"), std::string::npos) << job.Log("server-0");
  auto sched = job.Wait("scheduler", 60);
  ASSERT_TRUE(sched.ok());
  EXPECT_EQ(*sched, 0) << job.Logs();
  EXPECT_NE(job.Log("scheduler").find("every worker finished"), std::string::npos) << job.Log("scheduler");
}

class KilledServerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KilledServerTest, ComesBackFromItsCheckpointAndTheRunCompletes) {
  FaultJob job(GetParam());
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(10));
  job.Kill("server 1");
  // What the dead server left on disk, read before its successor starts: the reference for what
  // must be restored and what was lost.
  auto left = ReadCheckedFile(job.File("ckpt") + "/shard-1.ckpt", "GSSHARD1");
  ASSERT_TRUE(left.ok()) << left.status();
  wire::ShardCheckpoint on_disk;
  ASSERT_TRUE(on_disk.ParseFromString(*left));
  ASSERT_EQ(on_disk.pushed_size(), 3);
  job.StartServer(1, "b");  // at once: it waits until its predecessor is declared dead
  auto sched = job.Wait("scheduler", 90);
  ASSERT_TRUE(sched.ok()) << sched.status() << job.Logs();
  EXPECT_EQ(*sched, 0) << job.Logs();
  // Its last lines (what was lost) are written as it exits, after the scheduler's.
  ASSERT_TRUE(job.Wait("server 1b", 20).ok()) << job.Log("server-1b");
  const std::string restarted = job.Log("server-1b");
  // Restored from the latest checkpoint (the one on disk at the kill, past INIT's version 0).
  EXPECT_GT(on_disk.version(), 0) << "no checkpoint after INIT before the kill";
  EXPECT_NE(restarted.find("restored from " + job.File("ckpt") + "/shard-1.ckpt (version " + std::to_string(on_disk.version()) + ","),
            std::string::npos)
      << "on disk: version " << on_disk.version() << "\n" << restarted;
  // What was lost, against the workers' own clocks: each worker says at which step it went on
  // with the restarted shard; it had pushed that many gradients to it, of which the checkpoint
  // holds pushed[w], and it may have sent its last one again (a push never acknowledged, which
  // the restored shard lacked: then that one is not lost).
  int64_t lost = 0;
  for (int w = 0; w < 3; ++w) {
    const std::string log = job.Log("worker-" + std::to_string(w));
    const std::string line = LineWith(log, ": going on with the restarted shard");
    ASSERT_FALSE(line.empty()) << log;
    const int64_t step = std::atoll(line.c_str() + line.find(": step ") + 7);
    const int64_t resent = LineWith(log, ": sent its last push again to 1 shard(s)").empty() ? 0 : 1;
    EXPECT_GE(step - resent, on_disk.pushed(w)) << "worker " << w;
    lost += step - resent - on_disk.pushed(w);
  }
  EXPECT_NE(job.ServerSummary(1).find("\"lost_updates\": \"" + std::to_string(lost) + "\""), std::string::npos)
      << "expected " << lost << " lost: " << job.ServerSummary(1);
  EXPECT_NE(restarted.find("restored from a checkpoint, " + std::to_string(lost) + " updates lost"), std::string::npos) << restarted;
  // Every gradient the workers pushed is in the shards, but the lost ones in the restored shard.
  const int64_t steps = job.WorkerSteps();
  EXPECT_EQ(job.ShardVersion(0), steps) << job.ServerSummary(0);
  EXPECT_EQ(job.ShardVersion(1) + lost, steps) << job.ServerSummary(1);
  EXPECT_GT(job.FinalAccuracy(), 50.0) << job.Log("worker-0");
  EXPECT_NE(job.Log("worker-1").find("going on with the restarted shard"), std::string::npos) << job.Log("worker-1");
  // Reconnecting to the restarted shard does not set a worker's byte counters back.
  for (int w = 0; w < 3; ++w) EXPECT_TRUE(job.ByteCountersMonotonic(w)) << "worker " << w;
  if (GetParam().find("_data") != std::string::npos) {
    // The values went over data channels, to the restarted shard too (attached again).
    EXPECT_NE(job.Log("worker-1").find("with a data channel"), std::string::npos) << job.Log("worker-1");
    EXPECT_NE(job.Log("server-1b").find("data channel on port"), std::string::npos) << job.Log("server-1b");
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, KilledServerTest, ::testing::Values("bsp", "asp", "bsp_data"),
                         [](const auto& p) { return p.param; });

// --replicas=2: server 0 holds a copy of shard 1. Killed, server 1's shard is taken over by
// server 0 from that copy within the heartbeat timeout; nothing acknowledged is lost, and a bsp
// run ends exactly as it would have without the fault.
class ReplicatedServerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReplicatedServerTest, ABackupTakesOverAndNothingIsLost) {
  FaultJob job(GetParam(), /*replicas=*/2);
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(10));
  job.Kill("server 1");
  auto sched = job.Wait("scheduler", 90);
  ASSERT_TRUE(sched.ok()) << sched.status() << job.Logs();
  EXPECT_EQ(*sched, 0) << job.Logs();
  const double detected = job.DetectedAfter();  // -1: never declared dead
  EXPECT_GT(detected, 0) << job.Log("scheduler");
  EXPECT_LT(detected, kHeartbeatTimeout + 1.0);
  ASSERT_TRUE(job.Wait("server 0", 20).ok());
  const std::string backup = job.Log("server-0");
  EXPECT_NE(backup.find("server 1 is dead; taking over its shard from the copy held here"), std::string::npos) << backup;
  EXPECT_NE(backup.find("server 1: took over from its backup copy"), std::string::npos) << backup;
  EXPECT_EQ(backup.find("were lost"), std::string::npos) << backup;
  const std::string summary = job.ServerSummary(1);  // written by server 0 for the shard it took over
  EXPECT_NE(summary.find("\"adopted\": true"), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"lost_updates\": \"0\""), std::string::npos) << summary;
  for (int w = 0; w < 3; ++w) EXPECT_TRUE(job.ByteCountersMonotonic(w)) << "worker " << w;
  // Nothing lost or applied twice, by the workers' own account: each shard holds one gradient
  // per step each worker finished (the taken-over one as well).
  const int64_t steps = job.WorkerSteps();
  EXPECT_EQ(steps, 3 * 500);
  EXPECT_EQ(job.ShardVersion(0), steps) << job.ServerSummary(0);
  EXPECT_EQ(job.ShardVersion(1), steps) << summary;
  const double accuracy = job.FinalAccuracy();
  EXPECT_GT(accuracy, 50.0) << job.Log("worker-0");
  if (GetParam() == "bsp") {
    // Rounds are summed in rank order: the same job without the fault ends on the same bits.
    std::string clean;
    ASSERT_NO_FATAL_FAILURE(CleanRunFinalTestLoss("bsp", 2, &clean));
    EXPECT_EQ(job.FinalTestLoss(), clean);
    EXPECT_FALSE(job.FinalTestLoss().empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ReplicatedServerTest, ::testing::Values("bsp", "asp"),
                         [](const auto& p) { return p.param; });

// The same with embedding tables (the DLRM-style model on the click log): server 0's copy of shard
// 1 holds its rows (the snapshot's, then every push's rows as its log carries them), the takeover
// goes on from them, and the bsp run ends on the bits of the run without the fault. Mutations
// caught: the snapshot or the log's pushes without their rows, a copy that applies rows otherwise.
TEST(ReplicatedServerTest, ABackupTakesOverATablesShardAndTheRunEndsOnTheSameBits) {
  const std::vector<std::string> dlrm = {"--model=dlrm", "--click-features=4", "--click-ids=1000", "--click-dense=4",
                                         "--click-train=20000", "--click-test=2000", "--table-dim=8",
                                         "--table-optimizer=adagrad", "--lr=0.05", "--momentum=0"};
  FaultJob job("bsp", /*replicas=*/2);
  job.WithModel(dlrm);
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(10));
  job.Kill("server 1");
  auto sched = job.Wait("scheduler", 90);
  ASSERT_TRUE(sched.ok()) << sched.status() << job.Logs();
  EXPECT_EQ(*sched, 0) << job.Logs();
  ASSERT_TRUE(job.Wait("server 0", 20).ok());
  const std::string backup = job.Log("server-0");
  EXPECT_NE(backup.find("server 1: took over from its backup copy"), std::string::npos) << backup;
  const std::string summary = job.ServerSummary(1);
  EXPECT_NE(summary.find("\"adopted\": true"), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"table_rows\""), std::string::npos) << summary;
  EXPECT_EQ(job.WorkerSteps(), 3 * 500);
  std::string clean;
  ASSERT_NO_FATAL_FAILURE(CleanRunFinalTestLoss("bsp", 2, &clean, dlrm));
  EXPECT_EQ(job.FinalTestLoss(), clean);
  EXPECT_FALSE(job.FinalTestLoss().empty());
}

// The three value channels (ZeroMQ frames, shared-memory lanes, data channels) end a run on the
// same bits in every mode, through a worker killed and a shard's server killed mid-run (its shard
// goes on at its backup, --replicas=2, from the copy there). Worker 1 is killed once it is in the
// job (registered, past the init barrier, its channels attached) and before its first push: it
// sleeps 60 s before its first step. In every mode the run is then deterministic (bsp's rounds
// hold worker 0's push alone; ssp and asp apply one worker's pushes in its order), so each
// channel must give the digest of every other: a value read or written wrong, lost or applied
// twice by a channel, its detach when worker 1 dies, or its attach again at the backup, shows.
class ChannelFaultTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChannelFaultTest, EveryChannelEndsOnTheSameBitsThroughAWorkersDeathAndAShardsTakeover) {
  const std::string mode = GetParam();
  std::map<std::string, std::vector<std::string>> digests;  // channel -> per shard
  for (const std::string channel : {"zmq", "lane", "data"}) {
    SCOPED_TRACE(mode + " over " + channel);
    FaultJob job(mode + "_" + channel, /*replicas=*/2);
    job.WithWorkers(2);
    job.WithWorkerFlags(1, {"--straggle=ms:60000"});
    ASSERT_NO_FATAL_FAILURE(job.Start());
    ASSERT_TRUE(job.WaitForLog("worker-1", "worker 1: in the job", 30)) << job.Logs();
    job.Kill("worker 1");
    ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(10));
    job.Kill("server 1");
    auto sched = job.Wait("scheduler", 90);
    ASSERT_TRUE(sched.ok()) << sched.status() << job.Logs();
    EXPECT_EQ(*sched, 0) << job.Logs();
    EXPECT_NE(job.Log("scheduler").find("went missing: worker 1"), std::string::npos) << job.Log("scheduler");
    ASSERT_TRUE(job.Wait("server 0", 20).ok());
    const std::string backup = job.Log("server-0");
    EXPECT_NE(backup.find("server 1: took over from its backup copy"), std::string::npos) << backup;
    EXPECT_EQ(backup.find("were lost"), std::string::npos) << backup;
    const std::string log = job.Log("worker-0");
    EXPECT_EQ(log.find("values through shared memory") != std::string::npos, channel == "lane") << log;
    EXPECT_EQ(log.find("with a data channel") != std::string::npos, channel == "data") << log;
    // Worker 0's every step is in both shards once, and nothing of worker 1's.
    EXPECT_EQ(job.WorkerSteps(1), 500);
    EXPECT_EQ(job.ShardVersion(0), 500) << job.ServerSummary(0);
    EXPECT_EQ(job.ShardVersion(1), 500) << job.ServerSummary(1);
    EXPECT_NE(job.ServerSummary(1).find("\"adopted\": true"), std::string::npos) << job.ServerSummary(1);
    digests[channel] = {job.ShardDigest(0), job.ShardDigest(1)};
    EXPECT_EQ(digests[channel][0].size(), 64u);
    EXPECT_EQ(digests[channel][1].size(), 64u);
  }
  EXPECT_EQ(digests["lane"], digests["zmq"]);
  EXPECT_EQ(digests["data"], digests["zmq"]);
  EXPECT_NE(digests["zmq"][0], digests["zmq"][1]);
}

INSTANTIATE_TEST_SUITE_P(Modes, ChannelFaultTest, ::testing::Values("bsp", "ssp", "asp"),
                         [](const auto& p) { return p.param; });

// With --replicas=2 a push is acknowledged to its worker only once its backup holds it: every
// backup's acknowledgement delayed by 100 ms (a test hook in the servers: held back while the
// backup goes on serving its own shard), each step's pushes wait for it, so 11 steps take at
// least 1.1 s; the same job without the delay takes a fraction of that. A primary that answered before its backups would be as fast delayed as not.
TEST(FaultTest, APushIsAcknowledgedOnlyOnceItsBackupHoldsIt) {
  auto run = [](const std::string& delay_ms) -> double {
    TempDir dir;
    ProcessGroup group;
    const std::string port_file = dir.File("port");
    EXPECT_TRUE(group.Spawn({"scheduler",
                             {BinaryPath("gradsync-server"), "--role=scheduler", "--num-servers=2", "--num-workers=1",
                              "--port-file=" + port_file, "--replicas=2"},
                             dir.File("scheduler.log")})
                    .ok());
    const std::string port = ReadPortFile(port_file);
    EXPECT_FALSE(port.empty());
    for (int s = 0; s < 2; ++s) {
      ChildSpec c{"server " + std::to_string(s),
                  {BinaryPath("gradsync-server"), "--role=server", "--mode=bsp", "--scheduler=127.0.0.1:" + port,
                   "--rank=" + std::to_string(s)},
                  dir.File("server-" + std::to_string(s) + ".log")};
      c.env = {{"GRADSYNC_TEST_REPLICA_ACK_DELAY_MS", delay_ms}};
      EXPECT_TRUE(group.Spawn(c).ok());
    }
    EXPECT_TRUE(group.Spawn({"worker 0",
                             {BinaryPath("gradsync-worker"), "--mode=bsp", "--scheduler=127.0.0.1:" + port, "--rank=0",
                              "--dataset=blobs", "--hidden=16", "--batch=16", "--epochs=1", "--max-steps=12",
                              "--log-every=1", "--out=" + dir.File("w")},
                             dir.File("worker-0.log")})
                    .ok());
    auto code = group.WaitFor("worker 0", 60);
    EXPECT_TRUE(code.ok() && *code == 0) << ReadFile(dir.File("worker-0.log")) << ReadFile(dir.File("server-0.log"));
    // The wall time of its 12 training steps, from its metrics (first to last training row).
    std::istringstream in(ReadFile(dir.File("w/worker-0.csv")));
    std::string line, header;
    std::getline(in, header);
    double first = -1, last = -1;
    while (std::getline(in, line)) {
      std::vector<std::string> cols;
      std::stringstream row(line);
      for (std::string c; std::getline(row, c, ',');) cols.push_back(c);
      // run,worker,step,epoch,wall_s,...; test_loss (13) is set on evaluation rows only.
      if (cols.size() < 14 || !cols[13].empty()) continue;
      const double wall = std::strtod(cols[4].c_str(), nullptr);
      if (first < 0) first = wall;
      last = wall;
    }
    EXPECT_GE(first, 0) << ReadFile(dir.File("w/worker-0.csv"));
    return last - first;
  };
  const double delayed = run("100"), plain = run("0");
  RecordProperty("delayed_s", std::to_string(delayed));
  RecordProperty("plain_s", std::to_string(plain));
  // 11 steps between the first row and the last, each waiting >= 100 ms for the backups.
  EXPECT_GE(delayed, 11 * 0.100) << "plain: " << plain << " s";
  EXPECT_LT(plain, delayed / 2) << "delayed: " << delayed << " s";
}

// A stranger writes to a backup's copy while the primary cannot correct it (stopped): a snapshot
// of the shard without the job's replication key (its own parameters, all zero), another with a
// wrong key, entries from a connection that sent no snapshot (next in order, replayed, out of
// order), and entries for a shard the server does not back up. Every one is refused; the
// primary then dies, the backup takes over from its untouched copy, and the bsp run ends on the
// same bits as the run without any of it.
TEST(FaultTest, AStrangersReplicationEntriesAreRefusedAndTheTakeoverIsExact) {
  FaultJob job("bsp", /*replicas=*/2);
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(10));
  const std::string serving = LineWith(job.Log("server-0"), "server 0: serving on port ");
  ASSERT_FALSE(serving.empty()) << job.Log("server-0");
  const int port = std::atoi(serving.c_str() + serving.find("serving on port ") + 16);
  auto body = ReadCheckedFile(job.File("ckpt") + "/shard-1.ckpt", "GSSHARD1");
  ASSERT_TRUE(body.ok()) << body.status();
  wire::ShardCheckpoint c;
  ASSERT_TRUE(c.ParseFromString(*body));
  const size_t n = static_cast<size_t>(c.end() - c.begin());
  const size_t state_parts = c.optimizer_state().size() / sizeof(float) / std::max<size_t>(n, 1);
  const std::vector<float> zeros(n, 0.0f);
  wire::ShardCheckpoint meta = c;
  meta.clear_params();
  meta.clear_optimizer_state();
  job.Kill("server 1", SIGSTOP);

  TransportContext ctx(1);
  auto sock = Socket::ConnectDealer(ctx, "tcp://127.0.0.1:" + std::to_string(port), "server 0", 64 << 20);
  ASSERT_TRUE(sock.ok()) << sock.status();
  int sent = 0;
  auto send = [&](int shard, wire::ReplicaOp op, uint64_t index, const std::string& key, bool values, int part = 0) {
    wire::Header h = ReplicateEntry(shard, op, index);
    h.set_request_id(1000000 + index);
    h.mutable_replica()->set_part(part);
    if (op == wire::REPLICA_META) {
      h.mutable_replica()->set_meta(meta.SerializeAsString());
      h.mutable_replica()->set_key(key);
    }
    Payload p;
    if (values) {
      auto* seg = h.add_segments();
      seg->set_offset(c.begin());
      seg->set_length(n);
      p.values = zeros;
      p.has_values = true;
    }
    ASSERT_TRUE(sock->Send("", h, p).ok());
    ++sent;
  };
  for (const std::string key : {"", "not this job's key"}) {
    send(1, wire::REPLICA_META, 0, key, false);
    send(1, wire::REPLICA_PARAMS, 1, "", true);
    for (size_t k = 0; k < state_parts; ++k) send(1, wire::REPLICA_STATE, 2 + k, "", true, static_cast<int>(k));
  }
  send(1, wire::REPLICA_PARAMS, 1, "", true);     // replayed
  send(1, wire::REPLICA_PARAMS, 5000, "", true);  // out of order
  send(0, wire::REPLICA_META, 0, "", false);      // a shard server 0 does not back up
  int refused = 0;
  for (int i = 0; i < sent; ++i) {
    auto reply = sock->Recv(5000);
    ASSERT_TRUE(reply.ok()) << "no answer to hostile entry " << i << ": " << reply.status();
    EXPECT_EQ(reply->header.type(), wire::ERROR);
    refused += reply->header.type() == wire::ERROR &&
               reply->header.error_code() == static_cast<int>(StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(refused, sent);
  const std::string backup = job.Log("server-0");
  EXPECT_NE(backup.find("without this job's replication key"), std::string::npos) << backup;
  EXPECT_NE(backup.find("not from the connection its snapshot came on"), std::string::npos) << backup;

  job.Kill("server 1");
  auto sched = job.Wait("scheduler", 90);
  ASSERT_TRUE(sched.ok()) << job.Logs();
  EXPECT_EQ(*sched, 0) << job.Logs();
  ASSERT_TRUE(job.Wait("server 0", 20).ok());
  EXPECT_NE(job.Log("server-0").find("server 1: took over from its backup copy"), std::string::npos) << job.Log("server-0");
  EXPECT_NE(job.ServerSummary(1).find("\"lost_updates\": \"0\""), std::string::npos) << job.ServerSummary(1);
  (void)job.FinalAccuracy();

  std::string clean;
  ASSERT_NO_FATAL_FAILURE(CleanRunFinalTestLoss("bsp", 2, &clean));
  EXPECT_FALSE(job.FinalTestLoss().empty());
  EXPECT_EQ(job.FinalTestLoss(), clean);
}

// The server whose shard was taken over comes back (restarted with its rank) as a standby: it
// catches up on every shard's snapshot, and when the process that holds both shards dies it
// takes both over; nothing acknowledged is lost.
TEST(FaultTest, AServerWhoseShardWasTakenOverComesBackAsAStandbyAndTakesOverLater) {
  FaultJob job("bsp", /*replicas=*/2);
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(5));
  job.Kill("server 1");
  ASSERT_TRUE(job.WaitForLog("server-0", "server 1: took over from its backup copy", 10)) << job.Log("server-0");
  job.StartServer(1, "b");
  ASSERT_TRUE(job.WaitForLog("server-1b", "(standby): its shard was taken over by a backup", 20)) << job.Logs();
  ASSERT_TRUE(job.WaitForLog("server-0", "sent a snapshot", 10));
  // Both primaries (in server 0's process) have sent it their snapshots.
  for (int i = 0; i < 200; ++i) {
    const std::string log = job.Log("server-0");
    if (log.find("server 0: sent a snapshot (version") != log.rfind("server 0: sent a snapshot (version") &&
        log.find("server 1: sent a snapshot") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  job.Kill("server 0");
  auto sched = job.Wait("scheduler", 90);
  ASSERT_TRUE(sched.ok()) << job.Logs();
  EXPECT_EQ(*sched, 0) << job.Logs();
  const std::string standby = job.Log("server-1b");
  EXPECT_NE(standby.find("server 0: took over from its backup copy"), std::string::npos) << standby;
  EXPECT_NE(standby.find("server 1: took over from its backup copy"), std::string::npos) << standby;
  EXPECT_EQ(standby.find("were lost"), std::string::npos) << standby;
  // Two takeovers later every gradient is in both shards once, and the run ends on the bits of
  // the same job without a fault.
  const int64_t steps = job.WorkerSteps();
  EXPECT_EQ(steps, 3 * 500);
  EXPECT_EQ(job.ShardVersion(0), steps) << job.ServerSummary(0);
  EXPECT_EQ(job.ShardVersion(1), steps) << job.ServerSummary(1);
  EXPECT_GT(job.FinalAccuracy(), 50.0);
  std::string clean;
  ASSERT_NO_FATAL_FAILURE(CleanRunFinalTestLoss("bsp", 2, &clean));
  EXPECT_FALSE(clean.empty());
  EXPECT_EQ(job.FinalTestLoss(), clean);
}

// Primary and backup killed together: with no checkpoint nothing can bring the shards back, and
// every process stops within the heartbeat timeout, naming them; with checkpoints the scheduler
// says it waits for a restart, and the restarted servers recover the run.
TEST(FaultTest, AShardWithNoLiveCopyFailsTheJobAtOnceUnlessACheckpointCanRestoreIt) {
  {
    FaultJob job("bsp", /*replicas=*/2);
    job.WithoutCheckpoints();
    ASSERT_NO_FATAL_FAILURE(job.Start());
    ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(5));
    job.Kill("server 0");
    job.Kill("server 1");
    const auto killed = std::chrono::steady_clock::now();
    // Stopped by the scheduler's verdict, not after the workers' --recovery-timeout (20 s): 8 s
    // past the heartbeat timeout holds beside another test run (3 s did not, once).
    constexpr double kWithin = kHeartbeatTimeout + 8.0;
    for (const std::string name : {"scheduler", "worker 0", "worker 1", "worker 2"}) {
      const double left = kWithin - std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
      auto code = job.Wait(name, std::max(left, 0.01));
      ASSERT_TRUE(code.ok()) << name << " still runs " << kWithin << " s after the kills\n" << job.Logs();
      EXPECT_NE(*code, 0) << name;
    }
    const std::string sched = job.Log("scheduler");
    const std::string lost = LineWith(sched, "shards 0, 1 are lost: server 0 (");
    EXPECT_NE(lost.find("and its backup server 1 ("), std::string::npos) << sched;
    EXPECT_NE(lost.find("and no checkpoint (--checkpoint-dir) can restore them"), std::string::npos) << sched;
    for (int w = 0; w < 3; ++w) {
      const std::string log = job.Log("worker-" + std::to_string(w));
      EXPECT_NE(log.find("the scheduler stopped the job: shards 0, 1 are lost"), std::string::npos) << log;
    }
  }
  {
    FaultJob job("bsp", /*replicas=*/2);
    ASSERT_NO_FATAL_FAILURE(job.Start());
    ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(5));
    job.Kill("server 0");
    job.Kill("server 1");
    ASSERT_TRUE(job.WaitForLog("scheduler", "has no live copy", 10)) << job.Log("scheduler");
    const std::string waits = LineWith(job.Log("scheduler"), "shard 0 has no live copy");
    EXPECT_NE(waits.find("it comes back only when server 0 ("), std::string::npos) << waits;
    EXPECT_NE(waits.find("is restarted with its --checkpoint-dir"), std::string::npos) << waits;
    job.StartServer(0, "b");
    job.StartServer(1, "b");
    auto sched = job.Wait("scheduler", 90);
    ASSERT_TRUE(sched.ok()) << job.Logs();
    EXPECT_EQ(*sched, 0) << job.Logs();
    for (int s = 0; s < 2; ++s) {
      const std::string log = job.Log("server-" + std::to_string(s) + "b");
      EXPECT_NE(log.find("restored from"), std::string::npos) << log;
    }
    EXPECT_EQ(job.Log("scheduler").find("lost:"), std::string::npos) << job.Log("scheduler");
  }
}

// --replicas=2 on 3 servers: shard s's one backup is server s+1 (mod 3). Servers 0 and 1 die
// (together, or 1 s apart: before the first death is declared, so before its takeover): shard 0
// has lost its primary and its one backup. When server 1 dies first, server 2 takes shard 1 over
// (a shard server of rank 1 in its process), which fills shard 0's backup rank but holds no copy
// of shard 0: server 0 was dead before it could send one. Whatever the order, no server can bring
// shard 0 back: every process stops within the heartbeat timeout + 5 s of the last kill, naming
// shard 0 (shard 1 goes on at server 2), not after the workers' --recovery-timeout (20 s)
// blaming server 0.
class LostShardTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LostShardTest, StopsTheJobNamingTheShardWhenATakeoverFillsItsBackupsRank) {
  constexpr double kTimeout = 2.0;  // more than the 1 s between the kills
  FaultJob job("bsp", /*replicas=*/2);
  job.WithServers(3);
  job.WithHeartbeatTimeout(kTimeout);
  job.WithoutCheckpoints();
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(5));
  const std::string order = GetParam();
  if (order == "together") {
    job.Kill("server 0");
    job.Kill("server 1");
  } else {
    job.Kill(order == "server1_then_server0" ? "server 1" : "server 0");
    std::this_thread::sleep_for(std::chrono::seconds(1));
    job.Kill(order == "server1_then_server0" ? "server 0" : "server 1");
  }
  const auto killed = std::chrono::steady_clock::now();
  constexpr double kWithin = kTimeout + 5.0;
  for (const std::string name : {"scheduler", "server 2", "worker 0", "worker 1", "worker 2"}) {
    const double left = kWithin - std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
    auto code = job.Wait(name, std::max(left, 0.01));
    ASSERT_TRUE(code.ok()) << name << " still runs " << kWithin << " s after the last kill\n" << job.Logs();
    EXPECT_NE(*code, 0) << name;
  }
  const std::string sched = job.Log("scheduler");
  // Server 1 dead first: shard 1 was taken over by server 2 before shard 0's verdict.
  if (order == "server1_then_server0") {
    EXPECT_NE(sched.find("rejoins the job as server 1 ("), std::string::npos) << sched;
  }
  const std::string lost = LineWith(sched, "lost: ");
  EXPECT_NE(lost.find("shard 0 is lost: server 0 ("), std::string::npos) << sched;
  EXPECT_NE(lost.find("and no checkpoint (--checkpoint-dir) can restore it"), std::string::npos) << lost;
  for (const std::string w : {"worker-0", "worker-1", "worker-2", "server-2"}) {
    const std::string log = job.Log(w);
    EXPECT_NE(log.find("the scheduler stopped the job: shard 0 is lost"), std::string::npos) << w << ":\n" << log;
    EXPECT_EQ(log.find("did not come back within"), std::string::npos) << w << ":\n" << log;
  }
  // Summaries only of shards server 2's process served (its own, and shard 1 if it took it over in
  // time): none of a takeover that the job's end cut short before it had the rank.
  for (const auto& e : std::filesystem::directory_iterator(job.File("s"))) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name == "server-1.json" || name == "server-2.json") << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Orders, LostShardTest,
                         ::testing::Values("server1_then_server0", "together", "server0_then_server1"),
                         [](const auto& p) { return p.param; });

// The same three servers, server 0 killed 1 s after server 1's takeover: server 0 had sent the new
// rank 1 (in server 2's process) its snapshot, so that copy takes shard 0 over in turn, one
// process serving all three shards. Nothing is lost: the job completes, each shard (its summary
// written by server 2's process, the second takeover's too) holds one gradient per step each
// worker finished.
TEST(FaultTest, ATakeoversNewRankHoldsCopiesAndTakesOverInTurn) {
  FaultJob job("bsp", /*replicas=*/2);
  job.WithServers(3);
  job.WithoutCheckpoints();
  for (int w = 0; w < 3; ++w) job.WithWorkerFlags(w, {"--max-steps=1500"});  // training outlasts both takeovers
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(5));
  job.Kill("server 1");
  ASSERT_TRUE(job.WaitForLog("server-2", "server 1: took over from its backup copy", 10)) << job.Logs();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  job.Kill("server 0");
  auto sched = job.Wait("scheduler", 60);
  ASSERT_TRUE(sched.ok()) << job.Logs();
  EXPECT_EQ(*sched, 0) << job.Logs();
  EXPECT_EQ(job.Log("scheduler").find("lost"), std::string::npos) << job.Log("scheduler");
  ASSERT_TRUE(job.Wait("server 2", 20).ok());
  const std::string log = job.Log("server-2");
  EXPECT_NE(log.find("server 1: server 0 is dead; taking over its shard from the copy held here"), std::string::npos)
      << log;
  EXPECT_NE(log.find("server 0: took over from its backup copy"), std::string::npos) << log;
  const int64_t steps = job.WorkerSteps();
  EXPECT_EQ(steps, 3 * 1500);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(job.ShardVersion(s), steps) << "shard " << s;
    EXPECT_NE(job.ServerSummary(s).find("\"lost_updates\": \"0\""), std::string::npos) << job.ServerSummary(s);
  }
}

TEST(FaultTest, AServerPausedPastTheTimeoutComesBackWithItsShard) {
  FaultJob job("asp");
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(5));
  job.Kill("server 1", SIGSTOP);
  ASSERT_TRUE(job.WaitForLog("scheduler", "declared dead", 10)) << job.Log("scheduler");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  job.Kill("server 1", SIGCONT);
  auto sched = job.Wait("scheduler", 60);
  ASSERT_TRUE(sched.ok()) << job.Logs();
  EXPECT_EQ(*sched, 0) << job.Logs();
  ASSERT_TRUE(job.Wait("server 1", 20).ok());
  const std::string log = job.Log("server-1");
  EXPECT_NE(log.find("registering again to serve its shard as it is"), std::string::npos) << log;
  EXPECT_NE(log.find("back in the job with its shard"), std::string::npos) << log;
  EXPECT_EQ(log.find("were lost"), std::string::npos) << log;
  EXPECT_GT(job.FinalAccuracy(), 50.0);
}

// The first checkpoint is written at INIT: a server killed long before its first interval still
// comes back from it.
TEST(FaultTest, AServerKilledBeforeItsFirstIntervalComesBack) {
  FaultJob job("bsp", 1, /*checkpoint_interval=*/"1000");
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(5));
  job.Kill("server 1");
  job.StartServer(1, "b");
  auto sched = job.Wait("scheduler", 90);
  ASSERT_TRUE(sched.ok()) << job.Logs();
  EXPECT_EQ(*sched, 0) << job.Logs();
  EXPECT_NE(job.Log("server-1b").find("restored from"), std::string::npos) << job.Log("server-1b");
  EXPECT_GT(job.FinalAccuracy(), 50.0);
  // Only the INIT checkpoint existed: the pushes of the 5 or more steps before the kill are lost,
  // whenever the kill came, and counted.
  EXPECT_NE(job.ServerSummary(1).find("\"lost_updates\": \""), std::string::npos) << job.ServerSummary(1);
  EXPECT_EQ(job.ServerSummary(1).find("\"lost_updates\": \"0\""), std::string::npos)
      << "restored from its INIT checkpoint after 5 steps, the shard counted no update lost: " << job.ServerSummary(1);
}

// A restarted server finds a checkpoint it must not trust: it refuses it with one line naming the
// file and the reason, and never serves its values.
TEST(FaultTest, ARestartedServerRefusesAnotherJobsOrADamagedCheckpoint) {
  for (const std::string fault : {"another job", "flipped bits"}) {
    FaultJob job("asp");
    ASSERT_NO_FATAL_FAILURE(job.Start());
    ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(5));
    job.Kill("server 1");
    ASSERT_TRUE(job.Wait("server 1", 10).ok());
    const std::string path = job.File("ckpt") + "/shard-1.ckpt";
    if (fault == "another job") {
      auto body = ReadCheckedFile(path, "GSSHARD1");
      ASSERT_TRUE(body.ok()) << body.status();
      wire::ShardCheckpoint c;
      ASSERT_TRUE(c.ParseFromString(*body));
      c.set_job_id("0000000000000000");
      ASSERT_TRUE(WriteCheckedFile(path, "GSSHARD1", c.SerializeAsString()).ok());
    } else {
      std::string bytes = ReadFile(path);
      ASSERT_GT(bytes.size(), 100u);
      bytes[bytes.size() - 2] = static_cast<char>(bytes[bytes.size() - 2] ^ 0x40);  // an exponent bit
      std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    }
    job.StartServer(1, "b");
    auto code = job.Wait("server 1b", 30);
    ASSERT_TRUE(code.ok()) << job.Logs();
    EXPECT_EQ(*code, 1);
    const std::string log = job.Log("server-1b");
    EXPECT_NE(log.find("cannot restore its checkpoint (its parameters are lost): " + path), std::string::npos) << log;
    EXPECT_NE(log.find(fault == "another job" ? "belongs to another job (0000000000000000, this one is "
                                              : "checksum mismatch"),
              std::string::npos)
        << log;
  }
}

TEST(FaultTest, ACheckpointDirectoryThatCannotTakeAFileIsRefusedAtStart) {
  const ProcessResult r = RunProcess({BinaryPath("gradsync-server"), "--role=server", "--mode=bsp",
                                      "--scheduler=127.0.0.1:9", "--checkpoint-dir=/dev/null/checkpoints"},
                                     20);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--checkpoint-dir: cannot create directory '/dev/null/checkpoints'"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(FaultTest, AStoppedWorkerIsDeclaredDeadAndTheRunGoesOn) {
  FaultJob job("ssp");
  ASSERT_NO_FATAL_FAILURE(job.Start());
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(5));
  job.Kill("worker 2", SIGSTOP);
  ASSERT_TRUE(job.WaitForLog("scheduler", "declared dead", 10)) << job.Log("scheduler");
  EXPECT_LT(job.DetectedAfter(), kHeartbeatTimeout + 1.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  job.Kill("worker 2", SIGCONT);
  // Back from its pause it learns it was declared dead, and stops with that error.
  auto code = job.Wait("worker 2", 20);
  ASSERT_TRUE(code.ok()) << job.Logs();
  EXPECT_EQ(*code, 1);
  EXPECT_NE(job.Log("worker-2").find("was declared dead"), std::string::npos) << job.Log("worker-2");
  auto sched = job.Wait("scheduler", 60);
  ASSERT_TRUE(sched.ok());
  EXPECT_EQ(*sched, 0) << job.Logs();
  EXPECT_GT(job.FinalAccuracy(), 50.0);
}

}  // namespace
}  // namespace gradsync::testing

namespace gradsync::testing {
namespace {

// An all-reduce job started by hand (no launcher), as separate processes logging to DIR/scheduler.log
// and DIR/worker-<w>.log: the scheduler with heartbeat timeout `scheduler_timeout` (seconds) and
// `workers` workers with `worker_timeout` and the flags `extra`. Returns once the job has its ranks.
void StartAllreduceByHand(ProcessGroup& group, TempDir& dir, int workers, const std::string& scheduler_timeout,
                          const std::string& worker_timeout, const std::vector<std::string>& extra) {
  const std::string port_file = dir.File("port");
  ASSERT_TRUE(group.Spawn({"scheduler",
                           {BinaryPath("gradsync-server"), "--role=scheduler", "--mode=allreduce", "--num-servers=0",
                            "--num-workers=" + std::to_string(workers), "--port-file=" + port_file,
                            "--heartbeat-interval=0.2", "--heartbeat-timeout=" + scheduler_timeout},
                           dir.File("scheduler.log")})
                  .ok());
  const std::string port = ReadPortFile(port_file);
  ASSERT_FALSE(port.empty());
  for (int w = 0; w < workers; ++w) {
    std::vector<std::string> argv{BinaryPath("gradsync-worker"), "--mode=allreduce", "--scheduler=127.0.0.1:" + port,
                                  "--rank=" + std::to_string(w), "--dataset=blobs", "--hidden=32", "--epochs=100",
                                  "--batch=16", "--straggle=ms:5", "--heartbeat-interval=0.2",
                                  "--heartbeat-timeout=" + worker_timeout};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ASSERT_TRUE(group.Spawn({"worker " + std::to_string(w), argv, dir.File("worker-" + std::to_string(w) + ".log")}).ok());
  }
  for (int i = 0; i < 400 && ReadFile(dir.File("scheduler.log")).find("ranks assigned") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
}

// A scheduler stopped (SIGSTOP) for twice its heartbeat timeout, while the nodes' patience with it
// is longer: their heartbeats wait in its socket, so the silence is the scheduler's own. It says
// it was paused, declares no node dead, and the job finishes. (Before, it handled one waiting
// message and declared every other node dead.)
TEST(FaultTest, AStoppedSchedulerDoesNotCountItsOwnPauseAgainstTheNodes) {
  TempDir dir;
  ProcessGroup group;
  // Once the job has its ranks the workers train for 3 s or more (600 steps of at least 5 ms).
  ASSERT_NO_FATAL_FAILURE(StartAllreduceByHand(group, dir, 2, "1", "6", {"--max-steps=600"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(group.Signal("scheduler", SIGSTOP).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  ASSERT_TRUE(group.Signal("scheduler", SIGCONT).ok());
  for (int w = 0; w < 2; ++w) {
    auto code = group.WaitFor("worker " + std::to_string(w), 60);
    ASSERT_TRUE(code.ok()) << "worker " << w << " hangs";
    EXPECT_EQ(*code, 0) << ReadFile(dir.File("worker-" + std::to_string(w) + ".log"));
  }
  auto sched = group.WaitFor("scheduler", 15);
  ASSERT_TRUE(sched.ok());
  EXPECT_EQ(*sched, 0) << ReadFile(dir.File("scheduler.log"));
  const std::string log = ReadFile(dir.File("scheduler.log"));
  EXPECT_NE(log.find("this process was paused for"), std::string::npos) << log;
  EXPECT_EQ(log.find("declared dead"), std::string::npos) << log;
}

// The nodes' patience with the scheduler equal to its heartbeat timeout (2 s): stopped for 3 s,
// its connection stays up, so the nodes wait for it (up to kSchedulerUpFactor timeouts, 6 s, said
// once: 3 s to spare for a scheduler starved of CPU after SIGCONT) and the job finishes; killed, its kernel closes the connection, and every node stops
// after one timeout, saying it lost the scheduler after 2 s of silence, never that it waits
// longer for a connection that is up. Which way a node took is in its log; the wall-clock bound
// (15 s) only says that it stops, and holds on a loaded machine.
TEST(FaultTest, NodesWaitForAStoppedSchedulerButNotForADeadOne) {
  {
    TempDir dir;
    ProcessGroup group;
    ASSERT_NO_FATAL_FAILURE(StartAllreduceByHand(group, dir, 2, "2", "2", {"--max-steps=900"}));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_TRUE(group.Signal("scheduler", SIGSTOP).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(3000));
    ASSERT_TRUE(group.Signal("scheduler", SIGCONT).ok());
    for (int w = 0; w < 2; ++w) {
      auto code = group.WaitFor("worker " + std::to_string(w), 60);
      ASSERT_TRUE(code.ok()) << "worker " << w << " hangs";
      const std::string log = ReadFile(dir.File("worker-" + std::to_string(w) + ".log"));
      EXPECT_EQ(*code, 0) << log;
      EXPECT_NE(log.find("but its connection is up (paused or starved?): waiting up to 6 s"), std::string::npos) << log;
    }
    auto sched = group.WaitFor("scheduler", 15);
    ASSERT_TRUE(sched.ok());
    EXPECT_EQ(*sched, 0) << ReadFile(dir.File("scheduler.log"));
  }
  {
    TempDir dir;
    ProcessGroup group;
    ASSERT_NO_FATAL_FAILURE(StartAllreduceByHand(group, dir, 2, "2", "2", {"--max-steps=100000"}));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_TRUE(group.Signal("scheduler", SIGKILL).ok());
    const auto killed = std::chrono::steady_clock::now();
    constexpr double kWithin = 15.0;
    for (int w = 0; w < 2; ++w) {
      const double left = kWithin - std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
      auto code = group.WaitFor("worker " + std::to_string(w), std::max(left, 0.01));
      const std::string log = ReadFile(dir.File("worker-" + std::to_string(w) + ".log"));
      ASSERT_TRUE(code.ok()) << "worker " << w << " outlives its scheduler: " << log;
      EXPECT_NE(*code, 0);
      EXPECT_NE(log.find("lost the scheduler at tcp://127.0.0.1:"), std::string::npos) << log;
      EXPECT_NE(log.find(": silent for 2 s"), std::string::npos) << log;
      EXPECT_EQ(log.find("but its connection is up"), std::string::npos) << log;  // not the stopped scheduler's wait
    }
  }
}

// All-reduce workers started by hand on one host (they reduce through shared memory, where a
// killed rank closes no connection): the scheduler declares the killed one dead after its
// heartbeat timeout, and the survivors fail then, naming it, not after --collective-timeout
// (60 s). The bound, 20 s, holds on a loaded machine; the message says who stopped them.
TEST(FaultTest, AllreduceSurvivorsStopWhenTheSchedulerDeclaresARankDead) {
  TempDir dir;
  ProcessGroup group;
  ASSERT_NO_FATAL_FAILURE(
      StartAllreduceByHand(group, dir, 3, "1", "1", {"--max-steps=100000", "--collective-timeout=60"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  ASSERT_TRUE(group.Signal("worker 2", SIGKILL).ok());
  const auto killed = std::chrono::steady_clock::now();
  for (int w = 0; w < 2; ++w) {
    auto code = group.WaitFor("worker " + std::to_string(w), 20.0);
    ASSERT_TRUE(code.ok()) << "worker " << w << " still waits: " << ReadFile(dir.File("worker-" + std::to_string(w) + ".log"));
    EXPECT_EQ(*code, 1);
    const std::string log = ReadFile(dir.File("worker-" + std::to_string(w) + ".log"));
    EXPECT_NE(log.find("was declared dead by the scheduler"), std::string::npos) << log;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count(), 20.0);
}

// An all-reduce job: a dead rank fails the others within the collective timeout; restarted with
// --resume, every rank goes on from rank 0's last checkpoint.
TEST(FaultTest, AllreduceFailsCleanlyAndResumesFromItsCheckpoint) {
  TempDir dir;
  const std::string ckpt = dir.File("ckpt");
  auto run = [&](ProcessGroup& group, const std::string& tag, bool resume) -> std::string {
    const std::string port_file = dir.File("port-" + tag);
    EXPECT_TRUE(group.Spawn({"scheduler",
                             {BinaryPath("gradsync-server"), "--role=scheduler", "--mode=allreduce", "--num-servers=0",
                              "--num-workers=2", "--port-file=" + port_file, "--heartbeat-interval=0.2",
                              "--heartbeat-timeout=2"},
                             dir.File("scheduler-" + tag + ".log")})
                    .ok());
    const std::string port = ReadPortFile(port_file);
    for (int w = 0; w < 2; ++w) {
      std::vector<std::string> argv{BinaryPath("gradsync-worker"), "--mode=allreduce", "--scheduler=127.0.0.1:" + port,
                                    "--rank=" + std::to_string(w), "--dataset=blobs", "--hidden=32", "--epochs=100",
                                    "--batch=16", "--max-steps=400", "--straggle=ms:5", "--collective-timeout=2",
                                    "--heartbeat-interval=0.2", "--heartbeat-timeout=2", "--checkpoint-dir=" + ckpt,
                                    "--checkpoint-every=20"};
      if (resume) argv.push_back("--resume");
      EXPECT_TRUE(group.Spawn({"worker " + std::to_string(w), argv, dir.File("worker-" + std::to_string(w) + "-" + tag + ".log")}).ok());
    }
    return port;
  };
  {
    ProcessGroup first;
    ASSERT_FALSE(run(first, "a", false).empty());
    for (int i = 0; i < 2400 && !std::filesystem::exists(ckpt + "/allreduce.ckpt"); ++i) {  // up to 60 s under load
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    ASSERT_TRUE(std::filesystem::exists(ckpt + "/allreduce.ckpt")) << ReadFile(dir.File("worker-0-a.log"));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_TRUE(first.Signal("worker 1", SIGKILL).ok());
    auto code = first.WaitFor("worker 0", 15);
    ASSERT_TRUE(code.ok()) << "worker 0 hangs";
    EXPECT_EQ(*code, 1);
    auto sched = first.WaitFor("scheduler", 15);
    ASSERT_TRUE(sched.ok());
    EXPECT_EQ(*sched, 1);
  }
  // The reference: the step of rank 0's checkpoint on disk once the first job is gone.
  auto body = ReadCheckedFile(ckpt + "/allreduce.ckpt", "GSTRAIN1");
  ASSERT_TRUE(body.ok()) << body.status();
  wire::TrainerCheckpoint on_disk;
  ASSERT_TRUE(on_disk.ParseFromString(*body));
  ASSERT_GT(on_disk.step(), 0);
  ProcessGroup second;
  ASSERT_FALSE(run(second, "b", true).empty());
  for (int w = 0; w < 2; ++w) {
    auto code = second.WaitFor("worker " + std::to_string(w), 60);
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0) << ReadFile(dir.File("worker-" + std::to_string(w) + "-b.log"));
  }
  // Every rank goes on from exactly that step.
  for (int w = 0; w < 2; ++w) {
    const std::string log = ReadFile(dir.File("worker-" + std::to_string(w) + "-b.log"));
    EXPECT_NE(log.find("worker " + std::to_string(w) + ": resumed from " + ckpt + "/allreduce.ckpt at step " +
                       std::to_string(on_disk.step()) + " of 400"),
              std::string::npos)
        << "checkpoint on disk at step " << on_disk.step() << "\n" << log;
  }
  EXPECT_LT(on_disk.step(), 400);
  EXPECT_NE(ReadFile(dir.File("worker-0-b.log")).find("final test_acc"), std::string::npos);
}

}  // namespace
}  // namespace gradsync::testing
