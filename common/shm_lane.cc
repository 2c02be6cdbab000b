#include "common/shm_lane.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

namespace gradsync {
namespace {

constexpr uint64_t kMagic = 0x454e414c4d485347ull;  // "GSHMLANE"
constexpr uint64_t kControlBytes = 4096;
constexpr char kPrefix[] = "/gradsync-";
constexpr size_t kPrefixLen = sizeof(kPrefix) - 1;
constexpr size_t kHexDigits = 32;
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


std::string RandomName() {
  std::random_device rd;
  static const char* kHex = "0123456789abcdef";
  std::string name = kPrefix;
  for (size_t i = 0; i < kHexDigits; i += 8) {
    uint32_t v = rd();
    for (int k = 0; k < 8; ++k, v >>= 4) name += kHex[v & 15];
  }
  return name;
}

}  // namespace

ShmLane::ShmLane(ShmLane&& o) noexcept { *this = std::move(o); }

ShmLane& ShmLane::operator=(ShmLane&& o) noexcept {
  if (this != &o) {
    Reset();
    name_ = std::move(o.name_);
    base_ = o.base_;
    bytes_ = o.bytes_;
    floats_ = o.floats_;
    o.base_ = nullptr;
    o.bytes_ = 0;
    o.floats_ = 0;
  }
  return *this;
}

ShmLane::~ShmLane() { Reset(); }

void ShmLane::Reset() {
  if (base_ != nullptr) munmap(base_, bytes_);
  base_ = nullptr;
}

uint64_t ShmLane::RegionBytes(int64_t floats) { return kControlBytes + 2 * AreaBytes(floats); }

bool ShmLane::IsValidName(const std::string& name) {
  if (name.size() != kPrefixLen + kHexDigits || name.compare(0, kPrefixLen, kPrefix) != 0) return false;
  for (size_t i = kPrefixLen; i < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Result<ShmLane> ShmLane::Create(int64_t floats) {
  if (floats <= 0 || floats > kMaxFloats) return InvalidArgumentError("a lane of " + std::to_string(floats) + " floats");
  const uint64_t bytes = RegionBytes(floats);
  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < 4 && fd < 0; ++attempt) {
    name = RandomName();
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) return UnavailableError(ErrnoMessage("shm_open " + name));
  }
  if (fd < 0) return UnavailableError("shm_open: no free lane name");
  auto fail = [&](Status s) {
    close(fd);
    shm_unlink(name.c_str());
    return s;
  };
  if (int e = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0) {
    errno = e;
    return fail(UnavailableError(ErrnoMessage("reserving " + std::to_string(bytes >> 20) + " MiB of /dev/shm")));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return fail(UnavailableError(ErrnoMessage("mmap")));
  close(fd);
  auto* c = new (base) Control{kMagic, static_cast<uint64_t>(floats), {}};
  c->consumed.store(0, std::memory_order_release);
  ShmLane lane;
  lane.name_ = std::move(name);
  lane.base_ = base;
  lane.bytes_ = bytes;
  lane.floats_ = floats;
  return lane;
}

Result<ShmLane> ShmLane::Attach(const std::string& name, int64_t floats) {
  if (!IsValidName(name)) return InvalidArgumentError("'" + name.substr(0, 64) + "' is not a lane's name");
  if (floats <= 0 || floats > kMaxFloats) return InvalidArgumentError("a lane of " + std::to_string(floats) + " floats");
  const int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError("no shared-memory lane " + name + " on this host");
    return UnavailableError(ErrnoMessage("shm_open " + name));
  }
  struct stat st {};
  const uint64_t bytes = RegionBytes(floats);
  Status bad;
  if (fstat(fd, &st) != 0) {
    bad = UnavailableError(ErrnoMessage("fstat"));
  } else if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    bad = PermissionDeniedError("lane " + name + " is not a private region of this user");
  } else if (static_cast<uint64_t>(st.st_size) != bytes) {
    bad = FailedPreconditionError("lane " + name + " holds " + std::to_string(st.st_size) + " bytes, not " +
                                  std::to_string(bytes));
  }
  if (!bad.ok()) {
    close(fd);
    return bad;
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return UnavailableError(ErrnoMessage("mmap"));
  ShmLane lane;
  lane.name_ = name;
  lane.base_ = base;
  lane.bytes_ = bytes;
  lane.floats_ = floats;
  const auto* c = static_cast<const Control*>(base);
  if (c->magic != kMagic || c->floats != static_cast<uint64_t>(floats)) {
    return FailedPreconditionError("lane " + name + " does not describe a range of " + std::to_string(floats) +
                                   " floats");
  }
  return lane;
}

void ShmLane::Unlink() {
  if (!name_.empty()) shm_unlink(name_.c_str());
}

float* ShmLane::push_area() const {
  return reinterpret_cast<float*>(static_cast<char*>(base_) + kControlBytes);
}

float* ShmLane::pull_area() const {
  return reinterpret_cast<float*>(static_cast<char*>(base_) + kControlBytes + AreaBytes(floats_));
}

uint64_t ShmLane::consumed() const {
  return static_cast<const Control*>(base_)->consumed.load(std::memory_order_acquire);
}

void ShmLane::Consume(uint64_t seq) {
  auto& c = static_cast<Control*>(base_)->consumed;
  uint64_t cur = c.load(std::memory_order_relaxed);
  while (cur < seq && !c.compare_exchange_weak(cur, seq, std::memory_order_release)) {
  }
}

}  // namespace gradsync
