// What the --processes modes of gradsync-bench-ps share (ps_bench_procs.cc, ps_bench_rows.cc):
// a child's role arguments, a bench worker joining the parent's job, and the parent's side: its
// children (spawned with their stdout captured, read and reaped under deadlines, every one
// killed at the end) and a job of them (the scheduler, the shards, the workers).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/net/control/client/scheduler_client.h"
#include "common/net/transport.h"
#include "gradsync.pb.h"
#include "worker/ps/client/ps_client.h"

namespace gradsync::psbench {

using Clock = std::chrono::steady_clock;

// steady_clock in ns (CLOCK_MONOTONIC: one clock for every process of the machine).
int64_t NowNs();
// "gradsync-bench-ps: error: WHAT" on stderr, exit 1.
[[noreturn]] void Die(const std::string& what);
// --key=value arguments of a role; a missing one is Die.
std::map<std::string, std::string> RoleArgs(int argc, char** argv);
int64_t Int(const std::map<std::string, std::string>& m, const std::string& k);
std::string Str(const std::map<std::string, std::string>& m, const std::string& k);

// A bench worker's job: registered with the parent's scheduler, connected to every shard, the
// shards initialized by worker 0 with `job` (all zeros) and the "init" barrier passed.
struct BenchWorker {
  TransportContext ctx{2};
  std::unique_ptr<SchedulerClient> client;
  std::unique_ptr<PsClient> ps;
};

// Joins the job of a role's arguments (--scheduler, --rank) with `layout`; worker 0 initializes
// the shards with `job` (its parameters all zeros). After the "init" barrier. row_message_bytes:
// PsClient::Create's (a job with tables: the largest message of rows to one shard).
std::unique_ptr<BenchWorker> JoinBenchJob(const std::map<std::string, std::string>& a, std::vector<TensorInfo> layout,
                                          const wire::JobConfig& job, int64_t row_message_bytes = 0);

// The shared-memory lane of every one of `servers` shards, or Die.
void AttachEveryLane(PsClient& ps, int servers);
// A bench worker's end: tells the scheduler it finished, then prints `report` (what the parent
// reads) on stdout. Returns 0, the role's exit status.
int Leave(SchedulerClient& client, const std::string& report);

// The parent: children, bounded waits, every child killed at the end.

struct Child {
  pid_t pid = -1;
  int out = -1;  // stdout pipe, -1 when not captured or at EOF
  int in = -1;   // stdin pipe (Spawn with feed), -1 otherwise
  std::string text;
  std::string name;
  int status = -1;  // waitpid status once reaped
};

class Children {
 public:
  ~Children() { KillAll(); }

  // Starts args[0] with args; its stdout comes back through a pipe when `capture`, else goes to
  // /dev/null. stderr is inherited. It dies with this process (PR_SET_PDEATHSIG).
  // With `feed` its stdin is a pipe the parent writes lines to (Say).
  Child* Spawn(const std::vector<std::string>& args, bool capture, const std::string& name, bool feed = false) {
    int p[2] = {-1, -1}, q[2] = {-1, -1};
    if (::pipe2(p, O_CLOEXEC) != 0) Die("pipe");
    if (feed && ::pipe2(q, O_CLOEXEC) != 0) Die("pipe");
    const pid_t parent = ::getpid();
    std::vector<char*> argv;
    for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) Die("fork");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      if (feed) ::dup2(q[0], 0);
      if (capture) {
        ::dup2(p[1], 1);
      } else {
        const int null = ::open("/dev/null", O_WRONLY);
        ::dup2(null, 1);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(p[1]);
    auto c = std::make_unique<Child>();
    c->pid = pid;
    c->name = name;
    if (feed) {
      ::close(q[0]);
      c->in = q[1];
    }
    if (capture) {
      c->out = p[0];
    } else {
      ::close(p[0]);
    }
    all_.push_back(std::move(c));
    return all_.back().get();
  }

  // Writes one line to a fed child's stdin. False when it is gone (SIGPIPE is ignored).
  static bool Say(Child* c, const std::string& line) {
    const std::string text = line + "\n";
    size_t done = 0;
    while (c->in >= 0 && done < text.size()) {
      const ssize_t n = ::write(c->in, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return c->in >= 0;
  }

  // Until every one of `kids` has printed at least `lines` lines, or the deadline (false).
  static bool ReadLines(const std::vector<Child*>& kids, int lines, Clock::time_point deadline) {
    for (Child* c : kids) {
      if (!Read({c}, deadline, c, lines)) return false;
    }
    return true;
  }

  // Reads the children's stdout until each is at EOF (and at least `min_lines` lines of `until`
  // arrived, when given) or the deadline. False at the deadline.
  static bool Read(const std::vector<Child*>& kids, Clock::time_point deadline, Child* until = nullptr, int min_lines = 0) {
    for (;;) {
      if (until && std::count(until->text.begin(), until->text.end(), '\n') >= min_lines) return true;
      std::vector<pollfd> fds;
      std::vector<Child*> who;
      for (Child* c : kids) {
        if (c->out >= 0) {
          fds.push_back({c->out, POLLIN, 0});
          who.push_back(c);
        }
      }
      if (fds.empty()) return until == nullptr;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      if (::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left, 1000))) < 0 && errno != EINTR) return false;
      for (size_t i = 0; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[65536];
        const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
        if (n > 0) {
          who[i]->text.append(buf, static_cast<size_t>(n));
        } else if (n == 0 || errno != EINTR) {
          ::close(who[i]->out);
          who[i]->out = -1;
        }
      }
    }
  }

  // Waits for the children to exit until the deadline; kills the rest. True when every one
  // exited by itself with status 0.
  static bool Reap(const std::vector<Child*>& kids, Clock::time_point deadline) {
    bool ok = true;
    for (Child* c : kids) {
      while (c->pid > 0) {
        int st = 0;
        const pid_t r = ::waitpid(c->pid, &st, WNOHANG);
        if (r == c->pid) {
          c->status = st;
          c->pid = -1;
          if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            std::fprintf(stderr, "gradsync-bench-ps: %s exited with status %d\n", c->name.c_str(),
                         WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
            ok = false;
          }
        } else if (Clock::now() > deadline) {
          std::fprintf(stderr, "gradsync-bench-ps: %s did not exit in time: killed\n", c->name.c_str());
          ::kill(c->pid, SIGKILL);
          ::waitpid(c->pid, &st, 0);
          c->pid = -1;
          ok = false;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
    }
    return ok;
  }

  void KillAll() {
    for (auto& c : all_) {
      if (c->pid > 0) {
        ::kill(c->pid, SIGKILL);
        int st = 0;
        ::waitpid(c->pid, &st, 0);
        c->pid = -1;
      }
      if (c->out >= 0) {
        ::close(c->out);
        c->out = -1;
      }
      if (c->in >= 0) {
        ::close(c->in);
        c->in = -1;
      }
    }
  }

 private:
  std::vector<std::unique_ptr<Child>> all_;
};

// The folder of this binary (gradsync-server lies beside it).
std::string SelfDir();

// A job as processes: the scheduler, `servers` asp shards and `workers` worker processes (this
// binary with --role=worker, the rank and `worker_args`; stdin fed by the parent with `feed`).
struct Job {
  std::vector<Child*> nodes;    // the scheduler and the shards
  std::vector<Child*> workers;  // their stdout captured
};

// Starts a job's processes in `kids`. False when the scheduler did not come up.
bool StartJob(Children& kids, int servers, int workers, const std::vector<std::string>& worker_args, bool feed, Job* job);
// Reads the workers' output to the end (600 s) and waits for every process to exit (30 s). False
// when one failed or a deadline passed (the caller's ~Children kills what is left).
bool FinishJob(const Job& job, const std::string& what);
// A whole job; the workers' stdout in *texts.
bool RunJobProcs(int servers, int workers, const std::vector<std::string>& worker_args, const std::string& what,
                 std::vector<std::string>* texts);

}  // namespace gradsync::psbench
