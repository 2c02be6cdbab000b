// ShmLane: the shared-memory lane of one worker and one shard on the same host, so that their
// values move through memory both processes map instead of through the loopback TCP stack.
// ZeroMQ still carries every header (and so every check, consistency rule and error reply); the
// lane only holds the floats.
//
// Layout of the region (a SharedRegion: an anonymous memory file, never in /dev/shm):
//   [control: 4 KiB: magic, floats, consumed] [push area: floats] [pull area: floats]
// Both areas are indexed like the shard's range: element i of the range is area[i].
//
// The worker creates the lane (a SharedRegion, common/net/shared_region.h: private to this user,
// every page reserved, sealed against resizing) and names it in CHANNEL_ATTACH; the shard maps it
// only if SharedRegion accepts it and its control block describes the range. The worker then
// unpublishes it: the memory lives until both have let go, and nothing is left behind whatever
// dies, at any moment (the region never has a name in a file system).
//
// Flow control: a worker writes its push area only once the shard says it no longer reads it:
// the shard stores the number of the last push it is done with in `consumed` (release), the
// worker reads it (acquire) before writing the next one. A pull's answer is written by the shard
// into the pull area and announced by a header; the worker never has two pulls of overlapping
// elements outstanding on one lane.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "common/base/status.h"
#include "common/net/shared_region.h"

namespace gradsync {

class ShmLane {
 public:
  ShmLane() = default;

  // The worker: a new lane for a range of `floats` elements (> 0). kUnavailable when shared
  // memory cannot be had (or the host cannot hold the lane).
  static Result<ShmLane> Create(int64_t floats);
  // The shard: maps the lane `name` (IsValidName) of exactly `floats` elements; kInvalidArgument
  // for a bad name, kNotFound for no such lane (another host, or its worker let go),
  // kPermissionDenied for one of another user or readable by others, kFailedPrecondition for an
  // unsealed region, a wrong size or control block.
  static Result<ShmLane> Attach(const std::string& name, int64_t floats);
  static bool IsValidName(const std::string& name);
  // The size of the region of a lane of `floats` elements.
  static uint64_t RegionBytes(int64_t floats);

  // The worker, once the shard answered CHANNEL_ATTACH: no one else can map it from now on (the
  // mappings stay valid). Harmless on the shard's side and when called twice.
  void Unpublish();

  bool valid() const { return region_.valid(); }
  const std::string& name() const { return region_.name(); }
  int64_t floats() const { return floats_; }
  float* push_area() const;
  float* pull_area() const;
  // The number of the last push the shard no longer reads (0: none yet).
  uint64_t consumed() const;
  // The shard: done with every push up to `seq` (it only moves forward).
  void Consume(uint64_t seq);

 private:
  SharedRegion region_;
  int64_t floats_ = 0;
};

}  // namespace gradsync
