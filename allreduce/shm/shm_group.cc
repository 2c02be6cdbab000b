#include "allreduce/shm/shm_group.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <new>

#include "allreduce/collective.h"
#include "common/base/wait_policy.h"

namespace gradsync {
namespace {

constexpr uint64_t kMagic = 0x50524755524d4853ull;  // "SHMRUGRP"
constexpr size_t kLine = 64;

struct Header {
  uint64_t magic;
  uint64_t members;
  uint64_t block_bytes;
  uint64_t nonce;
  // Barriers: every arrival bumps `arrivals` (a futex word: the region is shared, so a
  // process-shared futex, not a private one); `sleepers` counts the members asleep on it.
  std::atomic<uint32_t> arrivals;
  std::atomic<uint32_t> sleepers;
};
static_assert(sizeof(Header) <= 64, "the header is the control area's first line");
static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == sizeof(uint32_t),
              "a futex word is a plain 32-bit integer");
struct alignas(kLine) Counter {
  std::atomic<uint64_t> value;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the group's counters are shared between processes");

size_t ControlBytes(int members) { return kLine + static_cast<size_t>(members) * sizeof(Counter); }
size_t RoundUp(size_t bytes) { return (bytes + kLine - 1) / kLine * kLine; }
uint64_t RegionBytes(int members, size_t block_bytes) {
  return ControlBytes(members) + (static_cast<uint64_t>(members) + 2) * RoundUp(block_bytes);
}
Counter* Counters(void* base) { return reinterpret_cast<Counter*>(static_cast<char*>(base) + kLine); }

// Sleeps while *word == expected, at most `timeout` (a wake, a change or the timeout ends it).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}


}  // namespace

ShmGroup::ShmGroup(SharedRegion region, int members, int index, size_t block_bytes)
    : region_(std::move(region)), members_(members), index_(index), block_bytes_(block_bytes) {}

Result<std::unique_ptr<ShmGroup>> ShmGroup::Create(int members, size_t block_bytes, uint64_t nonce) {
  if (members < 1 || block_bytes < kLine) return InvalidArgumentError("a shared-memory group of " + std::to_string(members) + " members");
  ASSIGN_OR_RETURN(SharedRegion region, SharedRegion::Create(RegionBytes(members, block_bytes), "all-reduce group"));
  auto* header = new (region.base()) Header{kMagic, static_cast<uint64_t>(members), block_bytes, nonce, {}, {}};
  header->arrivals.store(0);
  header->sleepers.store(0);
  for (int i = 0; i < members; ++i) new (&Counters(region.base())[i]) Counter{};
  std::atomic_thread_fence(std::memory_order_release);
  return std::unique_ptr<ShmGroup>(new ShmGroup(std::move(region), members, 0, block_bytes));
}

Result<std::unique_ptr<ShmGroup>> ShmGroup::Attach(const std::string& name, int members, int index, size_t block_bytes,
                                                   uint64_t nonce) {
  if (members < 1 || index < 0 || index >= members || block_bytes < kLine) {
    return InvalidArgumentError("member " + std::to_string(index) + " of a shared-memory group of " + std::to_string(members));
  }
  ASSIGN_OR_RETURN(SharedRegion region, SharedRegion::Attach(name, RegionBytes(members, block_bytes), "all-reduce group"));
  std::atomic_thread_fence(std::memory_order_acquire);
  const auto* h = static_cast<const Header*>(region.base());
  if (h->magic != kMagic || h->members != static_cast<uint64_t>(members) || h->block_bytes != block_bytes ||
      h->nonce != nonce) {
    return FailedPreconditionError("all-reduce group " + name + " is not this group's (another job's, or another host's)");
  }
  return std::unique_ptr<ShmGroup>(new ShmGroup(std::move(region), members, index, block_bytes));
}

char* ShmGroup::slot(int member) const {
  return static_cast<char*>(region_.base()) + ControlBytes(members_) + static_cast<size_t>(member) * RoundUp(block_bytes_);
}

char* ShmGroup::result(int parity) const { return slot(members_ + parity); }

Status ShmGroup::Barrier(Clock::time_point deadline) {
  ++epoch_;
  Counter* c = Counters(region_.base());
  auto* h = static_cast<Header*>(region_.base());
  // Arrive, then wake whoever sleeps. (seq_cst on both sides: an arriving member sees a sleeper,
  // or the sleeper, after saying it sleeps, sees the arrival and does not sleep.)
  c[index_].value.store(epoch_, std::memory_order_seq_cst);
  h->arrivals.fetch_add(1, std::memory_order_seq_cst);
  if (h->sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&h->arrivals);
  // The policy's pauses and yields first (another member may need this core to arrive).
  Waiter waiter(wait_, &busy_polls_);
  for (int j = 0; j < members_; ++j) {
    while (c[j].value.load(std::memory_order_acquire) < epoch_) {
      if (cancelled_.load(std::memory_order_relaxed)) return AbortedError("the shared-memory all-reduce was cancelled");
      // (No clock read while the waiter only pauses: a pause is shorter than reading the clock.)
      if (waiter.Poll() && (waiter.pausing() || Clock::now() <= deadline)) continue;
      const auto now = Clock::now();
      // Past the polling, sleep until a member arrives: with more members than cores, pausing
      // takes the cores the late members need to arrive (at most 20 ms a sleep, so that a dead
      // member is named within 20 ms of the deadline).
      if (now > deadline) {
        const std::string who = static_cast<size_t>(j) < member_names_.size() ? member_names_[j] : "member " + std::to_string(j);
        return DeadlineExceededError(who + " did not reach the shared-memory all-reduce in time (dead or stalled)");
      }
      const uint32_t seen = h->arrivals.load(std::memory_order_seq_cst);
      h->sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (c[j].value.load(std::memory_order_seq_cst) < epoch_) {
        FutexWait(&h->arrivals, seen,
                  std::min<std::chrono::nanoseconds>(std::chrono::milliseconds(20), deadline - now));
      }
      h->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }
  return OkStatus();
}

void ShmGroup::Cancel() {
  cancelled_.store(true);
  // Wakes this member if it sleeps (the others' sleep is theirs: their own Cancel wakes them).
  auto* h = static_cast<Header*>(region_.base());
  h->arrivals.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeAll(&h->arrivals);
}

Status ShmGroup::Blocks(void* data, size_t count, size_t elem, const Reducer& reduce, Adder add, double timeout_s,
                        bool everyone) {
  const auto deadline_after = [&] {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  };
  char* d = static_cast<char*>(data);
  const size_t block_elems = std::max<size_t>(1, block_bytes_ / elem);
  for (size_t first = 0; first < count; first += block_elems) {
    const size_t k = std::min(block_elems, count - first);
    char* block = d + first * elem;
    char* res = result(static_cast<int>(blocks_++ % 2));
    // This member's share of the block, which it sums: the others read only the rest of its slot.
    const size_t b = ChunkBegin(k, members_, index_) * elem, e = ChunkBegin(k, members_, index_ + 1) * elem;
    std::memcpy(slot(index_), block, b);
    std::memcpy(slot(index_) + e, block + e, k * elem - e);
    RETURN_IF_ERROR(Barrier(deadline_after()));
    if (e > b) {
      // Its own values first, then the others' in member order: each element is summed by one
      // member in one order.
      int j = index_ == 0 ? 1 : 0;  // the first other member
      if (add) {
        add(res + b, block + b, slot(j) + b, (e - b) / elem);
        ++j;
      } else {
        std::memcpy(res + b, block + b, e - b);
      }
      for (; j < members_; ++j) {
        if (j != index_) reduce(res + b, slot(j) + b, (e - b) / elem);
      }
      if (everyone || index_ == 0) std::memcpy(block + b, res + b, e - b);
    }
    RETURN_IF_ERROR(Barrier(deadline_after()));
    if (everyone || index_ == 0) {
      std::memcpy(block, res, b);
      std::memcpy(block + e, res + e, k * elem - e);
    }
    const ShmBytes moved = SharedMemoryBlockBytes(everyone ? PlanStep::Shm::kAllReduce : PlanStep::Shm::kReduce, index_,
                                                  members_, e - b, k * elem);
    bytes_sent_ += moved.sent;
    bytes_received_ += moved.received;
  }
  return OkStatus();
}

Status ShmGroup::AllReduce(void* data, size_t count, size_t elem, const Reducer& reduce, double timeout_s, Adder add) {
  if (members_ == 1 || count == 0) return OkStatus();
  return Blocks(data, count, elem, reduce, add, timeout_s, /*everyone=*/true);
}

Status ShmGroup::Reduce(void* data, size_t count, size_t elem, const Reducer& reduce, double timeout_s, Adder add) {
  if (members_ == 1 || count == 0) return OkStatus();
  return Blocks(data, count, elem, reduce, add, timeout_s, /*everyone=*/false);
}

Status ShmGroup::Broadcast(void* data, size_t bytes, double timeout_s) {
  if (members_ == 1 || bytes == 0) return OkStatus();
  char* d = static_cast<char*>(data);
  for (size_t off = 0; off < bytes; off += block_bytes_) {
    const size_t len = std::min(block_bytes_, bytes - off);
    char* res = result(static_cast<int>(blocks_++ % 2));
    if (index_ == 0) std::memcpy(res, d + off, len);
    RETURN_IF_ERROR(Barrier(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))));
    if (index_ != 0) std::memcpy(d + off, res, len);
    const ShmBytes moved = SharedMemoryBlockBytes(PlanStep::Shm::kBroadcast, index_, members_, 0, len);
    bytes_sent_ += moved.sent;
    bytes_received_ += moved.received;
  }
  return OkStatus();
}

}  // namespace gradsync
