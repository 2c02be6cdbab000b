#include "common/data/dataset_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/base/atomic_file.h"
#include "common/base/logging.h"
#include "common/data/idx.h"

namespace gradsync {
namespace {

static_assert(std::endian::native == std::endian::little, "the cache files' sizes are little-endian");

const std::string kMagic = "GSDATA1 ";
constexpr size_t kBodyHeader = 24;  // n, dim (8 bytes each), num_classes (4), zero (4)

// FNV-1a, 64 bits: a stable name for the source files' identity.
uint64_t Fnv1a(const std::string& text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

Result<std::string> Identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return NotFoundError(path + ": no such file");
  std::error_code ec;
  const std::string canonical = std::filesystem::canonical(path, ec).string();
  return (ec ? path : canonical) + "|" + std::to_string(st.st_size) + "|" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec);
}

// The dataset in a checked cache file's body, its pixels a view into `file`.
Result<Dataset> FromBody(std::shared_ptr<const MappedFile> file, std::string_view body, const std::string& path,
                         int num_classes, const std::string& name) {
  if (body.size() < kBodyHeader) return DataLossError(path + ": cut short inside its sizes");
  uint64_t n = 0, dim = 0;
  uint32_t classes = 0;
  std::memcpy(&n, body.data(), 8);
  std::memcpy(&dim, body.data() + 8, 8);
  std::memcpy(&classes, body.data() + 16, 4);
  if (dim == 0 || n > (uint64_t{1} << 34) / dim || body.size() != kBodyHeader + n + n * dim) {
    return DataLossError(path + ": holds " + std::to_string(body.size()) + " bytes, not the " + std::to_string(n) +
                         " labels and " + std::to_string(n) + " x " + std::to_string(dim) + " pixels it says");
  }
  if (classes != static_cast<uint32_t>(num_classes)) {
    return DataLossError(path + ": made for " + std::to_string(classes) + " classes, not " + std::to_string(num_classes));
  }
  Dataset d;
  d.name = name;
  d.n = static_cast<int64_t>(n);
  d.dim = static_cast<int64_t>(dim);
  d.num_classes = num_classes;
  d.labels.resize(n);
  const auto* labels = reinterpret_cast<const uint8_t*>(body.data() + kBodyHeader);
  for (uint64_t i = 0; i < n; ++i) {
    if (labels[i] >= num_classes) {
      return DataLossError(path + ": label " + std::to_string(labels[i]) + " at index " + std::to_string(i) +
                           " is outside [0, " + std::to_string(num_classes) + ")");
    }
    d.labels[i] = labels[i];
  }
  d.bytes = std::span<const uint8_t>(labels + n, n * dim);
  d.bytes_owner = std::move(file);
  d.byte_values = UnitByteValues();
  return d;
}

Result<Dataset> Mapped(const std::string& path, int num_classes, const std::string& name) {
  ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
  ASSIGN_OR_RETURN(std::string_view body, CheckedBody(file->bytes(), path, kMagic));
  return FromBody(std::move(file), body, path, num_classes, name);
}

std::string Body(const Dataset& d) {
  std::string body(kBodyHeader, '\0');
  const uint64_t n = static_cast<uint64_t>(d.n), dim = static_cast<uint64_t>(d.dim);
  const uint32_t classes = static_cast<uint32_t>(d.num_classes);
  std::memcpy(body.data(), &n, 8);
  std::memcpy(body.data() + 8, &dim, 8);
  std::memcpy(body.data() + 16, &classes, 4);
  body.reserve(kBodyHeader + n + n * dim);
  for (int32_t y : d.labels) body.push_back(static_cast<char>(y));
  body.append(reinterpret_cast<const char*>(d.bytes.data()), d.bytes.size());
  return body;
}

// An exclusive lock on `path` (flock: released when the process ends, however it ends), or -1
// after `timeout_s`.
int Lock(const std::string& path, double timeout_s, std::string* why) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = "cannot open " + path + ": " + std::strerror(errno);
    return -1;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if ((errno != EWOULDBLOCK && errno != EINTR) || std::chrono::steady_clock::now() > deadline) {
      *why = errno == EWOULDBLOCK ? path + " held by another process for over " + std::to_string(static_cast<int>(timeout_s)) + " s"
                                  : "cannot lock " + path + ": " + std::strerror(errno);
      ::close(fd);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return fd;
}

std::function<void()>& WriterHook() {
  static std::function<void()> hook;
  return hook;
}

}  // namespace

void internal::SetCacheWriterHookForTesting(std::function<void()> hook) { WriterHook() = std::move(hook); }

std::string DefaultDataCacheDir() {
  if (const char* dir = std::getenv("GRADSYNC_DATA_CACHE"); dir != nullptr && *dir != '\0') return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/') return std::string(xdg) + "/gradsync";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') return std::string(home) + "/.cache/gradsync";
  return "/tmp/gradsync-cache-" + std::to_string(::getuid());
}

Result<std::string> IdxCachePath(const std::string& images_path, const std::string& labels_path,
                                 const std::string& name, const std::string& cache_dir) {
  ASSIGN_OR_RETURN(std::string images, Identity(images_path));
  ASSIGN_OR_RETURN(std::string labels, Identity(labels_path));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(Fnv1a(kMagic + "|" + images + "|" + labels)));
  return cache_dir + "/" + name + "-" + hex + ".gsdata";
}

Result<Dataset> LoadIdxDatasetCached(const std::string& images_path, const std::string& labels_path, int num_classes,
                                     const std::string& name, const std::string& cache_dir, double lock_timeout_s) {
  auto path = IdxCachePath(images_path, labels_path, name, cache_dir);
  if (!path.ok()) return LoadIdxDataset(images_path, labels_path, num_classes, name);  // its own error
  auto mapped = Mapped(*path, num_classes, name);
  if (mapped.ok()) return mapped;
  auto privately = [&](const std::string& why) {
    GRADSYNC_LOG(WARNING) << "no shared copy of " << name << " (" << why << "); this process loads its own";
    return LoadIdxDataset(images_path, labels_path, num_classes, name);
  };
  if (Status dir = CreatePrivateDirectory(cache_dir); !dir.ok()) return privately(dir.message());
  std::string why;
  const int lock = Lock(*path + ".lock", lock_timeout_s, &why);
  if (lock < 0) return privately(why);
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }
  } unlock{lock};
  // Another process may have written it while this one waited for the lock.
  mapped = Mapped(*path, num_classes, name);
  if (mapped.ok()) return mapped;
  if (mapped.status().code() != StatusCode::kNotFound) GRADSYNC_LOG(WARNING) << mapped.status().message() << "; writing it again";
  if (WriterHook()) WriterHook()();
  ASSIGN_OR_RETURN(Dataset decoded, LoadIdxDataset(images_path, labels_path, num_classes, name));
  if (Status w = WriteCheckedFile(*path, kMagic, Body(decoded)); !w.ok()) {
    GRADSYNC_LOG(WARNING) << "no shared copy of " << name << " (" << w.message() << "); this process keeps its own";
    return decoded;
  }
  mapped = Mapped(*path, num_classes, name);
  if (mapped.ok()) return mapped;
  GRADSYNC_LOG(WARNING) << mapped.status().message() << "; this process keeps its own copy of " << name;
  return decoded;
}

}  // namespace gradsync
