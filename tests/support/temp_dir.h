// Test support: a fresh temporary directory removed (with its contents) on destruction, and
// reading a file whole.
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

}  // namespace gradsync::testing
