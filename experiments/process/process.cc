#include "experiments/process/process.h"
#include "common/base/clock.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>

extern char** environ;

namespace gradsync {

std::string JoinArgs(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

std::string CommandLine(const ChildSpec& spec) {
  std::string s;
  for (const auto& [name, value] : spec.env) s += name + "=" + value + " ";
  return s + JoinArgs(spec.argv);
}

bool OnPath(const std::string& tool) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(std::string(path ? path : "/usr/bin:/bin") + ":/usr/sbin:/sbin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (!dir.empty() && ::access((dir + "/" + tool).c_str(), X_OK) == 0) return true;
  }
  return false;
}

Status RunCommand(const std::vector<std::string>& argv, double timeout_s) {
  return CommandOutput(argv, timeout_s).status();
}

Result<std::string> CommandOutput(const std::vector<std::string>& argv, double timeout_s) {
  char err_path[] = "/tmp/gradsync-cmd-XXXXXX";
  char out_path[] = "/tmp/gradsync-out-XXXXXX";
  for (char* path : {err_path, out_path}) {
    const int fd = ::mkstemp(path);
    if (fd < 0) return UnavailableError(std::string("mkstemp: ") + std::strerror(errno));
    ::close(fd);
  }
  struct Unlink {
    const char* a;
    const char* b;
    ~Unlink() {
      ::unlink(a);
      ::unlink(b);
    }
  } unlink_both{err_path, out_path};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path, O_WRONLY | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path, O_WRONLY | O_TRUNC, 0600);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return UnavailableError("cannot run " + argv[0] + ": " + std::strerror(rc));
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (::waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return DeadlineExceededError("'" + JoinArgs(argv) + "' did not finish within " + SecondsText(timeout_s) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::ifstream f(err_path);
  std::stringstream err;
  err << f.rdbuf();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    std::ifstream o(out_path);
    std::stringstream out;
    out << o.rdbuf();
    return out.str();
  }
  std::string msg = err.str();
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  for (char& ch : msg)
    if (ch == '\n') ch = ' ';
  return UnavailableError("'" + JoinArgs(argv) + "' failed: " + (msg.empty() ? "exit " + std::to_string(WEXITSTATUS(status)) : msg));
}

ProcessGroup::~ProcessGroup() { KillAll(); }

Status ProcessGroup::Spawn(const ChildSpec& spec) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!spec.log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, spec.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, pgid_);  // 0 for the first child: it leads the new group
  std::vector<char*> args;
  for (const auto& a : spec.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // This process's environment, less the variables spec.env sets, then spec.env.
  std::vector<std::string> own;
  for (const auto& [name, value] : spec.env) own.push_back(name + "=" + value);
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) {
    const std::string_view kv(*e);
    bool replaced = false;
    for (const auto& [name, value] : spec.env) replaced = replaced || (kv.starts_with(name) && kv.size() > name.size() && kv[name.size()] == '=');
    if (!replaced) env.push_back(*e);
  }
  for (auto& e : own) env.push_back(e.data());
  env.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return UnavailableError(spec.name + ": cannot run '" + spec.argv[0] + "': " + std::strerror(rc));
  if (pgid_ == 0) pgid_ = pid;
  children_.push_back({spec.name, spec.log_path, pid});
  return OkStatus();
}

void ProcessGroup::KillAll() {
  bool any = false;
  for (auto& c : children_) any = any || !c.done;
  if (!any || pgid_ == 0) return;
  kill(-pgid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < deadline) {
    bool left = false;
    for (auto& c : children_) {
      if (c.done) continue;
      if (waitpid(c.pid, &c.status, WNOHANG) == c.pid) c.done = true;
      else left = true;
    }
    if (!left) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-pgid_, SIGKILL);
  for (auto& c : children_) {
    if (!c.done) {
      waitpid(c.pid, &c.status, 0);
      c.done = true;
    }
  }
}

Status ProcessGroup::Signal(const std::string& name, int sig) {
  for (auto& c : children_) {
    if (c.name != name) continue;
    if (c.done) return FailedPreconditionError(name + " has already exited");
    if (kill(c.pid, sig) != 0) return UnavailableError("kill " + name + ": " + std::strerror(errno));
    return OkStatus();
  }
  return NotFoundError("no child named " + name);
}

pid_t ProcessGroup::Pid(const std::string& name) const {
  for (const auto& c : children_)
    if (c.name == name && !c.done) return c.pid;
  return -1;
}

Result<int> ProcessGroup::WaitFor(const std::string& name, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (auto& c : children_) {
    if (c.name != name) continue;
    while (!c.done) {
      if (waitpid(c.pid, &c.status, WNOHANG) == c.pid) {
        c.done = true;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) return DeadlineExceededError(name + " is still running");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return WIFEXITED(c.status) ? WEXITSTATUS(c.status) : -WTERMSIG(c.status);
  }
  return NotFoundError("no child named " + name);
}

Status ProcessGroup::WaitAll(double timeout_s, const volatile bool* interrupted, const std::function<void()>& on_tick) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  auto next_tick = std::chrono::steady_clock::now();
  while (true) {
    if (on_tick && std::chrono::steady_clock::now() >= next_tick) {
      on_tick();
      next_tick = std::chrono::steady_clock::now() + std::chrono::milliseconds(250);
    }
    bool left = false;
    for (auto& c : children_) {
      if (c.done) continue;
      pid_t r = waitpid(c.pid, &c.status, WNOHANG);
      if (r != c.pid) {
        left = true;
        continue;
      }
      c.done = true;
      if (!WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0) {
        std::string how = WIFEXITED(c.status) ? "exited with code " + std::to_string(WEXITSTATUS(c.status))
                                              : std::string("was killed by signal ") + strsignal(WTERMSIG(c.status));
        KillAll();
        // Its own last words, which went to its log.
        std::string last;
        if (!c.log_path.empty()) {
          std::ifstream log(c.log_path);
          for (std::string line; std::getline(log, line);) {
            if (!line.empty()) last = line;
          }
        }
        return AbortedError(c.name + " " + how + (last.empty() ? "" : ": " + last.substr(0, 300)));
      }
    }
    if (!left) return OkStatus();
    if (interrupted && *interrupted) {
      KillAll();
      return AbortedError("interrupted");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      KillAll();
      return DeadlineExceededError("the job did not finish within " + SecondsText(timeout_s) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace gradsync
