// The parameter-server binaries as a user starts them: gradsync-launch, mode mismatches, flags.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/obs/metrics.h"
#include "common/obs/process_summary.h"
#include "tests/support/metrics_file.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace gradsync::testing {
namespace {

TEST(PsBinaryTest, LaunchRunsAWholeJobAndWritesItsFiles) {
  TempDir dir;
  ProcessResult r = RunProcess({BinaryPath("gradsync-launch"), "--servers=2", "--workers=2", "--mode=ssp",
                                "--staleness=1", "--out=" + dir.path(), "--", "--dataset=blobs", "--hidden=16",
                                "--epochs=2", "--max-steps=60", "--batch=16", "--log-every=10"},
                               120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("final test_acc"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("job: ssp s=1, 2 servers, 2 workers: 120 gradients applied"), std::string::npos) << r.out;
  for (const char* f : {"worker-0.csv", "worker-1.csv", "worker-0.json", "worker-1.json", "server-0.json", "server-1.json", "commands.txt",
                        "logs/scheduler.log", "logs/server-0.log", "logs/worker-1.log"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.File(f))) << f;
  }
  std::ifstream csv(dir.File("worker-0.csv"));
  std::string header, row;
  std::getline(csv, header);
  std::getline(csv, row);
  EXPECT_EQ(row.rfind("ssp,0,10,", 0), 0u) << row;  // run name (the mode by default), worker, step
  // Overlap is on by default: what it hid is part of comm_ms, never more.
  int rows = 0;
  do {
    std::vector<std::string> v;
    std::stringstream ss(row);
    for (std::string f; std::getline(ss, f, ',');) v.push_back(f);
    if (v.size() < kMetricsColumns || !v[kColTestAccuracy].empty()) continue;  // evaluation rows carry no timings
    const double comm = std::stod(v[kColComm]), hidden = std::stod(v[kColHidden]);
    EXPECT_GE(hidden, 0.0) << row;
    EXPECT_LE(hidden, comm + 1e-9) << row;
    // ssp with s = 1: no pull was answered more than one clock behind.
    ASSERT_FALSE(v[kColClockStaleness].empty()) << row;
    EXPECT_LE(std::stod(v[kColClockStaleness]), 1.0) << row;
    EXPECT_GE(std::stod(v[kColVersionLag]), 0.0) << row;
    ++rows;
  } while (std::getline(csv, row));
  EXPECT_GE(rows, 5);
  // The shards' summaries: every gradient applied and every pull answered, within the bound.
  for (int k = 0; k < 2; ++k) {
    auto s = ReadProcessSummary(dir.File("server-" + std::to_string(k) + ".json"));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->role(), "server");
    EXPECT_EQ(s->mode(), "ssp");
    EXPECT_EQ(s->staleness_bound(), 1);
    EXPECT_EQ(s->pushes(), 120);
    Histogram lag, clock;
    AddHistogram(s->version_lag(), &lag);
    AddHistogram(s->clock_staleness(), &clock);
    int64_t lags = 0, pulls = 0;
    for (const auto& [k2, v] : lag) lags += v;
    for (const auto& [k2, v] : clock) pulls += v;
    EXPECT_EQ(lags, 120);
    EXPECT_EQ(pulls, s->pulls());
    ASSERT_FALSE(clock.empty());
    EXPECT_LE(clock.rbegin()->first, 1);
  }
}

// ssp's row cache as a user runs it: the DLRM-style model over 2 servers x 2 workers at s = 3.
// Every training row accounts for each row its step read (pulled or served from the cache), no read
// is older than the bound by the workers' own count (rows and summaries), the cache serves the
// popular rows, and --row-cache=false pulls every row; a bsp job refuses the setting in one line.
// Mutations caught: the cache never consulted or never filled (no hits), hits or pulls not counted
// (the sum falls short of the rows read), the bound not kept or not counted, the flag ignored, a
// setting that does nothing in bsp accepted.
TEST(PsBinaryTest, SspServesRowsFromTheCacheWithinTheBoundAndCountsEveryRead) {
  const std::vector<std::string> model = {"--model=dlrm", "--click-features=4", "--click-ids=300", "--click-dense=4",
                                          "--click-train=4000", "--click-test=1000", "--table-dim=8", "--lr=0.05",
                                          "--momentum=0", "--epochs=1", "--batch=32", "--log-every=1"};
  struct Totals {
    int64_t read = 0, pulled = 0, hits = 0;
  };
  auto run = [&](const std::string& cache, Totals* t) {
    TempDir dir;
    std::vector<std::string> args = {BinaryPath("gradsync-launch"), "--servers=2", "--workers=2", "--mode=ssp",
                                     "--staleness=3", "--out=" + dir.path(), "--"};
    args.insert(args.end(), model.begin(), model.end());
    args.push_back("--row-cache=" + cache);
    ProcessResult r = RunProcess(args, 180);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(r.out.find("row cache on") != std::string::npos, cache == "true") << r.out;
    for (int w = 0; w < 2; ++w) {
      const std::vector<std::vector<std::string>> rows = TrainingRows(dir.File("worker-" + std::to_string(w) + ".csv"));
      ASSERT_GE(rows.size(), 50u);
      Totals mine;
      for (const auto& v : rows) {
        const int64_t read = std::stoll(v[kColTableRows]), pulled = std::stoll(v[kColRowsPulled]),
                      hits = std::stoll(v[kColCacheHits]);
        EXPECT_EQ(pulled + hits, read) << "worker " << w << " step " << v[kColStep];
        EXPECT_EQ(std::stoull(v[kColCacheSavedBytes]), static_cast<uint64_t>(hits) * 8 * sizeof(float));
        ASSERT_FALSE(v[kColReadStaleness].empty());
        EXPECT_LE(std::stoll(v[kColReadStaleness]), 3) << "worker " << w << " step " << v[kColStep];
        EXPECT_GE(std::stoll(v[kColReadStaleness]), 0);
        mine.read += read;
        mine.pulled += pulled;
        mine.hits += hits;
      }
      auto s = ReadProcessSummary(dir.File("worker-" + std::to_string(w) + ".json"));
      ASSERT_TRUE(s.ok()) << s.status();
      ASSERT_TRUE(s->has_max_read_staleness());
      EXPECT_LE(s->max_read_staleness(), 3);
      // The summary sums every step's reads; the evaluation's reads come on top of the training rows'.
      EXPECT_GE(s->rows_pulled() + s->cache_hits(), mine.read);
      EXPECT_EQ(s->cache_hits(), mine.hits);
      t->read += mine.read;
      t->pulled += mine.pulled;
      t->hits += mine.hits;
    }
  };
  Totals cached, uncached;
  run("true", &cached);
  run("false", &uncached);
  EXPECT_EQ(uncached.hits, 0);
  EXPECT_EQ(uncached.pulled, uncached.read);
  // Zipf ids over 300 per table: the popular rows of a step are read again within 3 clocks (about
  // a fifth of the reads here; none without the cache).
  EXPECT_GT(cached.hits, cached.read / 10) << cached.hits << " of " << cached.read;
  EXPECT_LT(cached.pulled, uncached.pulled);

  TempDir dir;
  std::vector<std::string> bsp = {BinaryPath("gradsync-launch"), "--servers=1", "--workers=1", "--mode=bsp",
                                  "--out=" + dir.path(), "--"};
  bsp.insert(bsp.end(), model.begin(), model.end());
  bsp.push_back("--row-cache=false");
  ProcessResult refused = RunProcess(bsp, 60);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("--row-cache applies to --mode=ssp only"), std::string::npos) << refused.out << refused.err;
}

TEST(PsBinaryTest, AFailingWorkerStopsTheWholeJob) {
  TempDir dir;
  // Worker flags that only fail after registration (a missing data directory).
  ProcessResult r = RunProcess({BinaryPath("gradsync-launch"), "--servers=1", "--workers=2", "--mode=bsp",
                                "--heartbeat-timeout=2", "--out=" + dir.path(), "--", "--data-dir=" + dir.path()},
                               60);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("worker"), std::string::npos) << r.err;
  // No process of the job survives: the launcher killed its process group.
  ProcessResult ps = RunProcess({"/usr/bin/pgrep", "-f", "--", "--out=" + dir.path()}, 10);
  EXPECT_EQ(ps.exit_code, 1) << ps.out;
}

TEST(PsBinaryTest, AModeMismatchIsRefusedWithAClearError) {
  TempDir dir;
  const std::string port_file = dir.File("port");
  std::thread sched([&] {
    RunProcess({BinaryPath("gradsync-server"), "--role=scheduler", "--num-servers=1", "--num-workers=1",
                "--port-file=" + port_file, "--register-timeout=4"},
               30);
  });
  std::string port = ReadPortFile(port_file);
  ASSERT_FALSE(port.empty());
  std::thread server([&] {
    RunProcess({BinaryPath("gradsync-server"), "--role=server", "--mode=bsp", "--scheduler=127.0.0.1:" + port,
                "--heartbeat-timeout=3"},
               30);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ProcessResult w = RunProcess({BinaryPath("gradsync-worker"), "--mode=asp", "--scheduler=127.0.0.1:" + port,
                                "--dataset=blobs"},
                               30);
  EXPECT_EQ(w.exit_code, 2) << w.err;
  EXPECT_NE(w.err.find("mode mismatch: this job runs bsp"), std::string::npos) << w.err;
  EXPECT_NE(w.err.find("asked for asp"), std::string::npos) << w.err;
  // A server is refused the same way, with the same exit code.
  ProcessResult s2 = RunProcess({BinaryPath("gradsync-server"), "--role=server", "--mode=ssp", "--staleness=1",
                                 "--scheduler=127.0.0.1:" + port, "--heartbeat-timeout=3"},
                                30);
  EXPECT_EQ(s2.exit_code, 2) << s2.err;
  EXPECT_NE(s2.err.find("mode mismatch: this job runs bsp"), std::string::npos) << s2.err;
  // The scheduler and server give up on their own (register timeout / lost scheduler).
  sched.join();
  server.join();
}

// A worker started in ssp mode without --staleness takes the job's bound (and says so); one that
// gives another bound explicitly is still refused.
TEST(PsBinaryTest, AnSspWorkerWithoutStalenessTakesTheJobsBound) {
  TempDir dir;
  const std::string port_file = dir.File("port");
  std::thread sched([&] {
    RunProcess({BinaryPath("gradsync-server"), "--role=scheduler", "--num-servers=1", "--num-workers=1",
                "--port-file=" + port_file, "--register-timeout=30"},
               90);
  });
  std::string port = ReadPortFile(port_file);
  ASSERT_FALSE(port.empty());
  std::thread server([&] {
    RunProcess({BinaryPath("gradsync-server"), "--role=server", "--mode=ssp", "--staleness=3",
                "--scheduler=127.0.0.1:" + port, "--heartbeat-timeout=5"},
               90);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the server registers first
  const std::vector<std::string> train = {"--mode=ssp", "--scheduler=127.0.0.1:" + port, "--dataset=blobs",
                                          "--hidden=8", "--epochs=1", "--max-steps=20", "--batch=16"};
  std::vector<std::string> other = {BinaryPath("gradsync-worker"), "--staleness=2"};
  other.insert(other.end(), train.begin(), train.end());
  ProcessResult refused = RunProcess(other, 30);
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find("this job runs ssp with staleness 3"), std::string::npos) << refused.err;
  std::vector<std::string> plain = {BinaryPath("gradsync-worker")};
  plain.insert(plain.end(), train.begin(), train.end());
  ProcessResult w = RunProcess(plain, 60);
  EXPECT_EQ(w.exit_code, 0) << w.err;
  EXPECT_NE(w.out.find("gradsync-worker 0: staleness bound 3, the job's (no --staleness given)"), std::string::npos) << w.out;
  sched.join();
  server.join();
}

// Workers whose training settings differ are refused, and the refusal names the settings.
TEST(PsBinaryTest, WorkersWithDifferentSettingsAreRefusedByName) {
  TempDir dir;
  const std::string port_file = dir.File("port");
  std::thread sched([&] {
    RunProcess({BinaryPath("gradsync-server"), "--role=scheduler", "--num-servers=1", "--num-workers=2",
                "--port-file=" + port_file, "--register-timeout=6"},
               30);
  });
  std::string port = ReadPortFile(port_file);
  ASSERT_FALSE(port.empty());
  const std::vector<std::string> common = {BinaryPath("gradsync-worker"), "--mode=bsp", "--scheduler=127.0.0.1:" + port,
                                           "--dataset=blobs", "--heartbeat-timeout=3"};
  ProcessResult first;
  std::thread w0([&] {
    std::vector<std::string> a = common;
    a.push_back("--lr=0.05");
    a.push_back("--threads=2");  // a per-process setting: free to differ
    first = RunProcess(a, 30);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the first worker sets the job's settings
  std::vector<std::string> b = common;
  b.push_back("--batch=32");
  ProcessResult second = RunProcess(b, 30);
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_NE(second.err.find("settings differ between workers"), std::string::npos) << second.err;
  EXPECT_NE(second.err.find("has [--lr=0.02 --batch=32] but"), std::string::npos) << second.err;
  EXPECT_NE(second.err.find("has [--lr=0.05 --batch=64]"), std::string::npos) << second.err;
  EXPECT_EQ(second.err.find("threads"), std::string::npos) << second.err;
  w0.join();
  sched.join();
  EXPECT_NE(first.exit_code, 0);  // its job never filled up
}

// Nothing listens on 127.0.0.1:1: a process that never heard its scheduler says it could not
// reach it (not that it lost it), with the address and the time, and prints no stats.
TEST(PsBinaryTest, AnUnreachableSchedulerIsNamedAsNeverReached) {
  const std::vector<std::string> timing = {"--scheduler=127.0.0.1:1", "--heartbeat-interval=0.2",
                                           "--heartbeat-timeout=1"};
  std::vector<std::string> worker = {BinaryPath("gradsync-worker"), "--mode=bsp", "--dataset=blobs"};
  std::vector<std::string> server = {BinaryPath("gradsync-server"), "--role=server", "--mode=bsp"};
  for (auto args : {worker, server}) {
    args.insert(args.end(), timing.begin(), timing.end());
    ProcessResult r = RunProcess(args, 30);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("could not reach the scheduler at tcp://127.0.0.1:1: no answer in 1 s"), std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("lost the scheduler"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("server -1"), std::string::npos) << r.err;
  }
}

TEST(PsBinaryTest, ServerFlagErrors) {
  for (auto args : std::vector<std::vector<std::string>>{
           {"--role=server"},
           {"--role=server", "--mode=bsp"},
           {"--role=server", "--mode=sync", "--scheduler=127.0.0.1:1"},
           {"--role=server", "--mode=bsp", "--staleness=2", "--scheduler=127.0.0.1:1"},
           {"--role=server", "--mode=bsp", "--scheduler=localhost"},
           {"--role=scheduler", "--num-workers=2"},
           {"--role=scheduler", "--num-servers=1", "--num-workers=0"},
           {"--role=boss"}}) {
    args.insert(args.begin(), BinaryPath("gradsync-server"));
    ProcessResult r = RunProcess(args, 10);
    EXPECT_EQ(r.exit_code, 2) << args.back() << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace gradsync::testing
