// gradsync-launch --cluster without a cluster: where each task of a launcher's world goes, where
// its scheduler is, and the files its tasks carry back through srun's output (file_relay.h).
#include "experiments/launch/cluster_task.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "experiments/launch/file_relay.h"
#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup Env(const Vars& vars) {
  return [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

ClusterTaskOptions Ps(int servers) {
  ClusterTaskOptions o;
  o.job.mode = config::BSP;
  o.job.num_servers = servers;
  o.job.num_workers = -1;
  return o;
}

TEST(ClusterTaskTest, TheRankPicksTheRoleServersFirst) {
  ClusterTaskOptions o = Ps(2);
  o.scheduler = "h0:9000";
  std::vector<std::string> roles;
  for (int r = 0; r < 5; ++r) {
    Vars v = {{"OMPI_COMM_WORLD_RANK", std::to_string(r)}, {"OMPI_COMM_WORLD_SIZE", "5"}};
    auto p = PlaceTask(o, Env(v));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->servers, 2);
    EXPECT_EQ(p->workers, 3);
    roles.push_back((p->server ? "s" : "w") + std::to_string(p->role_rank));
  }
  EXPECT_EQ(roles, (std::vector<std::string>{"s0", "s1", "w0", "w1", "w2"}));
  // All-reduce: every task is a worker.
  o.job.mode = config::ALLREDUCE;
  Vars v = {{"RANK", "0"}, {"WORLD_SIZE", "3"}};
  auto p = PlaceTask(o, Env(v));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->server);
  EXPECT_EQ(p->workers, 3);
}

TEST(ClusterTaskTest, AWorldOfTheWrongSizeOrNoLauncherIsRefused) {
  ClusterTaskOptions o = Ps(2);
  o.scheduler = "h0:9000";
  o.job.num_workers = 4;
  Vars v = {{"RANK", "0"}, {"WORLD_SIZE", "5"}};
  auto p = PlaceTask(o, Env(v));
  EXPECT_EQ(p.status().message(), "torchrun started 5 task(s), but the job has 2 server(s) and 4 worker(s): start "
                                  "servers + workers tasks (one per process)");
  o.job.num_workers = -1;
  v = {{"RANK", "1"}, {"WORLD_SIZE", "2"}};  // 2 servers leave no worker
  EXPECT_FALSE(PlaceTask(o, Env(v)).ok());
  v = {};
  EXPECT_NE(PlaceTask(o, Env(v)).status().message().find("no launcher gave this process a rank"), std::string::npos);
  v = {{"RANK", "1"}};  // a rank without a world size
  EXPECT_NE(PlaceTask(o, Env(v)).status().message().find("gave no world size"), std::string::npos);
  o.slurm_only = true;
  v = {{"RANK", "1"}, {"WORLD_SIZE", "4"}};
  EXPECT_NE(PlaceTask(o, Env(v)).status().message().find("not Slurm's"), std::string::npos);
}

TEST(ClusterTaskTest, TheSchedulerIsGivenOrFromMasterAddrOrTheSlurmJob) {
  ClusterTaskOptions o = Ps(1);
  Vars v = {{"RANK", "1"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"}};
  auto p = PlaceTask(o, Env(v));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->scheduler_host, "node7");
  EXPECT_EQ(p->scheduler_port, 29501);  // MASTER_PORT itself stays torch.distributed's
  o.port = 4000;
  EXPECT_EQ(PlaceTask(o, Env(v))->scheduler_port, 4000);
  o.scheduler = "10.0.0.1:7000";  // given: wins over the variables
  EXPECT_EQ(PlaceTask(o, Env(v))->scheduler_host, "10.0.0.1");
  EXPECT_EQ(PlaceTask(o, Env(v))->scheduler_port, 7000);
  o.scheduler = "nonsense";
  EXPECT_FALSE(PlaceTask(o, Env(v)).ok());
  o.scheduler.clear();
  o.port = 0;
  v["MASTER_PORT"] = "x";
  EXPECT_NE(PlaceTask(o, Env(v)).status().message().find("MASTER_PORT"), std::string::npos);
  // Open MPI outside any allocation, no MASTER_ADDR: nowhere to find the scheduler.
  v = {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"}};
  EXPECT_NE(PlaceTask(o, Env(v)).status().message().find("no scheduler address"), std::string::npos);
}

TEST(ClusterTaskTest, ATaskKnowsWhenItsJobSpansHosts) {
  ClusterTaskOptions o = Ps(1);
  o.scheduler = "h0:9000";
  Vars v = {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  EXPECT_FALSE(PlaceTask(o, Env(v))->spans_hosts);
  v["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  EXPECT_TRUE(PlaceTask(o, Env(v))->spans_hosts);
  v = {{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_STEP_NUM_NODES", "2"}};
  EXPECT_TRUE(PlaceTask(o, Env(v))->spans_hosts);
}

// Two tasks' files through one interleaved, labelled stream, as srun --label delivers them.
TEST(FileRelayTest, FilesOfInterleavedTasksComeBackByteForByte) {
  testing::TempDir a, b, dest;
  std::filesystem::create_directories(a.path() + "/logs");
  std::string binary;
  for (int i = 0; i < 1000; ++i) binary.push_back(static_cast<char>(i * 7));
  std::ofstream(a.File("worker-0.csv")) << "run,worker\nx,0\n";
  std::ofstream(a.File("logs/worker-0.log"), std::ios::binary) << binary;
  std::ofstream(a.File("empty.json")) << "";
  for (int n = 1; n <= 5; ++n) std::ofstream(b.File("server-" + std::to_string(n) + ".json")) << std::string(n, 'x');
  std::stringstream ta, tb;
  ASSERT_TRUE(EmitFiles(a.path(), 0, ta).ok());
  ASSERT_TRUE(EmitFiles(b.path(), 11, tb).ok());
  FileCollector c(dest.path());
  std::string la, lb;
  int other = 0;
  for (bool more = true; more;) {
    more = false;
    if (std::getline(ta, la)) {
      more = true;
      EXPECT_TRUE(c.Line(" 0: " + la));
    }
    if (std::getline(tb, lb)) {
      more = true;
      EXPECT_TRUE(c.Line("11: " + lb));
      if (!c.Line("11: worker 1: final test_acc 80%")) ++other;  // the job's own output is left alone
    }
  }
  EXPECT_GT(other, 0);
  ASSERT_TRUE(c.Finish().ok());
  EXPECT_EQ(c.written().size(), 8u);
  EXPECT_EQ(testing::ReadFile(dest.File("worker-0.csv")), "run,worker\nx,0\n");
  EXPECT_EQ(testing::ReadFile(dest.File("logs/worker-0.log")), binary);
  EXPECT_TRUE(std::filesystem::exists(dest.File("empty.json")));
  for (int n = 1; n <= 5; ++n) EXPECT_EQ(testing::ReadFile(dest.File("server-" + std::to_string(n) + ".json")), std::string(n, 'x'));
}

TEST(FileRelayTest, CutOrForgedFilesAreRefusedAndNothingLeavesTheFolder) {
  testing::TempDir dest;
  FileCollector c(dest.path());
  c.Line("0: #gradsync-file 0 6 ../escape");          // a path out of the folder
  c.Line("0: #gradsync-file 0 6 /etc/passwd");
  c.Line("1: #gradsync-file 1 6 short.csv");          // cut short: 3 of 6 bytes
  c.Line("1: #gradsync-data 1 YWJj");
  c.Line("1: #gradsync-end 1 short.csv");
  c.Line("2: #gradsync-file 2 3 bad.csv");            // not base64
  c.Line("2: #gradsync-data 2 !!!!");
  c.Line("3: #gradsync-data 3 YWJj");                 // data outside a file
  c.Line("4: #gradsync-file 4 3 never-ended.csv");
  c.Line("5: #gradsync-file 5 3 good.csv");
  c.Line("5: #gradsync-data 5 YWJj");
  c.Line("5: #gradsync-end 5 good.csv");
  Status s = c.Finish();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  for (const char* part : {"malformed size or path", "short.csv: 3 of 6 bytes", "bad.csv: malformed data", "outside a file",
                           "never-ended.csv (task 4) was cut short"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << part << " not in: " << s.message();
  }
  EXPECT_EQ(c.written(), std::vector<std::string>{"good.csv"});
  EXPECT_EQ(testing::ReadFile(dest.File("good.csv")), "abc");
  EXPECT_FALSE(std::filesystem::exists(dest.path() + "/../escape"));
}

}  // namespace
}  // namespace gradsync
