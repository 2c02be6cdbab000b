// Child processes for the launcher: spawn into one process group, wait with a deadline, and
// kill the whole group on failure or interruption, so that no process is left behind.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/config/flags.h"

namespace gradsync {

// argv joined with spaces, as commands.txt and error messages show it.
std::string JoinArgs(const std::vector<std::string>& argv);

// Runs a command (found on the PATH) and waits for it, at most timeout_s; on failure the status
// carries its stderr. For short helper commands (ip, tc, gnuplot).
Status RunCommand(const std::vector<std::string>& argv, double timeout_s = 20);
// The same, and what it printed on stdout.
Result<std::string> CommandOutput(const std::vector<std::string>& argv, double timeout_s = 20);

// Whether `tool` is an executable in a folder of PATH, /usr/sbin or /sbin (where root's tools are).
bool OnPath(const std::string& tool);

struct ChildSpec {
  std::string name;                // "server 1", "worker 0"
  std::vector<std::string> argv;   // argv[0]: a path, or a name looked up on the PATH
  std::string log_path;            // stdout+stderr go here ("" = inherit)
  EnvVars env = {};                // added to this process's environment (replacing a variable of the same name)
};

// The child as a shell would start it: its env as NAME=value, then argv joined with spaces
// ("GRADSYNC_RANK=0 python3 train.py"), as commands.txt and --dry-run show it.
std::string CommandLine(const ChildSpec& spec);

class ProcessGroup {
 public:
  ProcessGroup() = default;
  ~ProcessGroup();  // kills whatever still runs
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Starts the child; one that cannot be started fails with "<name>: cannot run '<argv[0]>':
  // <reason>".
  Status Spawn(const ChildSpec& spec);
  // Waits for every child. Returns at the first failure (naming it) after killing the rest, or
  // when all exited 0. `interrupted` (checked every 50 ms) makes it kill everything and fail.
  // on_tick, when set, runs about every 250 ms while it waits (progress lines).
  Status WaitAll(double timeout_s, const volatile bool* interrupted = nullptr,
                 const std::function<void()>& on_tick = {});
  void KillAll();
  // Sends `sig` to one child by name.
  Status Signal(const std::string& name, int sig);
  // The process id of a child by name that has not been seen to exit; -1 otherwise.
  pid_t Pid(const std::string& name) const;
  // Waits for one child: its exit code, or -N when signal N ended it; kDeadlineExceeded if it is
  // still running after timeout_s (it keeps running).
  Result<int> WaitFor(const std::string& name, double timeout_s);

 private:
  struct Child {
    std::string name;
    std::string log_path;  // "" when it inherited this process's output
    pid_t pid = -1;
    bool done = false;
    int status = 0;
  };
  pid_t pgid_ = 0;
  std::vector<Child> children_;
};

}  // namespace gradsync
