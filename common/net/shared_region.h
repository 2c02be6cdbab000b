// SharedRegion: a private shared-memory region of this user, mapped read-write, for the
// transports that move values through memory between processes of one host (the PS's ShmLane,
// the all-reduce's ShmGroup).
//
// The creator makes an anonymous memory file (memfd_create, "gradsync-<32 random hex digits>",
// mode 0600, every page reserved so that too little memory is an error at creation and not a
// SIGBUS later, sealed against shrinking and growing) and keeps its descriptor open; the region's
// name, "/gradsync-<32 hex>.<pid>.<fd>", says where another process of this host finds it
// (/proc/<pid>/fd/<fd>). The region never has a name in any file system: it lives exactly as long
// as some process holds its descriptor or a mapping, so nothing is left behind whatever dies and
// whenever. Another process maps it only if the descriptor there is the memory file of that name
// (checked before opening and again on what it opened), a regular file of its own user with no
// group or other bits, sealed, of exactly the size it expects. Once every process has mapped it,
// the creator calls Unpublish: the descriptor closes and nobody else can map it.
// Such regions trust the processes of the same user on the host (as any shared-memory transport
// does: they may also signal or trace each other); other users cannot open them.
#pragma once

#include <cstdint>
#include <string>

#include "common/base/status.h"

namespace gradsync {

class SharedRegion {
 public:
  SharedRegion() = default;
  SharedRegion(SharedRegion&& o) noexcept;
  SharedRegion& operator=(SharedRegion&& o) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();

  // A new region of `bytes` (> 0), zero-filled. kUnavailable when shared memory cannot be had
  // (or the host's available memory cannot hold it). `what` names it in errors ("lane", ...).
  static Result<SharedRegion> Create(uint64_t bytes, const std::string& what);
  // Maps the region `name` (IsValidName) of exactly `bytes`: kInvalidArgument for a bad name,
  // kNotFound for no such region (another host, its creator gone, or already unpublished),
  // kPermissionDenied for one of another user or readable by others, kFailedPrecondition for an
  // unsealed region or a wrong size.
  static Result<SharedRegion> Attach(const std::string& name, uint64_t bytes, const std::string& what);
  static bool IsValidName(const std::string& name);

  // The creator: closes the descriptor that others open the region by (the mappings stay valid);
  // Attach fails from now on. Harmless on an attached region and when called twice.
  void Unpublish();

  bool valid() const { return base_ != nullptr; }
  const std::string& name() const { return name_; }
  void* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }

 private:
  void Reset();

  std::string name_;
  int fd_ = -1;  // the creator's descriptor until Unpublish
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace gradsync
