// Test support: run a binary as a child process with a time bound and capture its output.
#pragma once

#include <string>
#include <vector>

namespace gradsync::testing {

struct ProcessResult {
  int exit_code = -1;      // -1 if killed by a signal or the timeout
  bool timed_out = false;
  std::string out;
  std::string err;
};

// Runs argv[0] (a path) with `argv`, extra `env` entries ("NAME=value") added to this process's
// environment; kills it with SIGKILL after `timeout_s`. Never leaves the child running.
ProcessResult RunProcess(const std::vector<std::string>& argv, double timeout_s = 60.0,
                         const std::vector<std::string>& env = {});

// build/bin/<name>, from GRADSYNC_BIN_DIR (set by CTest).
std::string BinaryPath(const std::string& name);

// Whether this process can emulate links (gradsync-run's `link { }`: network namespaces and tc):
// root and iproute2. A test of them is skipped without.
bool CanEmulateLinks();

// Whether this run is CI's (CI=true in the environment): there a test whose prerequisite is
// missing (a Debian package, root) fails instead of skipping, as CI must run every test.
bool InCi();

// Skips the test saying why, or under CI=true fails it saying why. A statement, like GTEST_SKIP.
#define GRADSYNC_SKIP_UNLESS_CI(why)                                                            \
  if (::gradsync::testing::InCi()) {                                                             \
    FAIL() << why << " (CI=true: a missing prerequisite fails)";                                 \
  } else                                                                                         \
    GTEST_SKIP() << why

// The port a scheduler wrote to its --port-file, waiting for it at most timeout_s; "" if none.
std::string ReadPortFile(const std::string& path, double timeout_s = 10);

}  // namespace gradsync::testing
