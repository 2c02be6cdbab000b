#include "bench/ps_bench_jobs.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace gradsync::psbench {

int64_t NowNs() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "gradsync-bench-ps: error: %s\n", what.c_str());
  std::exit(1);
}

std::map<std::string, std::string> RoleArgs(int argc, char** argv) {
  std::map<std::string, std::string> m;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const auto eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos) Die("bad role argument '" + a + "'");
    m[a.substr(2, eq - 2)] = a.substr(eq + 1);
  }
  return m;
}

int64_t Int(const std::map<std::string, std::string>& m, const std::string& k) {
  auto it = m.find(k);
  if (it == m.end()) Die("role argument --" + k + " missing");
  return std::stoll(it->second);
}

std::string Str(const std::map<std::string, std::string>& m, const std::string& k) {
  auto it = m.find(k);
  if (it == m.end()) Die("role argument --" + k + " missing");
  return it->second;
}

std::unique_ptr<BenchWorker> JoinBenchJob(const std::map<std::string, std::string>& a, std::vector<TensorInfo> layout,
                                          const wire::JobConfig& job, int64_t row_message_bytes) {
  const int w = static_cast<int>(Int(a, "rank"));
  auto b = std::make_unique<BenchWorker>();
  SchedulerClientOptions sc;
  sc.scheduler_endpoint = Str(a, "scheduler");
  sc.self.set_role(wire::WORKER);
  sc.self.set_host("127.0.0.1");
  sc.self.set_requested_rank(w);
  sc.mode = "asp";
  b->client = std::make_unique<SchedulerClient>(b->ctx, sc);
  auto table = b->client->Register(60);
  if (!table.ok()) Die("worker register: " + table.status().message());
  auto created = PsClient::Create(b->ctx, *table, w, std::move(layout), b->client.get(), row_message_bytes);
  if (!created.ok()) Die("worker PsClient: " + created.status().message());
  b->ps = std::move(created).value();
  if (w == 0) {
    const std::vector<float> zeros(job.num_params(), 0.0f);
    if (Status s = b->ps->Init(job, zeros, 60); !s.ok()) Die("worker init: " + s.message());
  }
  if (Status s = b->client->Barrier("init", "workers", 60); !s.ok()) Die("worker barrier: " + s.message());
  return b;
}

void AttachEveryLane(PsClient& ps, int servers) {
  auto lanes = ps.AttachSharedMemory(60);
  if (!lanes.ok()) Die("shared memory: " + lanes.status().message());
  if (*lanes != servers) Die("shared memory: " + std::to_string(*lanes) + " of " + std::to_string(servers) + " shards took a lane");
}

int Leave(SchedulerClient& client, const std::string& report) {
  client.Finished(OkStatus());
  client.Flush(1);
  std::fputs(report.c_str(), stdout);
  std::fflush(stdout);
  return 0;
}

std::string SelfDir() {
  return std::filesystem::canonical("/proc/self/exe").parent_path().string();
}

// Starts a job's processes in `kids`. False when the scheduler did not come up.
bool StartJob(Children& kids, int servers, int workers, const std::vector<std::string>& worker_args, bool feed, Job* job) {
  const std::string dir = SelfDir();
  const std::string server_bin = dir + "/gradsync-server", self = dir + "/gradsync-bench-ps";
  char tmpl[] = "/tmp/gradsync-bench-ps-XXXXXX";
  if (!::mkdtemp(tmpl)) Die("mkdtemp");
  const std::string tmp = tmpl;
  const std::string port_file = tmp + "/port";
  Child* sched = kids.Spawn({server_bin, "--role=scheduler", "--mode=asp", "--num-servers=" + std::to_string(servers),
                             "--num-workers=" + std::to_string(workers), "--port-file=" + port_file, "--register-timeout=60"},
                            false, "scheduler");
  std::string port;
  const auto start_deadline = Clock::now() + std::chrono::seconds(30);
  while (port.empty()) {
    std::ifstream f(port_file);
    if (f >> port) break;
    int st = 0;
    if (::waitpid(sched->pid, &st, WNOHANG) == sched->pid) {
      sched->pid = -1;
      std::fprintf(stderr, "gradsync-bench-ps: the scheduler exited before it wrote its port\n");
      std::filesystem::remove_all(tmp);
      return false;
    }
    if (Clock::now() > start_deadline) {
      std::fprintf(stderr, "gradsync-bench-ps: no scheduler port after 30 s\n");
      std::filesystem::remove_all(tmp);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::filesystem::remove_all(tmp);
  job->nodes = {sched};
  job->workers.clear();
  for (int i = 0; i < servers; ++i) {
    job->nodes.push_back(kids.Spawn({server_bin, "--role=server", "--mode=asp", "--scheduler=127.0.0.1:" + port,
                                     "--rank=" + std::to_string(i), "--register-timeout=60"},
                                    false, "server " + std::to_string(i)));
  }
  for (int w = 0; w < workers; ++w) {
    std::vector<std::string> args = {self, "--role=worker", "--scheduler=tcp://127.0.0.1:" + port,
                                     "--rank=" + std::to_string(w), "--workers=" + std::to_string(workers)};
    args.insert(args.end(), worker_args.begin(), worker_args.end());
    job->workers.push_back(kids.Spawn(args, true, "worker " + std::to_string(w), feed));
  }
  return true;
}

// Reads the workers' output to the end (600 s) and waits for every process to exit (30 s). False
// when one failed or a deadline passed (the caller's ~Children kills what is left).
bool FinishJob(const Job& job, const std::string& what) {
  if (!Children::Read(job.workers, Clock::now() + std::chrono::seconds(600))) {
    std::fprintf(stderr, "gradsync-bench-ps: %s: workers did not finish in 600 s\n", what.c_str());
    return false;
  }
  bool ok = Children::Reap(job.workers, Clock::now() + std::chrono::seconds(30));
  ok &= Children::Reap(job.nodes, Clock::now() + std::chrono::seconds(30));
  return ok;
}

// A whole job; the workers' stdout in *texts.
bool RunJobProcs(int servers, int workers, const std::vector<std::string>& worker_args, const std::string& what,
                 std::vector<std::string>* texts) {
  Children kids;
  Job job;
  if (!StartJob(kids, servers, workers, worker_args, false, &job)) return false;
  if (!FinishJob(job, std::to_string(servers) + "x" + std::to_string(workers) + " " + what)) return false;
  texts->clear();
  for (Child* c : job.workers) texts->push_back(c->text);
  return true;
}

}  // namespace gradsync::psbench
