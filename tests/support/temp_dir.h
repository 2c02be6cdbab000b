// Test support: a fresh temporary directory removed (with its contents) on destruction, reading
// a file whole, and counting gradsync's files in /dev/shm.
#pragma once

#include <string>

namespace gradsync::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The whole of a file, byte for byte; "" when it cannot be read.
std::string ReadFile(const std::string& path);

// Files named gradsync-* in /dev/shm (shared memory here never has a name there).
int GradsyncFilesInDevShm();

}  // namespace gradsync::testing
