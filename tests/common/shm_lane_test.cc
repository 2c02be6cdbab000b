// ShmLane: what a worker writes one side is what the shard reads the other, flow control moves
// forward only, a lane never appears in /dev/shm and is gone with the last process that holds
// it, and a shard refuses every lane it should not map.
#include "common/net/shm_lane.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

using testing::GradsyncFilesInDevShm;

// The descriptor a lane created by this process is published by (its name's last number).
int PublishedFd(const std::string& name) { return std::stoi(name.substr(name.rfind('.') + 1)); }

// A memory file of this process that looks like a lane's region to everything but `skip`.
std::string FakeRegion(const std::string& token, uint64_t bytes, bool seal, int* fd) {
  *fd = memfd_create(("gradsync-" + token).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(*fd, 0);
  EXPECT_EQ(fchmod(*fd, 0600), 0);
  EXPECT_EQ(ftruncate(*fd, static_cast<off_t>(bytes)), 0);
  if (seal) {
    EXPECT_EQ(fcntl(*fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  }
  return "/gradsync-" + token + "." + std::to_string(getpid()) + "." + std::to_string(*fd);
}

TEST(ShmLaneTest, BothSidesSeeTheSameAreasAndReleasesOnlyMoveForward) {
  const int before = GradsyncFilesInDevShm();
  auto worker = ShmLane::Create(1000);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_TRUE(ShmLane::IsValidName(worker->name())) << worker->name();
  auto shard = ShmLane::Attach(worker->name(), 1000);
  ASSERT_TRUE(shard.ok()) << shard.status();
  for (int i = 0; i < 1000; ++i) worker->push_area()[i] = static_cast<float>(i);
  shard->pull_area()[999] = 42.0f;
  EXPECT_EQ(shard->push_area()[999], 999.0f);
  EXPECT_EQ(worker->pull_area()[999], 42.0f);
  // The areas do not overlap: as address ranges, and in effect (filling the whole pull area
  // leaves every pushed value in place).
  const float *push = worker->push_area(), *pull = worker->pull_area();
  EXPECT_TRUE(push + 1000 <= pull || pull + 1000 <= push) << "the areas overlap";
  for (int i = 0; i < 1000; ++i) shard->pull_area()[i] = -1.0f;
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(shard->push_area()[i], static_cast<float>(i)) << i;
  shard->pull_area()[999] = 42.0f;
  EXPECT_EQ(worker->consumed(), 0u);
  shard->Consume(3);
  EXPECT_EQ(worker->consumed(), 3u);
  shard->Consume(2);  // never back
  EXPECT_EQ(worker->consumed(), 3u);
  EXPECT_EQ(GradsyncFilesInDevShm(), before) << "a lane has no name in /dev/shm";
  shard->Unpublish();  // harmless on the shard's side
  worker->Unpublish();
  worker->Unpublish();  // and twice
  auto late = ShmLane::Attach(worker->name(), 1000);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kNotFound) << late.status();
  EXPECT_EQ(shard->push_area()[5], 5.0f) << "the mapping outlives the publication";
}

TEST(ShmLaneTest, ALaneWhoseWorkerDiesBeforeTheShardAttachesLeavesNothing) {
  // The worker creates a lane, says its name and dies without unpublishing it (the moment a
  // kill at job start hits): the lane cannot be mapped any more, and no file holds its memory.
  const int before = GradsyncFilesInDevShm();
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto lane = ShmLane::Create(1 << 20);
    const std::string name = lane.ok() ? lane->name() : "";
    (void)!write(fds[1], name.data(), name.size());
    _exit(0);  // no Unpublish, no destructor
  }
  close(fds[1]);
  char buf[256];
  const ssize_t n = read(fds[0], buf, sizeof(buf));
  close(fds[0]);
  ASSERT_GT(n, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const std::string name(buf, static_cast<size_t>(n));
  auto orphan = ShmLane::Attach(name, 1 << 20);
  ASSERT_FALSE(orphan.ok());
  EXPECT_EQ(orphan.status().code(), StatusCode::kNotFound) << orphan.status();
  EXPECT_EQ(GradsyncFilesInDevShm(), before);
}

TEST(ShmLaneTest, AShardRefusesWhatItShouldNotMap) {
  const std::string token = "0123456789abcdef0123456789abcdef";
  for (const std::string& bad : std::vector<std::string>{
           std::string(), std::string("/gradsync-"), std::string("/../../etc/passwd"), "/gradsync-" + token,
        "/gradsync-0123456789abcdef0123456789abcdeg.1.3", "/gradsync-0123456789ABCDEF0123456789ABCDEF.1.3",
        "gradsync-" + token + ".1.3", "/gradsync-" + token + ".0.3", "/gradsync-" + token + ".01.3",
        "/gradsync-" + token + ".1.-3", "/gradsync-" + token + ".1.3.4", "/gradsync-" + token + ".1.3/../../x",
        "/gradsync-" + token + ".1.9999999999"}) {
    auto r = ShmLane::Attach(bad, 10);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // Another process's descriptor that is not a lane (pid 1's, or our own standard output), and
  // a descriptor that is not open: nothing is opened.
  for (const std::string& missing : std::vector<std::string>{"/gradsync-" + token + ".1.1", "/gradsync-" + token + "." + std::to_string(getpid()) + ".1",
                                     "/gradsync-" + token + "." + std::to_string(getpid()) + ".999999"}) {
    auto r = ShmLane::Attach(missing, 10);
    ASSERT_FALSE(r.ok()) << missing;
    EXPECT_NE(r.status().code(), StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().code(), StatusCode::kOk);
  }

  auto lane = ShmLane::Create(100);
  ASSERT_TRUE(lane.ok()) << lane.status();
  auto wrong = ShmLane::Attach(lane->name(), 101);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kFailedPrecondition) << wrong.status();
  EXPECT_FALSE(ShmLane::Attach(lane->name(), 0).ok());
  // The right descriptor under another token: not this lane.
  std::string other = lane->name();
  other.replace(10, 32, "ffffffffffffffffffffffffffffffff");
  auto impostor = ShmLane::Attach(other, 100);
  ASSERT_FALSE(impostor.ok());
  EXPECT_EQ(impostor.status().code(), StatusCode::kNotFound) << impostor.status();
  // Readable by others: refused (a lane is private to its user).
  ASSERT_EQ(fchmod(PublishedFd(lane->name()), 0644), 0);
  auto open = ShmLane::Attach(lane->name(), 100);
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.status().code(), StatusCode::kPermissionDenied) << open.status();
  lane->Unpublish();

  // The right size but not a lane (no control block): refused.
  int fd = -1;
  const std::string fake = FakeRegion(token, ShmLane::RegionBytes(100), true, &fd);
  auto no_control = ShmLane::Attach(fake, 100);
  ASSERT_FALSE(no_control.ok());
  EXPECT_EQ(no_control.status().code(), StatusCode::kFailedPrecondition) << no_control.status();
  close(fd);
  // Not sealed: its creator could shrink it under the shard (SIGBUS there), so refused.
  const std::string unsealed = FakeRegion(token, ShmLane::RegionBytes(100), false, &fd);
  auto r = ShmLane::Attach(unsealed, 100);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("sealed"), std::string::npos) << r.status();
  close(fd);
}

TEST(ShmLaneTest, ALaneCannotBeResizedUnderTheShard) {
  auto lane = ShmLane::Create(100);
  ASSERT_TRUE(lane.ok()) << lane.status();
  const int fd = PublishedFd(lane->name());
  EXPECT_NE(ftruncate(fd, 16), 0);
  EXPECT_NE(ftruncate(fd, static_cast<off_t>(ShmLane::RegionBytes(200))), 0);
  EXPECT_NE(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0) << "no seal may be added (F_SEAL_WRITE would stop the shard)";
}

TEST(ShmLaneTest, ALaneTooLargeForTheHostIsAnErrorNotACrash) {
  auto huge = ShmLane::Create(int64_t{1} << 34);  // 128 GiB of areas
  if (huge.ok()) GTEST_SKIP() << "this host has 128 GiB of memory available";
  EXPECT_EQ(huge.status().code(), StatusCode::kUnavailable) << huge.status();
  EXPECT_FALSE(ShmLane::Create(0).ok());
  EXPECT_FALSE(ShmLane::Create(-1).ok());
}

}  // namespace
}  // namespace gradsync
