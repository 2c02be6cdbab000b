// Files that a crash cannot leave half-written (checkpoints, key files), and files that say when
// they were damaged (checkpoints).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace gradsync {

// Writes `bytes` to `path` atomically: a temporary file beside it, fsync, rename over `path`,
// fsync of the directory. After a crash `path` holds the old contents or the new, never a mix;
// a failed write (a full disk, a read-only directory) leaves `path` as it was and removes its
// temporary file. The file has `mode` from its creation on (secret keys are never readable by
// others, not even for a moment).
Status WriteFileAtomically(const std::string& path, const std::string& bytes, unsigned mode = 0644);

// The whole file; kNotFound when it does not exist.
Result<std::string> ReadWholeFile(const std::string& path);

// A checksummed file: an 8-byte `magic` naming its kind, the body's length (8 bytes, little
// endian), the CRC32C of the body (4 bytes, little endian), then the body. Written atomically,
// mode 0600: checked files are checkpoints (parameters, optimizer state), no one else's to read.
inline constexpr size_t kCheckedFileHeaderBytes = 20;
Status WriteCheckedFile(const std::string& path, const std::string& magic, const std::string& body);
// The body of a file WriteCheckedFile wrote. kNotFound when there is none; kDataLoss, with the
// path and the reason (another kind of file, cut short, trailing bytes, checksum mismatch), when
// it is not exactly what was written.
Result<std::string> ReadCheckedFile(const std::string& path, const std::string& magic);

// The body of a checked file's whole contents `bytes` (read or mapped from `path`), checked as
// ReadCheckedFile checks it; a view into `bytes`.
Result<std::string_view> CheckedBody(std::string_view bytes, const std::string& path, const std::string& magic);

// A whole file mapped read-only and shared (MAP_SHARED): every process that maps the same file
// shares its pages. kNotFound when it does not exist. Unmapped when the last owner lets go.
class MappedFile {
 public:
  static Result<std::shared_ptr<const MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view bytes() const { return {data_, size_}; }

 private:
  MappedFile(const char* data, size_t size) : data_(data), size_(size) {}
  const char* data_;
  size_t size_;
};

// CRC32C (Castagnoli) of `bytes`.
uint32_t Crc32c(const void* data, size_t size);

// Creates `dir` (and its parents) when it does not exist, the directory itself mode 0700 (a
// checkpoint directory: only its owner lists or enters it); an existing one is left as it is.
Status CreatePrivateDirectory(const std::string& dir);

// Whether files can be written in `dir` (created if needed, CreatePrivateDirectory): a probe file
// of `probe_bytes` is written, synced and removed. The error says why not (missing, read-only, full).
Status CheckWritableDirectory(const std::string& dir, size_t probe_bytes = 1 << 16);

}  // namespace gradsync
