#include "common/base/atomic_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <boost/crc.hpp>

namespace gradsync {
namespace {

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint64_t GetLe(std::string_view in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  return v;
}

}  // namespace

Status WriteFileAtomically(const std::string& path, const std::string& bytes, unsigned mode) {
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());  // a leftover keeps its old mode; O_EXCL makes this one ours
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0) return UnavailableError("cannot write " + tmp + ": " + std::strerror(errno));
  // Any failure from here on leaves `path` as it was and no temporary file behind.
  auto fail = [&](const std::string& what, int e) {
    ::unlink(tmp.c_str());
    return UnavailableError(what + ": " + std::strerror(e));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n == 0 ? ENOSPC : errno;
      ::close(fd);
      return fail("writing " + tmp, e);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    return fail("fsync " + tmp, e);
  }
  if (::close(fd) != 0) return fail("close " + tmp, errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename to " + path, errno);
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return OkStatus();
}

Result<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open");
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return DataLossError(path + ": read error");
  return buf.str();
}

uint32_t Crc32c(const void* data, size_t size) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  return crc.checksum();
}

Status WriteCheckedFile(const std::string& path, const std::string& magic, const std::string& body) {
  if (magic.size() != 8) return InternalError("a checked file's magic is 8 bytes");
  std::string out;
  out.reserve(kCheckedFileHeaderBytes + body.size());
  out += magic;
  PutLe(&out, body.size(), 8);
  PutLe(&out, Crc32c(body.data(), body.size()), 4);
  out += body;
  return WriteFileAtomically(path, out, 0600);
}

Result<std::string_view> CheckedBody(std::string_view bytes, const std::string& path, const std::string& magic) {
  if (bytes.size() < kCheckedFileHeaderBytes || bytes.compare(0, 8, magic) != 0) {
    return DataLossError(path + ": not a " + magic.substr(0, magic.find_last_not_of(' ') + 1) + " file (no header)");
  }
  const uint64_t length = GetLe(bytes, 8, 8);
  const uint64_t have = bytes.size() - kCheckedFileHeaderBytes;
  if (length != have) {
    return DataLossError(path + ": " + (have < length ? "cut short: " : "has trailing bytes: ") + std::to_string(have) +
                         " bytes after the header, " + std::to_string(length) + " written");
  }
  const uint32_t stored = static_cast<uint32_t>(GetLe(bytes, 16, 4));
  const uint32_t actual = Crc32c(bytes.data() + kCheckedFileHeaderBytes, have);
  if (stored != actual) {
    char text[96];
    std::snprintf(text, sizeof text, ": checksum mismatch (CRC32C %08x, written %08x): the file is corrupted", actual, stored);
    return DataLossError(path + text);
  }
  return bytes.substr(kCheckedFileHeaderBytes);
}

Result<std::string> ReadCheckedFile(const std::string& path, const std::string& magic) {
  ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  ASSIGN_OR_RETURN(std::string_view body, CheckedBody(bytes, path, magic));
  return std::string(body);
}

Status CreatePrivateDirectory(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) return OkStatus();
  const std::filesystem::path path(dir);
  if (path.has_parent_path() && !path.parent_path().empty()) std::filesystem::create_directories(path.parent_path(), ec);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return UnavailableError("cannot create directory '" + dir + "': " + std::strerror(errno));
  }
  if (!std::filesystem::is_directory(dir, ec)) return UnavailableError("cannot create directory '" + dir + "'");
  return OkStatus();
}

Status CheckWritableDirectory(const std::string& dir, size_t probe_bytes) {
  RETURN_IF_ERROR(CreatePrivateDirectory(dir));
  const std::string probe = dir + "/.write-probe-" + std::to_string(::getpid());
  Status s = WriteFileAtomically(probe, std::string(probe_bytes, '\0'));
  ::unlink(probe.c_str());
  if (!s.ok()) return UnavailableError("'" + dir + "' is not writable: " + s.message());
  return OkStatus();
}

Result<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    return e == ENOENT ? NotFoundError(path + ": no such file") : UnavailableError("cannot open " + path + ": " + std::strerror(e));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return UnavailableError("cannot stat " + path + ": " + std::strerror(e));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* at = size == 0 ? nullptr : ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);  // the mapping keeps the file
  if (at == MAP_FAILED) return UnavailableError("cannot map " + path + ": " + std::strerror(e));
  return std::shared_ptr<const MappedFile>(new MappedFile(static_cast<const char*>(at), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
}

}  // namespace gradsync
