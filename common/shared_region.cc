#include "common/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <random>

namespace gradsync {
namespace {

constexpr char kPrefix[] = "/gradsync-";
constexpr size_t kPrefixLen = sizeof(kPrefix) - 1;
constexpr size_t kHexDigits = 32;

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

SharedRegion::SharedRegion(SharedRegion&& o) noexcept { *this = std::move(o); }

SharedRegion& SharedRegion::operator=(SharedRegion&& o) noexcept {
  if (this != &o) {
    Reset();
    name_ = std::move(o.name_);
    base_ = o.base_;
    bytes_ = o.bytes_;
    o.base_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

SharedRegion::~SharedRegion() { Reset(); }

void SharedRegion::Reset() {
  if (base_ != nullptr) munmap(base_, bytes_);
  base_ = nullptr;
}

bool SharedRegion::IsValidName(const std::string& name) {
  if (name.size() != kPrefixLen + kHexDigits || name.compare(0, kPrefixLen, kPrefix) != 0) return false;
  for (size_t i = kPrefixLen; i < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Result<SharedRegion> SharedRegion::Create(uint64_t bytes, const std::string& what) {
  if (bytes == 0) return InvalidArgumentError("an empty shared-memory " + what);
  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < 4 && fd < 0; ++attempt) {
    name = RandomName();
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) return UnavailableError(ErrnoMessage("shm_open " + name));
  }
  if (fd < 0) return UnavailableError("shm_open: no free " + what + " name");
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
  SharedRegion region;
  region.name_ = std::move(name);
  region.base_ = base;
  region.bytes_ = bytes;
  return region;
}

Result<SharedRegion> SharedRegion::Attach(const std::string& name, uint64_t bytes, const std::string& what) {
  if (!IsValidName(name)) return InvalidArgumentError("'" + name.substr(0, 64) + "' is not a " + what + "'s name");
  const int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError("no shared-memory " + what + " " + name + " on this host");
    return UnavailableError(ErrnoMessage("shm_open " + name));
  }
  struct stat st {};
  Status bad;
  if (fstat(fd, &st) != 0) {
    bad = UnavailableError(ErrnoMessage("fstat"));
  } else if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    bad = PermissionDeniedError(what + " " + name + " is not a private region of this user");
  } else if (static_cast<uint64_t>(st.st_size) != bytes) {
    bad = FailedPreconditionError(what + " " + name + " holds " + std::to_string(st.st_size) + " bytes, not " +
                                  std::to_string(bytes));
  }
  if (!bad.ok()) {
    close(fd);
    return bad;
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return UnavailableError(ErrnoMessage("mmap"));
  SharedRegion region;
  region.name_ = name;
  region.base_ = base;
  region.bytes_ = bytes;
  return region;
}

void SharedRegion::Unlink() {
  if (!name_.empty()) shm_unlink(name_.c_str());
}

}  // namespace gradsync
