#include "worker/train_options.h"

#include "worker/job_link.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

// Every size flag is in MiB, and at the defaults a whole part of an overlapped push is large
// enough for the data channel (a part of 4 MB against a threshold of 4 MiB never was).
TEST(TrainOptionsTest, SizesAreMiBAndADefaultPartMeetsTheDataChannelThreshold) {
  config::TrainConfig c;
  c.set_mode(config::BSP);
  const PsTrainOptions ps = PsOptionsFrom(c, TrainOptionsFrom(c), 0, 2, false);
  EXPECT_EQ(ps.overlap.push_part_floats, size_t{4} << 20 >> 2);
  EXPECT_EQ(ps.channels.data_min_floats, size_t{4} << 20 >> 2);
  EXPECT_GE(ps.overlap.push_part_floats, ps.channels.data_min_floats);
  c.set_push_part_mib(0.5);
  c.set_data_channel_min_mib(2);
  const PsTrainOptions set = PsOptionsFrom(c, TrainOptionsFrom(c), 0, 2, false);
  EXPECT_EQ(set.overlap.push_part_floats, (size_t{1} << 19) / sizeof(float));
  EXPECT_EQ(set.channels.data_min_floats, (size_t{2} << 20) / sizeof(float));
  config::TrainConfig a;
  a.set_mode(config::ALLREDUCE);
  a.set_bucket_mib(2);
  const AllreduceTrainOptions ar = AllreduceOptionsFrom(a, TrainOptionsFrom(a), false);
  EXPECT_EQ(ar.bucket_bytes, size_t{2} << 20);
  EXPECT_EQ(ar.first_bucket_bytes, size_t{1} << 20);
}

// --overlap: as set, else on unless a host runs more workers than it has cores; both paths alike.
TEST(TrainOptionsTest, OverlapIsOnByDefaultUnlessTheHostIsOversubscribed) {
  for (config::Mode mode : {config::BSP, config::ALLREDUCE}) {
    config::TrainConfig c;
    c.set_mode(mode);
    auto overlap = [&](bool oversubscribed) {
      return mode == config::BSP ? PsOptionsFrom(c, TrainOptionsFrom(c), 0, 4, oversubscribed).overlap.enabled
                                 : AllreduceOptionsFrom(c, TrainOptionsFrom(c), oversubscribed).overlap;
    };
    EXPECT_TRUE(overlap(false)) << mode;
    EXPECT_FALSE(overlap(true)) << mode;
    c.set_overlap(true);  // what is set wins
    EXPECT_TRUE(overlap(true)) << mode;
    c.set_overlap(false);
    EXPECT_FALSE(overlap(false)) << mode;
  }
}

// A host is its workers' advertised address: three workers on 10.0.0.1, one on 10.0.0.2.
TEST(TrainOptionsTest, WorkersOnAHostAreCountedByTheirAddress) {
  wire::ClusterTable t;
  for (const char* host : {"10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.1"}) t.add_workers()->set_host(host);
  EXPECT_EQ(WorkersOnHost(t, 0), 3);
  EXPECT_EQ(WorkersOnHost(t, 1), 1);
  EXPECT_EQ(WorkersOnHost(t, 3), 3);
  EXPECT_EQ(WorkersOnHost(t, 4), 0);  // no such worker
  EXPECT_TRUE(HostOversubscribed(t, 0, 2));
  EXPECT_FALSE(HostOversubscribed(t, 0, 3));
  EXPECT_FALSE(HostOversubscribed(t, 1, 1));
}

}  // namespace
}  // namespace gradsync
