#include "worker/train_options.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

// Every size flag is in MiB, and at the defaults a whole part of an overlapped push is large
// enough for the data channel (a part of 4 MB against a threshold of 4 MiB never was).
TEST(TrainOptionsTest, SizesAreMiBAndADefaultPartMeetsTheDataChannelThreshold) {
  config::TrainConfig c;
  c.set_mode(config::BSP);
  const PsTrainOptions ps = PsOptionsFrom(c, TrainOptionsFrom(c), 0, 2);
  EXPECT_EQ(ps.push_part_floats, size_t{4} << 20 >> 2);
  EXPECT_EQ(ps.data_min_floats, size_t{4} << 20 >> 2);
  EXPECT_GE(ps.push_part_floats, ps.data_min_floats);
  c.set_push_part_mib(0.5);
  c.set_data_channel_min_mib(2);
  const PsTrainOptions set = PsOptionsFrom(c, TrainOptionsFrom(c), 0, 2);
  EXPECT_EQ(set.push_part_floats, (size_t{1} << 19) / sizeof(float));
  EXPECT_EQ(set.data_min_floats, (size_t{2} << 20) / sizeof(float));
  config::TrainConfig a;
  a.set_mode(config::ALLREDUCE);
  a.set_bucket_mib(2);
  const AllreduceTrainOptions ar = AllreduceOptionsFrom(a, TrainOptionsFrom(a));
  EXPECT_EQ(ar.bucket_bytes, size_t{2} << 20);
  EXPECT_EQ(ar.first_bucket_bytes, size_t{1} << 20);
}

}  // namespace
}  // namespace gradsync
