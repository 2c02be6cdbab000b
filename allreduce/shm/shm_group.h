// ShmGroup: the ranks of one host reduce through one shared-memory region instead of loopback TCP.
//
// Layout of the region (a SharedRegion, common/net/shared_region.h):
//   [control: magic, members, block bytes, nonce, the barriers' futex word and sleeper count;
//    one 64-byte arrival counter per member]
//   [slots: members x block bytes] [results: 2 x block bytes]
// AllReduce runs block by block: every member copies its block into its slot, but for its own
// share (ChunkBegin's i-th of `members`), which only it reads; a barrier; member i sums its share
// (its own values, then the others' slots in member order) into the result and its own block; a
// barrier; every member copies the rest of the result out. Each element is summed by one member
// in one order, so every member gets the same bits. Results alternate between two
// buffers, so a member may start the next block while another still copies the last result out.
// Reduce (to member 0) and Broadcast (from member 0) are its halves, for the hierarchical
// all-reduce across hosts.
//
// Barriers spin on the members' counters (a few pauses, then yielding the core for up to
// the wait policy's busy_poll_ms, common/base/wait_policy.h), then sleep on a process-shared futex that every arrival wakes (with
// more members than cores, pausing would take the cores the late members need; yielding gives
// them away), with a deadline: a member that never arrives (dead, stalled) fails the others with
// kDeadlineExceeded naming it.
// Not thread-safe: each member drives its own ShmGroup.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/base/wait_policy.h"
#include "common/net/shared_region.h"

namespace gradsync {

class ShmGroup {
 public:
  using Reducer = std::function<void(void*, const void*, size_t)>;
  // out[i] = a[i] + b[i] for k elements: the first addition of a share in one pass (optional).
  using Adder = void (*)(void* out, const void* a, const void* b, size_t k);
  using Clock = std::chrono::steady_clock;

  // Member 0 creates the region; the others attach to its name and check its control block
  // (`nonce`: member 0's random number, learned over the authenticated ring).
  static Result<std::unique_ptr<ShmGroup>> Create(int members, size_t block_bytes, uint64_t nonce);
  static Result<std::unique_ptr<ShmGroup>> Attach(const std::string& name, int members, int index, size_t block_bytes,
                                                  uint64_t nonce);

  const std::string& name() const { return region_.name(); }
  int members() const { return members_; }
  int index() const { return index_; }
  // Member 0, once every member has mapped it: no one else can map it from now on.
  void Unpublish() { region_.Unpublish(); }
  // Who each member is, for errors ("rank 5").
  void set_member_names(std::vector<std::string> names) { member_names_ = std::move(names); }

  // data <- the sum over the members of `count` elements of `elem` bytes.
  Status AllReduce(void* data, size_t count, size_t elem, const Reducer& reduce, double timeout_s, Adder add = nullptr);
  // Member 0's data <- the sum; the others' data is left as it was.
  Status Reduce(void* data, size_t count, size_t elem, const Reducer& reduce, double timeout_s, Adder add = nullptr);
  // data <- member 0's data.
  Status Broadcast(void* data, size_t bytes, double timeout_s);

  // Bytes exchanged with the other members through the region, counted as the wire would count
  // them: sent = what this member wrote that another member reads (times the readers), received
  // = what it read that another wrote. An all-reduce of B bytes among m members sends and
  // receives 2 (m - 1) / m B each, as a ring over TCP would.
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }

  // How a barrier waits (common/base/wait_policy.h): `policy`'s busy_poll_ms (--busy-poll-ms;
  // default 0), after kPauseSpins pauses and kMinPolls yields that every wait takes.
  static constexpr int kPauseSpins = 256, kMinPolls = 16;
  void set_wait_policy(WaitPolicy policy) {
    wait_ = policy;
    wait_.pause_spins = kPauseSpins;
    wait_.min_polls = kMinPolls;
  }
  // How many times this member's barriers yielded the core past the few yields every wait takes,
  // because the wait policy asked them to poll (0 while its busy_poll_ms is 0).
  uint64_t busy_polls() const { return static_cast<uint64_t>(busy_polls_); }

  // From any thread: this member's waits end at once with kAborted (a member was declared dead
  // elsewhere, so it will never arrive), now and in every later call.
  void Cancel();

 private:
  ShmGroup(SharedRegion region, int members, int index, size_t block_bytes);
  Status Barrier(Clock::time_point deadline);
  char* slot(int member) const;
  char* result(int parity) const;
  // The block-by-block reduction; `out` says who copies each result out (everyone, or member 0).
  Status Blocks(void* data, size_t count, size_t elem, const Reducer& reduce, Adder add, double timeout_s, bool everyone);

  SharedRegion region_;
  int members_;
  int index_;
  size_t block_bytes_;
  std::atomic<bool> cancelled_{false};
  WaitPolicy wait_{.busy_poll_ms = 0, .pause_spins = kPauseSpins, .min_polls = kMinPolls};
  int64_t busy_polls_ = 0;  // busy_polls()
  uint64_t epoch_ = 0;  // barriers passed
  uint64_t blocks_ = 0;  // blocks done: the parity of the next result buffer
  uint64_t bytes_sent_ = 0;
  uint64_t bytes_received_ = 0;
  std::vector<std::string> member_names_;
};

}  // namespace gradsync
