// Allreduce jobs as processes: the launcher, an authenticated and encrypted ring, and a worker
// killed mid-training.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/base/atomic_file.h"
#include "common/obs/metrics.h"
#include "common/obs/process_summary.h"
#include "experiments/process/process.h"
#include "gradsync.pb.h"
#include "tests/support/metrics_file.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace gradsync::testing {
namespace {

TEST(AllreduceBinaryTest, LaunchRunsAnAllreduceJob) {
  TempDir dir;
  ProcessResult r = RunProcess({BinaryPath("gradsync-launch"), "--mode=allreduce", "--workers=3", "--out=" + dir.path(),
                                "--", "--dataset=blobs", "--hidden=16", "--epochs=2", "--max-steps=60", "--batch=16"},
                               120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("final test_acc"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("over the ring"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir.File("worker-2.csv")));
}

// The DLRM-style model on the click log in all-reduce mode: each worker keeps a replica of the
// tables and all-gathers each step's rows; the job learns (rank 0's test AUC, about 0.5 untrained)
// and says where its tables live. Mutations caught: the refusal of tables with all-reduce left in
// place (exit 2), the factory building the plain AllreduceSync for a model with tables (its rows
// are never read: the evaluation fails), rows never applied (no learning: AUC about 0.5).
TEST(AllreduceBinaryTest, LaunchRunsADlrmJobWithTablesOnTheClickLog) {
  TempDir dir;
  ProcessResult r = RunProcess({BinaryPath("gradsync-launch"), "--mode=allreduce", "--workers=2", "--out=" + dir.path(),
                                "--", "--model=dlrm", "--click-features=4", "--click-ids=500", "--click-dense=4",
                                "--click-train=8000", "--click-test=4000", "--table-dim=8", "--table-optimizer=adagrad",
                                "--lr=0.1", "--momentum=0", "--lr-schedule=constant", "--epochs=2", "--batch=32"},
                               180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("4 embedding tables of 500 ids x 8 floats, adagrad rows, at most 16777216 rows per process"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("over the ring"), std::string::npos) << r.out;
  auto summary = ReadProcessSummary(dir.File("worker-0.json"));
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_TRUE(summary->has_final_test_auc()) << r.out;
  EXPECT_GT(summary->final_test_auc(), 0.6) << r.out;
  // The metrics rows count the rows each step read and gathered: at most 4 tables x 32 examples.
  const std::vector<std::vector<std::string>> rows = TrainingRows(dir.File("worker-1.csv"));
  EXPECT_FALSE(rows.empty());
  for (const auto& v : rows) {
    EXPECT_GT(std::stoll(v[kColTableRows]), 0);
    EXPECT_LE(std::stoll(v[kColTableRows]), 4 * 32);
  }
}

// --auth-dir authenticates the ring and --ring-encrypt encrypts it: the job trains bit for bit
// like a plaintext one over TCP (rank 0's checkpoint holds the same step, parameters and
// momentum). The plaintext job leaves shared memory off, which an encrypted ring never uses.
TEST(AllreduceBinaryTest, AnEncryptedRingTrainsBitForBitLikeAPlaintextOne) {
  TempDir dir;
  const std::string keys = dir.File("keys");
  ASSERT_EQ(RunProcess({BinaryPath("gradsync-keygen"), keys}, 30).exit_code, 0);
  auto run = [&](const std::string& name, bool secure) {
    const std::string out = dir.File(name);
    std::filesystem::create_directories(out + "/ckpt");
    std::vector<std::string> argv = {BinaryPath("gradsync-launch"), "--mode=allreduce", "--workers=3", "--out=" + out};
    if (secure) argv.push_back("--auth-dir=" + keys);
    for (const char* a : {"--", "--dataset=blobs", "--hidden=16", "--epochs=2", "--max-steps=60", "--batch=16", "--checkpoint-every=60",
                          "--allreduce-shm=false"}) {
      argv.push_back(a);
    }
    argv.push_back("--checkpoint-dir=" + out + "/ckpt");
    if (secure) argv.push_back("--ring-encrypt");
    ProcessResult r = RunProcess(argv, 120);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("over the ring"), std::string::npos) << r.out;
    wire::TrainerCheckpoint c;
    auto body = ReadCheckedFile(out + "/ckpt/allreduce.ckpt", "GSTRAIN1");
    EXPECT_TRUE(body.ok() && c.ParseFromString(*body)) << name << ": " << body.status();
    return c;
  };
  const wire::TrainerCheckpoint plain = run("plain", false), secure = run("secure", true);
  EXPECT_EQ(plain.step(), 60);
  EXPECT_EQ(secure.step(), plain.step());
  EXPECT_FALSE(plain.params().empty());
  EXPECT_TRUE(secure.params() == plain.params()) << "the encrypted ring trained other parameters";
  EXPECT_TRUE(secure.optimizer_state() == plain.optimizer_state());
}

TEST(AllreduceBinaryTest, RingEncryptWithoutKeysIsOneClearError) {
  ProcessResult r = RunProcess({BinaryPath("gradsync-worker"), "--mode=allreduce", "--scheduler=127.0.0.1:9", "--ring-encrypt"}, 30);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--ring-encrypt needs --auth-dir"), std::string::npos) << r.err;
}

TEST(AllreduceBinaryTest, AKilledWorkerMakesTheOthersFailWithinTheTimeout) {
  TempDir dir;
  ProcessGroup group;
  const std::string port_file = dir.File("port");
  ASSERT_TRUE(group.Spawn({"scheduler",
                            {BinaryPath("gradsync-server"), "--role=scheduler", "--mode=allreduce", "--num-servers=0",
                             "--num-workers=3", "--port-file=" + port_file, "--heartbeat-timeout=3"},
                            dir.File("scheduler.log")})
                  .ok());
  std::string port = ReadPortFile(port_file);
  ASSERT_FALSE(port.empty());
  for (int w = 0; w < 3; ++w) {
    ASSERT_TRUE(group.Spawn({"worker " + std::to_string(w),
                             {BinaryPath("gradsync-worker"), "--mode=allreduce", "--scheduler=127.0.0.1:" + port,
                              "--rank=" + std::to_string(w), "--dataset=blobs", "--hidden=64", "--epochs=100",
                              "--batch=8", "--collective-timeout=2", "--heartbeat-timeout=3"},
                             dir.File("worker-" + std::to_string(w) + ".log")})
                    .ok());
  }
  // Wait until training runs (worker 0 prints its settings once the ring is up).
  for (int i = 0; i < 400; ++i) {
    if (ReadFile(dir.File("worker-0.log")).find("mode=allreduce") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(group.Signal("worker 2", SIGKILL).ok());
  auto killed_at = std::chrono::steady_clock::now();
  for (int w = 0; w < 2; ++w) {
    auto code = group.WaitFor("worker " + std::to_string(w), 10);
    ASSERT_TRUE(code.ok()) << "worker " << w << " hangs: " << code.status();
    EXPECT_EQ(*code, 1) << ReadFile(dir.File("worker-" + std::to_string(w) + ".log"));
    const std::string log = ReadFile(dir.File("worker-" + std::to_string(w) + ".log"));
    EXPECT_NE(log.find("gradsync-worker: error:"), std::string::npos) << log;
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(took, 2 * 2.0 + 1.0);
  // The scheduler ends the job on its own once every worker finished or died.
  auto sched = group.WaitFor("scheduler", 10);
  ASSERT_TRUE(sched.ok()) << sched.status();
  EXPECT_EQ(*sched, 1);
}

}  // namespace
}  // namespace gradsync::testing
