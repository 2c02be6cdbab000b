#include "tests/support/temp_dir.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/base/check.h"

namespace gradsync::testing {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "gradsync-test-XXXXXX").string();
  GRADSYNC_CHECK(mkdtemp(tmpl.data()) != nullptr) << "mkdtemp failed";
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

int GradsyncFilesInDevShm() {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().rfind("gradsync-", 0) == 0) ++n;
  return n;
}

}  // namespace gradsync::testing
