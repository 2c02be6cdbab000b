// ShmLane: what a worker writes one side is what the shard reads the other, flow control moves
// forward only, names leave /dev/shm, and a shard refuses every lane it should not map.
#include "common/shm_lane.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

namespace gradsync {
namespace {

bool InDevShm(const std::string& name) { return std::filesystem::exists("/dev/shm" + name); }

TEST(ShmLaneTest, BothSidesSeeTheSameAreasAndReleasesOnlyMoveForward) {
  auto worker = ShmLane::Create(1000);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_TRUE(ShmLane::IsValidName(worker->name()));
  auto shard = ShmLane::Attach(worker->name(), 1000);
  ASSERT_TRUE(shard.ok()) << shard.status();
  for (int i = 0; i < 1000; ++i) worker->push_area()[i] = static_cast<float>(i);
  shard->pull_area()[999] = 42.0f;
  EXPECT_EQ(shard->push_area()[999], 999.0f);
  EXPECT_EQ(worker->pull_area()[999], 42.0f);
  EXPECT_NE(worker->push_area() + 1000, worker->pull_area() + 1) << "the areas must not overlap";
  EXPECT_EQ(worker->consumed(), 0u);
  shard->Consume(3);
  EXPECT_EQ(worker->consumed(), 3u);
  shard->Consume(2);  // never back
  EXPECT_EQ(worker->consumed(), 3u);
  EXPECT_TRUE(InDevShm(worker->name()));
  shard->Unlink();
  worker->Unlink();  // harmless twice
  EXPECT_FALSE(InDevShm(worker->name()));
  EXPECT_EQ(shard->push_area()[5], 5.0f) << "the mapping outlives the name";
}

TEST(ShmLaneTest, AShardRefusesWhatItShouldNotMap) {
  for (const std::string bad : {"", "/gradsync-", "/../../etc/passwd", "/gradsync-0123456789abcdef0123456789abcdeg",
                                "/gradsync-0123456789ABCDEF0123456789ABCDEF", "gradsync-0123456789abcdef0123456789abcdef"}) {
    auto r = ShmLane::Attach(bad, 10);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  auto missing = ShmLane::Attach("/gradsync-00000000000000000000000000000000", 10);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  auto lane = ShmLane::Create(100);
  ASSERT_TRUE(lane.ok()) << lane.status();
  auto wrong = ShmLane::Attach(lane->name(), 101);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kFailedPrecondition) << wrong.status();
  EXPECT_FALSE(ShmLane::Attach(lane->name(), 0).ok());
  // Readable by others: refused (a lane is private to its user).
  ASSERT_EQ(::chmod(("/dev/shm" + lane->name()).c_str(), 0644), 0);
  auto open = ShmLane::Attach(lane->name(), 100);
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.status().code(), StatusCode::kPermissionDenied) << open.status();
  lane->Unlink();

  // The right size but not a lane (no control block): refused.
  const std::string name = "/gradsync-0123456789abcdef0123456789abcdef";
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(ShmLane::RegionBytes(100))), 0);
  close(fd);
  auto fake = ShmLane::Attach(name, 100);
  shm_unlink(name.c_str());
  ASSERT_FALSE(fake.ok());
  EXPECT_EQ(fake.status().code(), StatusCode::kFailedPrecondition) << fake.status();
}

TEST(ShmLaneTest, ALaneTooLargeForSharedMemoryIsAnErrorNotACrash) {
  auto huge = ShmLane::Create(int64_t{1} << 34);  // 128 GiB of areas: more than /dev/shm holds
  if (huge.ok()) GTEST_SKIP() << "this machine's /dev/shm holds 128 GiB";
  EXPECT_EQ(huge.status().code(), StatusCode::kUnavailable) << huge.status();
  EXPECT_FALSE(ShmLane::Create(0).ok());
  EXPECT_FALSE(ShmLane::Create(-1).ok());
}

}  // namespace
}  // namespace gradsync
