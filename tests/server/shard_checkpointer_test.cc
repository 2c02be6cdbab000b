#include "server/shard_checkpointer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

TEST(ShardCheckpointerTest, DueByCountOrByTimeAfterTheFirstUpdate) {
  ShardCheckpointer by_count("dir", 3, 100.0);
  EXPECT_FALSE(by_count.Due(false, 0));  // nothing changed
  EXPECT_FALSE(by_count.Due(true, 0));
  EXPECT_FALSE(by_count.Due(true, 1));
  EXPECT_TRUE(by_count.Due(true, 2));
  ShardCheckpointer by_time("dir", 0, 5.0);
  EXPECT_FALSE(by_time.Due(false, 0));
  EXPECT_FALSE(by_time.Due(true, 10));  // the first update since the last checkpoint
  EXPECT_FALSE(by_time.Due(false, 14.9));
  EXPECT_TRUE(by_time.Due(false, 15.0));
  ShardCheckpointer off("", 1, 1.0);
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.Due(true, 100));
}

TEST(ShardCheckpointerTest, WritesTheWholeStateAndReadsItBack) {
  testing::TempDir dir;
  std::vector<TensorInfo> layout = {{"w", {8}, 0, 8, false}};
  KvShard shard({0, 8}, layout, {0.9f, false, 0.0f}, {LrSchedule::Kind::kConstant, 0.1f, 0, 0}, 2, false);
  shard.SetValues(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
  std::vector<Segment> all = {{0, 8}};
  std::vector<float> g(8, 1.0f);
  shard.Apply(all, {}, g.data());
  ConsistencyController controller(ConsistencyMode::kAsp, 0, 2);
  ASSERT_TRUE(controller.OnPush(1, 0).ok());
  wire::JobConfig job;
  job.set_num_workers(2);
  job.set_lr(0.1f);
  ShardCheckpointer c(dir.path(), 1, 5.0);
  ASSERT_TRUE(c.Due(true, 0));
  ASSERT_TRUE(c.Write(0, job, shard, controller, 0).ok());
  EXPECT_EQ(c.written(), 1);
  EXPECT_FALSE(c.Due(false, 1));  // written: nothing new since
  auto back = c.Read(0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rank(), 0);
  EXPECT_EQ(back->version(), 1);
  EXPECT_EQ(back->job().num_workers(), 2);
  EXPECT_EQ(back->params().size(), 8 * sizeof(float));
  EXPECT_EQ(back->velocity().size(), 8 * sizeof(float));
  ASSERT_EQ(back->pushed_size(), 2);
  EXPECT_EQ(back->pushed(1), 1);
  // Another shard's file, a missing one, and garbage are each a clear error.
  EXPECT_EQ(c.Read(1).status().code(), StatusCode::kNotFound);
  std::ofstream(c.Path(1)) << "not a checkpoint";
  EXPECT_EQ(c.Read(1).status().code(), StatusCode::kDataLoss);
  std::filesystem::copy_file(c.Path(0), c.Path(2));
  auto foreign = c.Read(2);
  EXPECT_EQ(foreign.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(foreign.status().message().find("belongs to shard 0"), std::string::npos) << foreign.status();
}

}  // namespace
}  // namespace gradsync
