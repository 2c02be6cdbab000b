// SharedRegion: a private POSIX shared-memory region of this user, mapped read-write, for the
// transports that move values through memory between processes of one host (the PS's ShmLane,
// the all-reduce's ShmGroup).
//
// The creator names it /gradsync-<32 random hex digits> (mode 0600, every page reserved with
// posix_fallocate, so a full /dev/shm is an error at creation, not a SIGBUS later); another
// process maps it only if it is a regular file of its own user with no group or other bits and
// exactly the size it expects. Once every process has mapped it, Unlink removes the name: the
// mapping lives on until all have let go, and nothing is left in /dev/shm when a process dies.
// Such regions trust the processes of the same user on the host (as any shared-memory transport
// does: they may also signal or trace each other); other users cannot open them.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace gradsync {

class SharedRegion {
 public:
  SharedRegion() = default;
  SharedRegion(SharedRegion&& o) noexcept;
  SharedRegion& operator=(SharedRegion&& o) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();

  // A new region of `bytes` (> 0), zero-filled. kUnavailable when shared memory cannot be had (or
  // /dev/shm cannot hold it). `what` names it in errors ("lane", ...).
  static Result<SharedRegion> Create(uint64_t bytes, const std::string& what);
  // Maps the region `name` (IsValidName) of exactly `bytes`: kInvalidArgument for a bad name,
  // kNotFound for no such region (another host), kPermissionDenied for one of another user or
  // readable by others, kFailedPrecondition for a wrong size.
  static Result<SharedRegion> Attach(const std::string& name, uint64_t bytes, const std::string& what);
  static bool IsValidName(const std::string& name);

  // Removes the name (the mapping stays valid). Harmless when already removed.
  void Unlink();

  bool valid() const { return base_ != nullptr; }
  const std::string& name() const { return name_; }
  void* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }

 private:
  void Reset();

  std::string name_;
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace gradsync
