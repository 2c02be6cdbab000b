#include "common/net/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <fstream>
#include <random>

namespace gradsync {
namespace {

constexpr char kPrefix[] = "/gradsync-";
constexpr size_t kPrefixLen = sizeof(kPrefix) - 1;
constexpr size_t kHexDigits = 32;
constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW;

std::string RandomToken() {
  std::random_device rd;
  static const char* kHex = "0123456789abcdef";
  std::string token;
  for (size_t i = 0; i < kHexDigits; i += 8) {
    uint32_t v = rd();
    for (int k = 0; k < 8; ++k, v >>= 4) token += kHex[v & 15];
  }
  return token;
}

bool IsLowerHex(std::string_view s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// A positive decimal int with no sign, no leading zero and at most 9 digits.
bool ParsePositive(std::string_view s, int* out) {
  if (s.empty() || s.size() > 9 || s[0] == '0') return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return std::from_chars(s.data(), s.data() + s.size(), *out).ec == std::errc();
}

struct Where {
  std::string token;
  int pid = 0;
  int fd = 0;
};

bool Parse(const std::string& name, Where* w) {
  if (name.size() < kPrefixLen + kHexDigits + 4 || name.compare(0, kPrefixLen, kPrefix) != 0) return false;
  std::string_view rest(name);
  rest.remove_prefix(kPrefixLen);
  if (!IsLowerHex(rest.substr(0, kHexDigits)) || rest[kHexDigits] != '.') return false;
  w->token = std::string(rest.substr(0, kHexDigits));
  rest.remove_prefix(kHexDigits + 1);
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return false;
  return ParsePositive(rest.substr(0, dot), &w->pid) && ParsePositive(rest.substr(dot + 1), &w->fd);
}

// What /proc shows for the memory file "gradsync-<token>".
std::string LinkTarget(const std::string& token) { return "/memfd:gradsync-" + token + " (deleted)"; }

std::string ReadLink(const std::string& path, int* err) {
  char buf[256];
  const ssize_t n = readlink(path.c_str(), buf, sizeof(buf));
  *err = n < 0 ? errno : 0;
  return n < 0 || n == static_cast<ssize_t>(sizeof(buf)) ? std::string() : std::string(buf, static_cast<size_t>(n));
}

// The memory this host can give without swapping (MemAvailable), or 0 when unknown.
uint64_t AvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    std::getline(in, unit);
  }
  return 0;
}

}  // namespace

SharedRegion::SharedRegion(SharedRegion&& o) noexcept { *this = std::move(o); }

SharedRegion& SharedRegion::operator=(SharedRegion&& o) noexcept {
  if (this != &o) {
    Reset();
    name_ = std::move(o.name_);
    fd_ = o.fd_;
    base_ = o.base_;
    bytes_ = o.bytes_;
    o.fd_ = -1;
    o.base_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

SharedRegion::~SharedRegion() { Reset(); }

void SharedRegion::Reset() {
  Unpublish();
  if (base_ != nullptr) munmap(base_, bytes_);
  base_ = nullptr;
}

bool SharedRegion::IsValidName(const std::string& name) {
  Where w;
  return Parse(name, &w);
}

Result<SharedRegion> SharedRegion::Create(uint64_t bytes, const std::string& what) {
  if (bytes == 0) return InvalidArgumentError("an empty shared-memory " + what);
  const std::string token = RandomToken();
  const int fd = memfd_create(("gradsync-" + token).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return UnavailableError(ErrnoMessage("memfd_create"));
  auto fail = [&](Status s) {
    close(fd);
    return s;
  };
  if (fchmod(fd, 0600) != 0) return fail(UnavailableError(ErrnoMessage("fchmod")));
  // Reserving more than the host has would not fail cleanly (the kernel reclaims, swaps, then
  // kills a process), so a region larger than the available memory is refused up front.
  if (const uint64_t avail = AvailableBytes(); avail > 0 && bytes > avail) {
    return fail(UnavailableError("a shared-memory " + what + " of " + std::to_string(bytes >> 20) + " MiB: this host has " +
                                 std::to_string(avail >> 20) + " MiB available"));
  }
  if (int e = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0) {
    errno = e;
    return fail(UnavailableError(ErrnoMessage("reserving " + std::to_string(bytes >> 20) + " MiB of shared memory")));
  }
  if (fcntl(fd, F_ADD_SEALS, kSeals | F_SEAL_SEAL) != 0) return fail(UnavailableError(ErrnoMessage("sealing")));
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return fail(UnavailableError(ErrnoMessage("mmap")));
  SharedRegion region;
  region.name_ = kPrefix + token + "." + std::to_string(getpid()) + "." + std::to_string(fd);
  region.fd_ = fd;
  region.base_ = base;
  region.bytes_ = bytes;
  return region;
}

Result<SharedRegion> SharedRegion::Attach(const std::string& name, uint64_t bytes, const std::string& what) {
  Where w;
  if (!Parse(name, &w)) return InvalidArgumentError("'" + name.substr(0, 64) + "' is not a " + what + "'s name");
  const std::string path = "/proc/" + std::to_string(w.pid) + "/fd/" + std::to_string(w.fd);
  const std::string want = LinkTarget(w.token);
  auto refused = [&](int err) -> Status {
    if (err == EACCES || err == EPERM) return PermissionDeniedError(what + " " + name + " belongs to another user's process");
    return NotFoundError("no shared-memory " + what + " " + name + " on this host (another host's, or its creator let go)");
  };
  // Checked before opening, so that nothing but that memory file is ever opened (a descriptor
  // of another kind may do something on open), and again on what was opened (the process may
  // have gone and its number been reused in between).
  int err = 0;
  if (ReadLink(path, &err) != want) return refused(err);
  const int fd = open(path.c_str(), O_RDWR | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return refused(errno);
  Status bad;
  struct stat st {};
  if (ReadLink("/proc/self/fd/" + std::to_string(fd), &err) != want) {
    bad = refused(err);
  } else if (fstat(fd, &st) != 0) {
    bad = UnavailableError(ErrnoMessage("fstat"));
  } else if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    bad = PermissionDeniedError(what + " " + name + " is not a private region of this user");
  } else if (const int seals = fcntl(fd, F_GET_SEALS); seals < 0 || (static_cast<unsigned>(seals) & kSeals) != kSeals) {
    bad = FailedPreconditionError(what + " " + name + " is not sealed against resizing");
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

void SharedRegion::Unpublish() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace gradsync
