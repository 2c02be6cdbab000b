#include "worker/job_link.h"

#include "common/config/cluster.h"
#include "common/net/control/node.h"

#include <cstdio>
#include <thread>

#include "allreduce/plan/algorithm.h"
#include "common/base/check.h"
#include "common/base/host_port.h"

namespace gradsync {

JobLink::~JobLink() {
  // The ring goes before the scheduler's client (members die in reverse): its callback first.
  if (scheduler) {
    scheduler->set_on_dead(nullptr);
    scheduler->set_on_unhealthy(nullptr);
  }
}

void JobLink::Finished(const Status& s) {
  if (!scheduler) return;
  scheduler->Finished(s);
  scheduler->Flush(2.0);
}

namespace {

// JobLink::oversubscribed, and a line when it turns --overlap's default off; nothing when
// --overlap is set (all-reduce: set alike on every rank, the job fingerprint has it). All-reduce:
// one all-reduce of every rank's own finding, so that every rank decides alike.
Status AgreeOnCores(const config::TrainConfig& c, JobLink* job) {
  if (c.has_overlap()) return OkStatus();
  const unsigned cores = std::thread::hardware_concurrency();
  int on_host = 0;
  bool first_on_host = false;
  if (job->ring) {
    on_host = job->ring->topology().host_ranks();
    first_on_host = job->rank == 0;
    float any = job->ring->topology().oversubscribed() ? 1.0f : 0.0f;
    if (job->ring->size() > 1) {
      if (Status s = job->ring->AllReduce(FloatSpan(&any, 1), ReduceOp::kSum); !s.ok()) {
        job->Finished(s);
        return s.WithContext("sharing whether a host runs more workers than cores");
      }
    }
    job->oversubscribed = any > 0;
  } else {
    on_host = WorkersOnHost(job->table, job->rank);
    job->oversubscribed = HostOversubscribed(job->table, job->rank, cores);
    first_on_host = on_host > 0;  // and no lower rank on this host
    for (int r = 0; first_on_host && r < job->rank; ++r) {
      first_on_host = job->table.workers(r).host() != job->table.workers(job->rank).host();
    }
  }
  if (job->oversubscribed && first_on_host) {
    std::printf("worker %d: overlap off: %s (here %d workers, %u cores); --overlap=true keeps it on\n", job->rank,
                job->ring ? "a host of the job runs more workers than it has cores" : "this host runs more workers than it has cores",
                on_host, cores);
    std::fflush(stdout);
  }
  return OkStatus();
}

}  // namespace

Status JoinJob(const config::TrainConfig& c, const config::WorkerProcess& p, JobLink* job) {
  const config::Mode mode = c.mode();
  if (p.has_auth_dir()) {
    auto a = EnableCurveFromDir(job->ctx, p.auth_dir(), KeyRole::kWorker);
    if (!a.ok()) return InvalidArgumentError("--auth-dir: " + a.status().message());
    job->auth = std::move(a).value();
  }
  if (mode == config::ALLREDUCE) {
    CollectiveOptions co;
    co.timeout_s = c.collective_timeout();
    co.algorithm = *ParseAllReduceAlgo(c.allreduce_algo());  // Validate() checked it
    co.shm = c.allreduce_shm();
    co.shm_wait = WaitPolicyOf(c);
    // --auth-dir authenticates the ring as well (its key comes from the same directory);
    // --ring-encrypt encrypts it too.
    RingSecurity security;
    if (p.has_auth_dir()) {
      auto s = RingSecurityFromAuthDir(p.auth_dir(), c.ring_encrypt());
      if (!s.ok()) return InvalidArgumentError("--auth-dir: " + s.status().message());
      security = *s;
    }
    ASSIGN_OR_RETURN(job->ring, RingCollective::Listen(p.bind(), co, security));
  }
  if (!JoinsJob(mode)) return OkStatus();
  std::string host;
  uint16_t port = 0;
  const Status parsed = ParseHostPort(p.scheduler(), &host, &port);
  GRADSYNC_CHECK(parsed.ok()) << "Validate() accepted --scheduler=" << p.scheduler() << ": " << parsed;
  SchedulerClientOptions so;
  so.scheduler_endpoint = "tcp://" + host + ":" + std::to_string(port);
  so.self.set_role(wire::WORKER);
  so.self.set_host(p.host());
  if (job->ring) so.self.set_port(job->ring->port());
  so.self.set_requested_rank(p.rank());  // -1: the scheduler assigns one (TakeLauncherRank ran)
  so.mode = ModeName(mode);
  // ssp without --staleness: -1 asks for the job's bound (the scheduler has it from the servers).
  so.staleness = mode == config::SSP ? (c.has_staleness() ? c.staleness() : -1) : 0;
  so.heartbeat_interval_s = p.heartbeat_interval();
  so.scheduler_timeout_s = p.heartbeat_timeout();
  so.job_fingerprint = JobFingerprint(c);  // the settings that must agree between the workers
  job->scheduler = std::make_unique<SchedulerClient>(job->ctx, so);
  ASSIGN_OR_RETURN(job->table, job->scheduler->Register(300.0));
  job->rank = job->scheduler->rank();
  if (job->ring) {
    std::vector<std::string> peers;
    for (const auto& w : job->table.workers()) peers.push_back(w.host() + ":" + std::to_string(w.port()));
    if (Status s = job->ring->Connect(job->rank, peers, 120); !s.ok()) {
      job->Finished(s);
      return s;
    }
    if (job->ring->size() > 1) {
      // A worker the scheduler declares dead never reaches another collective: the ring's waits
      // end now, naming it, not after --collective-timeout.
      RingCollective* ring = job->ring.get();
      job->scheduler->set_on_dead([ring](const wire::NodeInfo& n) {
        if (n.role() != wire::WORKER) return;
        ring->Cancel(NodeName(n) + " was declared dead by the scheduler (it sent nothing for the heartbeat "
                     "timeout); the all-reduce cannot go on without it");
      });
      // Nor does a worker outlive its job: the scheduler lost, this worker declared dead, or the
      // job failed.
      job->scheduler->set_on_unhealthy([ring](const Status& s) { ring->Cancel(s.message()); });
    }
    if (job->rank == 0 && job->ring->size() > 1) {
      const RingCollective& ring = *job->ring;
      if (!ring.shared_memory()) {
        std::printf("worker 0: all-reduce over TCP between %d workers on %d host(s); shared memory: %s\n", ring.size(),
                    ring.topology().host_count(), ring.shared_memory_off_reason().c_str());
      } else if (ring.topology().host_count() == 1) {
        std::printf("worker 0: all-reduce through shared memory between the %d workers of this host\n", ring.size());
      } else {
        std::printf("worker 0: hierarchical all-reduce: %d workers on %d hosts, shared memory within each host, a ring of "
                    "one leader per host over TCP\n", ring.size(), ring.topology().host_count());
      }
      std::fflush(stdout);
    }
  }
  return AgreeOnCores(c, job);
}

int WorkersOnHost(const wire::ClusterTable& table, int rank) {
  if (rank < 0 || rank >= table.workers_size()) return 0;
  const std::string& host = table.workers(rank).host();
  int n = 0;
  for (const auto& w : table.workers()) n += w.host() == host ? 1 : 0;
  return n;
}

bool HostOversubscribed(const wire::ClusterTable& table, int rank, unsigned cores) {
  return Oversubscribed(static_cast<size_t>(WorkersOnHost(table, rank)), cores);
}

}  // namespace gradsync
