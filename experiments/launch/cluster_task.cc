#include "experiments/launch/cluster_task.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <boost/asio.hpp>
#include <filesystem>
#include <iostream>

#include "common/base/host_port.h"
#include "experiments/launch/file_relay.h"
#include "experiments/process/process.h"

namespace gradsync {
namespace {

namespace fs = std::filesystem;
namespace asio = boost::asio;
using Address = asio::ip::address_v4;

Result<std::string> SlurmFirstHost(const EnvLookup& env) {
  const char* list = env("SLURM_STEP_ID") ? env("SLURM_STEP_NODELIST") : nullptr;
  for (const char* name : {"SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (!list) list = env(name);
  }
  if (!list || !*list) return NotFoundError("not in a Slurm allocation");
  auto out = CommandOutput({"scontrol", "show", "hostnames", list});
  if (!out.ok()) return out.status().WithContext("the first host of the Slurm allocation");
  const std::string first = out->substr(0, out->find('\n'));
  if (first.empty()) return UnavailableError("`scontrol show hostnames " + std::string(list) + "` named no host");
  return first;
}

Result<Address> ResolveIPv4(const std::string& host) {
  asio::io_context io;
  boost::system::error_code ec;
  const auto found = asio::ip::udp::resolver(io).resolve(asio::ip::udp::v4(), host, "", ec);
  if (ec || found.empty()) return UnavailableError("cannot resolve '" + host + "': " + ec.message());
  return found.begin()->endpoint().address().to_v4();
}

// The source address this host uses toward `to` (a UDP socket's connect sends nothing).
Result<Address> RouteSource(const Address& to, int port) {
  asio::io_context io;
  asio::ip::udp::socket socket(io);
  boost::system::error_code ec;
  socket.open(asio::ip::udp::v4(), ec);
  if (!ec) socket.connect({to, static_cast<uint16_t>(port)}, ec);
  const auto self = ec ? asio::ip::udp::endpoint() : socket.local_endpoint(ec);
  if (ec) return UnavailableError("no route to " + to.to_string() + ": " + ec.message());
  return self.address().to_v4();
}

// Whether `a` is one of this host's addresses (only those can be bound).
bool IsLocalAddress(const Address& a) {
  asio::io_context io;
  asio::ip::udp::socket socket(io);
  boost::system::error_code ec;
  socket.open(asio::ip::udp::v4(), ec);
  if (!ec) socket.bind({a, 0}, ec);
  return !ec;
}

// The IPv4 address of interface `name`, or of the first interface that is up and not loopback
// (name empty).
Result<Address> InterfaceAddress(const std::string& name) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return UnavailableError(ErrnoMessage("getifaddrs"));
  std::optional<Address> found;
  std::string names;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    names += std::string(names.empty() ? "" : ", ") + i->ifa_name;
    const Address a(ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr));
    const bool match = name.empty() ? (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK) && !a.is_loopback()
                                    : name == i->ifa_name;
    if (match && !found) found = a;
  }
  ::freeifaddrs(list);
  if (found) return *found;
  if (name.empty()) return NotFoundError("no interface but loopback has an IPv4 address");
  return NotFoundError("--iface=" + name + ": no such interface with an IPv4 address (this host's: " + names + ")");
}

// r, or its error with `context` before it.
Result<Address> Within(Result<Address> r, const std::string& context) {
  if (!r.ok()) return r.status().WithContext(context);
  return r;
}

}  // namespace

Result<ClusterPlace> PlaceTask(const ClusterTaskOptions& o, const EnvLookup& env) {
  ASSIGN_OR_RETURN(std::optional<LauncherRank> launched, RankFromLaunchers(env));
  if (!launched) {
    return FailedPreconditionError(
        "no launcher gave this process a rank: start every task with srun, mpirun / mpiexec or torchrun "
        "(SLURM_PROCID in a job step, OMPI_COMM_WORLD_RANK, PMI_RANK, or RANK and WORLD_SIZE)");
  }
  ClusterPlace p;
  p.launcher = *launched;
  if (o.slurm_only && p.launcher.launcher != "Slurm") {
    return FailedPreconditionError("--slurm: this task's rank is " + p.launcher.Describe() +
                                   ", not Slurm's: start it with srun, or use --cluster");
  }
  const int tasks = p.launcher.size;
  if (tasks < 1) return FailedPreconditionError(p.launcher.Describe() + ": the launcher gave no world size");
  p.servers = o.job.mode == config::ALLREDUCE ? 0 : o.job.num_servers;
  p.workers = o.job.num_workers >= 0 ? o.job.num_workers : tasks - p.servers;
  if (p.servers + p.workers != tasks || p.workers < 1) {
    return InvalidArgumentError(p.launcher.launcher + " started " + std::to_string(tasks) + " task(s), but the job has " +
                                std::to_string(p.servers) + " server(s) and " +
                                (o.job.num_workers >= 0 ? std::to_string(p.workers) : std::string("no")) +
                                " worker(s): start servers + workers tasks (one per process)");
  }
  p.server = p.launcher.rank < p.servers;
  p.role_rank = p.server ? p.launcher.rank : p.launcher.rank - p.servers;
  if (!o.scheduler.empty()) {
    uint16_t port = 0;
    RETURN_IF_ERROR(ParseHostPort(o.scheduler, &p.scheduler_host, &port).WithContext("--scheduler"));
    p.scheduler_port = port;
  } else if (const char* addr = env("MASTER_ADDR"); addr && *addr) {
    p.scheduler_host = addr;
    ASSIGN_OR_RETURN(const long master_port, EnvNumber(env, "MASTER_PORT", 65534));
    if (o.port == 0 && master_port < 1) {
      return InvalidArgumentError("MASTER_ADDR is set but MASTER_PORT is not (give --port or --scheduler)");
    }
    p.scheduler_port = o.port ? o.port : static_cast<int>(master_port) + 1;
  } else {
    auto first = SlurmFirstHost(env);
    if (first.status().code() == StatusCode::kNotFound) {
      return FailedPreconditionError("no scheduler address: give --scheduler=HOST:PORT (HOST: where task 0 runs), or set "
                                     "MASTER_ADDR and MASTER_PORT, or run inside a Slurm allocation");
    }
    if (!first.ok()) return first.status();
    p.scheduler_host = *first;
    // One port per job step, below the kernel's ephemeral range (32768-60999 by default).
    ASSIGN_OR_RETURN(const long job, EnvNumber(env, "SLURM_JOB_ID", 1L << 40));
    ASSIGN_OR_RETURN(const long step, EnvNumber(env, "SLURM_STEP_ID", 1L << 40));
    p.scheduler_port = o.port ? o.port : static_cast<int>(10000 + (std::max(0L, job) * 37 + std::max(0L, step)) % 20000);
  }
  if (p.scheduler_port < 1 || p.scheduler_port > 65535) return InvalidArgumentError("the scheduler's port is out of range");
  ASSIGN_OR_RETURN(const long nodes, EnvNumber(env, "SLURM_STEP_NUM_NODES", 1L << 20));
  p.spans_hosts = (p.launcher.local_size >= 0 && p.launcher.local_size < tasks) || (p.launcher.launcher == "Slurm" && nodes > 1);
  return p;
}

Status RunClusterTask(const ClusterTaskOptions& o, const EnvLookup& env, const volatile bool* interrupted) {
  ASSIGN_OR_RETURN(ClusterPlace p, PlaceTask(o, env));
  const int task = p.launcher.rank;
  const std::string who = "task " + std::to_string(task) + " of " + std::to_string(p.launcher.size);
  ASSIGN_OR_RETURN(Address scheduler_ip, Within(ResolveIPv4(p.scheduler_host), who + ": the scheduler's host"));
  // The address this task advertises: the one its host reaches the scheduler from. A host whose
  // own name resolves to loopback (Debian's 127.0.1.1) would advertise an address no other host
  // reaches, so a job across hosts takes an external interface's instead.
  Address self;
  if (!o.iface.empty()) {
    ASSIGN_OR_RETURN(self, InterfaceAddress(o.iface));
  } else {
    ASSIGN_OR_RETURN(self, Within(RouteSource(scheduler_ip, p.scheduler_port), who));
    if (self.is_loopback() && p.spans_hosts) {
      ASSIGN_OR_RETURN(self, Within(InterfaceAddress(""), who + ": the job spans hosts, but " + p.scheduler_host +
                                                                 " resolves to loopback here"));
      std::cerr << ("gradsync-launch: " + who + ": " + p.scheduler_host + " resolves to loopback here; advertising " +
                    self.to_string() + " (--iface picks another)\n")
                << std::flush;
    }
  }
  const std::string address = self.to_string();
  LaunchOptions job = o.job;
  job.num_servers = p.servers;
  job.num_workers = p.workers;
  if (o.emit_files) job.out_dir = o.job.out_dir + "/task-" + std::to_string(task);
  if (!o.job.dry_run) {
    std::error_code ec;
    fs::create_directories(job.out_dir + "/logs", ec);
    if (ec) return InvalidArgumentError(job.out_dir + ": cannot create: " + ec.message());
  }
  const std::string endpoint = p.scheduler_host + ":" + std::to_string(p.scheduler_port);
  const std::string role = (p.server ? "server " : "worker ") + std::to_string(p.role_rank);
  std::vector<ChildSpec> specs;
  if (task == 0) {
    if (!IsLocalAddress(scheduler_ip)) {
      return FailedPreconditionError(who + " runs the scheduler, but its address " + p.scheduler_host + " (" + scheduler_ip.to_string() +
                                     ") is not one of this host's: give --scheduler=HOST:PORT with task 0's host");
    }
    // Every interface: the scheduler's name may resolve to loopback here and to a real address
    // elsewhere.
    specs.push_back(SchedulerSpec(job, "0.0.0.0", {"--port=" + std::to_string(p.scheduler_port)}));
  }
  const std::string log = o.emit_files ? job.out_dir + "/logs/" + (p.server ? "server-" : "worker-") +
                                             std::to_string(p.role_rank) + ".log"
                                       : "";
  specs.push_back(p.server ? ServerSpec(job, p.role_rank, endpoint, address, log)
                           : WorkerSpec(job, p.role_rank, endpoint, address, log));
  // One write: the launcher merges its tasks' output, and a line in pieces could be cut apart.
  std::cerr << ("gradsync-launch: " + who + " (" + p.launcher.Describe() + "): " + role + " at " + address +
                (task == 0 ? " and the scheduler" : "") + "; scheduler " + endpoint + " (" + scheduler_ip.to_string() + ")\n")
            << std::flush;
  if (o.job.dry_run) {
    for (const auto& c : specs) std::cout << CommandLine(c) << "\n";
    return OkStatus();
  }
  ProcessGroup group;
  Status s = OkStatus();
  for (const auto& c : specs) {
    if (s.ok()) s = group.Spawn(c);
  }
  if (s.ok()) s = group.WaitAll(o.job.timeout_s, interrupted);
  if (!s.ok()) s = s.WithContext(who + " (" + role + (task == 0 ? " and the scheduler" : "") + ")");
  if (o.emit_files) {
    Status e = EmitFiles(job.out_dir, task, std::cout);
    std::error_code ec;
    fs::remove_all(job.out_dir, ec);
    fs::remove(o.job.out_dir, ec);  // only when no other task of this node still has its folder there
    if (s.ok()) s = e;
  }
  return s;
}

}  // namespace gradsync
