#include "common/metrics.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

TEST(MetricsTest, WritesHeaderAndRows) {
  testing::TempDir dir;
  const std::string path = dir.File("sub/worker-1.csv");
  {
    auto w = MetricsWriter::Open(path, "bsp-4w", 1);
    ASSERT_TRUE(w.ok()) << w.status();
    MetricsRow train;
    train.step = 50;
    train.epoch = 0.25;
    train.wall_s = 1.5;
    train.loss = 0.75;
    train.bytes_sent = 1000;
    train.compute_ms = 2.0;
    ASSERT_TRUE(w->Write(train).ok());
    MetricsRow eval = train;
    eval.test_loss = 0.5;
    eval.test_accuracy = 0.875;
    ASSERT_TRUE(w->Write(eval).ok());
  }
  std::ifstream f(path);
  std::string header, row1, row2;
  std::getline(f, header);
  std::getline(f, row1);
  std::getline(f, row2);
  EXPECT_EQ(header,
            "run,worker,step,epoch,wall_s,loss,staleness,bytes_sent,bytes_received,compute_ms,"
            "comm_ms,wait_ms,test_loss,test_accuracy,delay_ms,hidden_ms");
  EXPECT_EQ(row1, "bsp-4w,1,50,0.2500,1.5000,0.75,,1000,0,2.0000,0.0000,0.0000,,,0.0000,0.0000");
  EXPECT_EQ(row2, "bsp-4w,1,50,0.2500,1.5000,0.75,,1000,0,2.0000,0.0000,0.0000,0.5,0.875000,0.0000,0.0000");
}

TEST(MetricsTest, UnwritablePathIsAnError) {
  auto w = MetricsWriter::Open("/proc/gradsync-no/x.csv", "r", 0);
  EXPECT_FALSE(w.ok());
}

}  // namespace
}  // namespace gradsync
