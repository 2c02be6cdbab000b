#include "common/net/shm_lane.h"

#include <new>

namespace gradsync {
namespace {

constexpr uint64_t kMagic = 0x454e414c4d485347ull;  // "GSHMLANE"
constexpr uint64_t kControlBytes = 4096;
// A lane is at most this many elements (2^34, the most INIT accepts).
constexpr int64_t kMaxFloats = int64_t{1} << 34;

struct Control {
  uint64_t magic;
  uint64_t floats;
  alignas(64) std::atomic<uint64_t> consumed;
};
static_assert(sizeof(Control) <= kControlBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the lane's counter is shared between processes");

uint64_t AreaBytes(int64_t floats) { return (static_cast<uint64_t>(floats) * sizeof(float) + 63) / 64 * 64; }

}  // namespace

uint64_t ShmLane::RegionBytes(int64_t floats) { return kControlBytes + 2 * AreaBytes(floats); }

bool ShmLane::IsValidName(const std::string& name) { return SharedRegion::IsValidName(name); }

Result<ShmLane> ShmLane::Create(int64_t floats) {
  if (floats <= 0 || floats > kMaxFloats) return InvalidArgumentError("a lane of " + std::to_string(floats) + " floats");
  ASSIGN_OR_RETURN(SharedRegion region, SharedRegion::Create(RegionBytes(floats), "lane"));
  auto* c = new (region.base()) Control{kMagic, static_cast<uint64_t>(floats), {}};
  c->consumed.store(0, std::memory_order_release);
  ShmLane lane;
  lane.region_ = std::move(region);
  lane.floats_ = floats;
  return lane;
}

Result<ShmLane> ShmLane::Attach(const std::string& name, int64_t floats) {
  if (!IsValidName(name)) return InvalidArgumentError("'" + name.substr(0, 64) + "' is not a lane's name");
  if (floats <= 0 || floats > kMaxFloats) return InvalidArgumentError("a lane of " + std::to_string(floats) + " floats");
  ASSIGN_OR_RETURN(SharedRegion region, SharedRegion::Attach(name, RegionBytes(floats), "lane"));
  const auto* c = static_cast<const Control*>(region.base());
  if (c->magic != kMagic || c->floats != static_cast<uint64_t>(floats)) {
    return FailedPreconditionError("lane " + name + " does not describe a range of " + std::to_string(floats) +
                                   " floats");
  }
  ShmLane lane;
  lane.region_ = std::move(region);
  lane.floats_ = floats;
  return lane;
}

void ShmLane::Unpublish() { region_.Unpublish(); }

float* ShmLane::push_area() const {
  return reinterpret_cast<float*>(static_cast<char*>(region_.base()) + kControlBytes);
}

float* ShmLane::pull_area() const {
  return reinterpret_cast<float*>(static_cast<char*>(region_.base()) + kControlBytes + AreaBytes(floats_));
}

uint64_t ShmLane::consumed() const {
  return static_cast<const Control*>(region_.base())->consumed.load(std::memory_order_acquire);
}

void ShmLane::Consume(uint64_t seq) {
  auto& c = static_cast<Control*>(region_.base())->consumed;
  uint64_t cur = c.load(std::memory_order_relaxed);
  while (cur < seq && !c.compare_exchange_weak(cur, seq, std::memory_order_release)) {
  }
}

}  // namespace gradsync
