#include "common/obs/metrics.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/obs/process_summary.h"
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
    train.traffic.bytes_sent = 1000;
    train.traffic.shm_bytes_sent = 4096;
    train.traffic.shm_bytes_received = 8192;
    train.table_rows = 1469;
    train.times.compute_ms = 2.0;
    train.staleness.version_lag = 3;
    train.staleness.clock_staleness = 1;
    train.row_reads = {.pulled = 1200, .cached = 269, .saved_bytes = 8608, .max_staleness = 2};
    ASSERT_TRUE(w->Write(train).ok());
    MetricsRow eval = train;
    eval.row_reads = {};  // no row read: read_staleness empty, never the row's last field
    eval.staleness.version_lag = NAN;
    eval.staleness.clock_staleness = NAN;
    eval.test.loss = 0.5;
    eval.test.accuracy = 0.875;
    eval.test.auc = 0.625;
    ASSERT_TRUE(w->Write(eval).ok());
  }
  std::ifstream f(path);
  std::string header, row1, row2;
  std::getline(f, header);
  std::getline(f, row1);
  std::getline(f, row2);
  EXPECT_EQ(header,
            "run,worker,step,epoch,wall_s,loss,version_lag,clock_staleness,bytes_sent,bytes_received,compute_ms,"
            "comm_ms,wait_ms,test_loss,test_accuracy,test_auc,delay_ms,hidden_ms,loss_scale,skipped_steps,shm_bytes_sent,"
            "shm_bytes_received,table_rows,rows_pulled,cache_hits,read_staleness,cache_saved_bytes");
  EXPECT_EQ(row1,
            "bsp-4w,1,50,0.2500,1.5000,0.75,3,1,1000,0,2.0000,0.0000,0.0000,,,,0.0000,0.0000,,0,4096,8192,1469,1200,269,2,"
            "8608");
  EXPECT_EQ(row2,
            "bsp-4w,1,50,0.2500,1.5000,0.75,,,1000,0,2.0000,0.0000,0.0000,0.5,0.875000,0.625000,0.0000,0.0000,,0,4096,8192,1469,0,0,,"
            "0");
}

TEST(ProcessSummaryTest, RoundTripsThroughJsonWithItsHistograms) {
  testing::TempDir dir;
  summary::ProcessSummary s;
  s.set_role("server");
  s.set_rank(1);
  s.set_mode("ssp");
  s.set_staleness_bound(3);
  s.set_pushes(120);
  SetHistogram({{0, 70}, {2, 50}}, s.mutable_version_lag());
  SetHistogram({{0, 10}, {3, 5}}, s.mutable_clock_staleness());
  ASSERT_TRUE(WriteProcessSummary(dir.path(), s).ok());
  EXPECT_EQ(ProcessSummaryPath(dir.path(), "server", 1), dir.File("server-1.json"));
  auto back = ReadProcessSummary(dir.File("server-1.json"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), s.SerializeAsString());
  Histogram h = {{3, 1}};
  AddHistogram(back->clock_staleness(), &h);
  EXPECT_EQ(h, (Histogram{{0, 10}, {3, 6}}));
  EXPECT_EQ(ReadProcessSummary(dir.File("server-9.json")).status().code(), StatusCode::kNotFound);
  std::ofstream(dir.File("server-2.json")) << "{\"rank\": \"not a number\"}";
  auto bad = ReadProcessSummary(dir.File("server-2.json"));
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("server-2.json"), std::string::npos) << bad.status();
}

TEST(MetricsTest, UnwritablePathIsAnError) {
  auto w = MetricsWriter::Open("/proc/gradsync-no/x.csv", "r", 0);
  EXPECT_FALSE(w.ok());
}

TEST(MetricsTest, MedianOfOddAndEvenCountsAndOfNone) {
  EXPECT_EQ(Median({5, 1, 3}), 3);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median({7}), 7);
  EXPECT_EQ(Median({}), 0);
}

}  // namespace
}  // namespace gradsync
