#include "common/net/control/scheduler_client.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/net/control/node.h"

namespace gradsync {
namespace {
using Clock = std::chrono::steady_clock;
std::chrono::duration<double> Seconds(double s) { return std::chrono::duration<double>(s); }
}  // namespace

SchedulerClient::SchedulerClient(TransportContext& ctx, SchedulerClientOptions options)
    : options_(std::move(options)), ctx_(ctx) {
  thread_ = std::jthread([this](std::stop_token st) { Loop(st); });
}

SchedulerClient::~SchedulerClient() {
  thread_.request_stop();
  cv_.notify_all();
}

void SchedulerClient::Enqueue(ControlMessage c) {
  std::lock_guard lock(mu_);
  c.sender_role = options_.self.role();
  c.sender_rank = rank_;
  outbox_.push_back(std::move(c));
}

void SchedulerClient::Loop(std::stop_token stop) {
  // The largest thing the scheduler sends is a gather's release (every member's data).
  auto sock = Socket::ConnectDealer(ctx_, options_.scheduler_endpoint, "scheduler", kMaxSchedulerReplyBytes);
  if (sock.ok()) {
    if (Status w = sock->WatchHandshakes(ctx_); !w.ok()) GRADSYNC_LOG(WARNING) << w;
  }
  if (!sock.ok()) {
    std::lock_guard lock(mu_);
    health_ = sock.status();
    events_++;
    cv_.notify_all();
    return;
  }
  LinkState link;
  link.last_heard = Clock::now();
  link.next_beat = Clock::now();
  PauseDetector pause(options_.scheduler_timeout_s / 2);
  while (!stop.stop_requested()) {
    SendQueued(*sock, link);
    ReceiveOne(*sock, link);
    if (Status hs = sock->HandshakeStatus(); !hs.ok()) {
      // Retrying cannot help: the keys are wrong. Said once, as what it is (not "silent").
      std::lock_guard lock(mu_);
      if (health_.ok()) {
        health_ = hs;
        events_++;
        cv_.notify_all();
      }
    }
    {
      std::lock_guard lock(mu_);
      traffic_ = sock->traffic();
    }
    // A long gap between two turns of this loop means this process was paused (SIGSTOP, a
    // swapped-out machine): the scheduler's silence is ours. It gets a fresh timeout to answer
    // the next heartbeat (it may say this node was declared dead meanwhile).
    if (const double paused = pause.Turn(); paused > 0) {
      GRADSYNC_LOG(WARNING) << "this process was paused for " << paused << " s";
      link.last_heard = Clock::now();
      link.next_beat = Clock::now();
    }
    CheckSilence(*sock, link);
    if (!told_unhealthy_) {
      Status h = health();
      if (!h.ok()) {
        told_unhealthy_ = true;
        std::lock_guard lock(on_dead_mu_);
        if (on_unhealthy_) on_unhealthy_(h);
      }
    }
  }
}

void SchedulerClient::SendQueued(Socket& sock, LinkState& link) {
  std::deque<ControlMessage> out;
  {
    std::lock_guard lock(mu_);
    out.swap(outbox_);
  }
  for (auto& c : out) {
    if (c.type == wire::HEARTBEAT) c.sent_clock_us = SteadyMicros();  // a clock probe
    (void)sock.Send("", EncodeControl(c));
  }
  if (!out.empty()) cv_.notify_all();
  if (Clock::now() >= link.next_beat) {
    ControlMessage beat = Control(wire::HEARTBEAT);
    {
      std::lock_guard lock(mu_);
      beat.sender_role = options_.self.role();
      beat.sender_rank = rank_;
    }
    beat.sent_clock_us = SteadyMicros();
    (void)sock.Send("", EncodeControl(beat));
    link.next_beat = Clock::now() + std::chrono::duration_cast<Clock::duration>(Seconds(options_.heartbeat_interval_s));
  }
}

void SchedulerClient::ReceiveOne(Socket& sock, LinkState& link) {
  auto m = sock.Recv(5);
  if (!m.ok()) return;
  link.last_heard = Clock::now();
  link.heard = true;
  auto c = m->malformed.ok() ? DecodeControl(m->header) : Result<ControlMessage>(m->malformed);
  if (c.ok()) {
    Handle(*c);
    if (c->type == wire::NODE_DEAD) {
      std::lock_guard lock(on_dead_mu_);
      if (on_dead_) on_dead_(c->node);
    }
  }
}

void SchedulerClient::CheckSilence(Socket& sock, LinkState& link) {
  // Silent past the timeout: a scheduler whose connection is still up is alive (paused or
  // starved: it judges nobody while it does not run, so waiting costs nothing), and gets up to
  // kSchedulerUpFactor timeouts; one whose connection closed (it died) is lost at once.
  const auto silent = Clock::now() - link.last_heard;
  // (The connection's state is asked only past the timeout: not on every 5 ms turn.)
  const bool up = link.heard && silent > Seconds(options_.scheduler_timeout_s) && sock.PeerConnected();
  if (silent > Seconds(options_.scheduler_timeout_s) && up && !link.said_waiting) {
    GRADSYNC_LOG(WARNING) << "the scheduler at " << options_.scheduler_endpoint << " has been silent for "
                          << options_.scheduler_timeout_s << " s but its connection is up (paused or starved?): "
                          << "waiting up to " << kSchedulerUpFactor * options_.scheduler_timeout_s << " s";
    link.said_waiting = true;
  }
  if (silent <= Seconds(options_.scheduler_timeout_s)) link.said_waiting = false;
  if (silent > Seconds(options_.scheduler_timeout_s * (up ? kSchedulerUpFactor : 1.0))) {
    std::lock_guard lock(mu_);
    if (health_.ok()) {
      std::ostringstream seconds;
      seconds << options_.scheduler_timeout_s * (up ? kSchedulerUpFactor : 1.0);
      health_ = link.heard ? UnavailableError("lost the scheduler at " + options_.scheduler_endpoint + ": silent for " +
                                              seconds.str() + " s")
                           : UnavailableError("could not reach the scheduler at " + options_.scheduler_endpoint +
                                              ": no answer in " + seconds.str() +
                                              " s (is it running there? --scheduler=HOST:PORT)");
      events_++;
      cv_.notify_all();
    }
  }
}

void SchedulerClient::set_on_unhealthy(std::function<void(const Status&)> fn) {
  std::lock_guard lock(on_dead_mu_);
  on_unhealthy_ = std::move(fn);
}

void SchedulerClient::set_on_dead(std::function<void(const wire::NodeInfo&)> fn) {
  std::lock_guard lock(on_dead_mu_);
  on_dead_ = std::move(fn);
}

void SchedulerClient::Handle(const ControlMessage& h) {
  std::lock_guard lock(mu_);
  switch (h.type) {
    case wire::REGISTER_REPLY:
      table_ = h.table;
      rank_ = h.node.rank();
      rejoined_ = h.rejoined;
      replica_key_ = h.replica_key;
      registered_ = true;
      break;
    case wire::ERROR:
      HandleError(h);
      break;
    case wire::BARRIER_RELEASE:
      if (!h.status.ok()) {
        // Given up: a member will never come (the scheduler says why).
        barrier_failed_[h.barrier] = Status(h.status.code(), "scheduler: " + h.status.message());
        break;
      }
      released_.insert(h.barrier);
      if (!h.gathered.empty()) gathered_[h.barrier] = h.gathered;
      break;
    case wire::NODE_DEAD:
      dead_.push_back(h.node);
      dead_now_.insert({h.node.role(), h.node.rank()});
      events_++;
      break;
    case wire::NODE_JOINED:
      HandleJoined(h.node);
      break;
    case wire::TRAINING_ENDED:
      if (h.node.role() != wire::WORKER || h.node.rank() < 0 || h.clock < 0) {
        GRADSYNC_LOG(WARNING) << "scheduler: dropped a TRAINING_ENDED for " << NodeName(h.node) << " at clock "
                              << h.clock;
        break;
      }
      ended_.push_back({h.node.rank(), h.clock, h.joined});
      events_++;
      break;
    case wire::SHUTDOWN:
      shutdown_ = true;
      if (!h.status.ok() && job_failure_.ok()) {
        job_failure_ = Status(h.status.code(), "the scheduler stopped the job: " + h.status.message());
        if (health_.ok()) health_ = job_failure_;
      }
      events_++;
      break;
    case wire::MESSAGE_LIMIT:
      if (!h.status.ok()) limit_error_ = h.status;
      else limit_accepted_ = std::max<int64_t>(limit_accepted_, static_cast<int64_t>(h.max_message_bytes));
      break;
    case wire::SHARD_LIMIT:
      table_.set_max_message_bytes(std::max(table_.max_message_bytes(), h.max_message_bytes));
      events_++;
      break;
    case wire::HEARTBEAT:
      HandleClockProbe(h);
      break;
    default:
      break;
  }
  cv_.notify_all();
}

void SchedulerClient::HandleError(const ControlMessage& h) {
  if (!registered_) {
    register_error_ = h.status;
  } else if (h.status.code() == StatusCode::kAborted) {
    // Declared dead: this node is out of the job and must stop.
    if (health_.ok()) health_ = AbortedError("the scheduler says: " + h.status.message());
    events_++;
  } else {
    GRADSYNC_LOG(WARNING) << "scheduler: " << h.status.message();
  }
}

void SchedulerClient::HandleJoined(const wire::NodeInfo& n) {
  auto* slots = n.role() == wire::SERVER ? table_.mutable_servers() : table_.mutable_workers();
  if (n.standby()) {
    *table_.add_standbys() = n;  // a standby holds no rank of the table's servers
  } else if (n.rank() >= 0 && n.rank() < slots->size()) {
    *slots->Mutable(n.rank()) = n;
  }
  joined_.push_back(n);
  dead_now_.erase({n.role(), n.rank()});
  events_++;
}

void SchedulerClient::HandleClockProbe(const ControlMessage& h) {
  if (h.sent_clock_us > 0 && std::isfinite(h.sent_clock_us) && h.scheduler_clock_us > 0 &&
      std::isfinite(h.scheduler_clock_us)) {
    // The scheduler read its clock between this node's send and now: the round trip's
    // midpoint, with the least error where the round trip was shortest.
    const double now = SteadyMicros();
    const double rtt = now - h.sent_clock_us;
    if (rtt >= 0 && (clock_rtt_us_ < 0 || rtt < clock_rtt_us_)) {
      clock_rtt_us_ = rtt;
      clock_offset_us_ = h.scheduler_clock_us - (h.sent_clock_us + now) / 2;
    }
    clock_probes_++;
  }
}

void SchedulerClient::EstimateClock(int probes, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + Seconds(timeout_s);
  for (int i = 0; i < probes; ++i) {
    int answered = 0;
    {
      std::lock_guard lock(mu_);
      answered = clock_probes_;
    }
    Enqueue(Control(wire::HEARTBEAT));
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return clock_probes_ > answered || !health_.ok(); }) || !health_.ok()) return;
  }
}

double SchedulerClient::clock_offset_us() const {
  std::lock_guard lock(mu_);
  return clock_offset_us_;
}

double SchedulerClient::clock_rtt_us() const {
  std::lock_guard lock(mu_);
  return clock_rtt_us_;
}

Result<wire::ClusterTable> SchedulerClient::Register(double timeout_s) {
  ControlMessage h = Control(wire::REGISTER);
  h.node = options_.self;
  h.mode = options_.mode;
  h.staleness = options_.staleness;
  h.job_fingerprint = options_.job_fingerprint;
  Enqueue(h);
  std::unique_lock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + Seconds(timeout_s);
  bool done = false;
  while (true) {
    done = cv_.wait_until(lock, deadline, [&] { return registered_ || !register_error_.ok() || !health_.ok(); });
    // kUnavailable: the scheduler wants this node to ask again (a restarted node whose
    // predecessor is not declared dead yet).
    if (!done || register_error_.code() != StatusCode::kUnavailable) break;
    register_error_ = OkStatus();
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    Enqueue(h);
    lock.lock();
  }
  if (!register_error_.ok()) return register_error_;
  if (!health_.ok()) return health_;
  if (!done) {
    return DeadlineExceededError("registration with the scheduler at " + options_.scheduler_endpoint +
                                 " did not complete within " + SecondsText(timeout_s) +
                                 " s (are all servers and workers started?)");
  }
  wire::ClusterTable table = table_;
  lock.unlock();
  EstimateClock(kClockProbes, 1.0);
  return table;
}

int SchedulerClient::rank() const {
  std::lock_guard lock(mu_);
  return rank_;
}

Status SchedulerClient::Barrier(const std::string& name, const std::string& group, double timeout_s) {
  return Gather(name, group, "", timeout_s).status();
}

Result<std::vector<std::string>> SchedulerClient::Gather(const std::string& name, const std::string& group,
                                                         std::string data, double timeout_s) {
  if (data.size() > kMaxGatherBytes) {
    return InvalidArgumentError("barrier '" + name + "': " + std::to_string(data.size()) +
                                " bytes to gather, at most " + std::to_string(kMaxGatherBytes));
  }
  ControlMessage h = Control(wire::BARRIER);
  h.barrier = name;
  h.group = group;
  h.barrier_data = std::move(data);
  Enqueue(std::move(h));
  std::unique_lock lock(mu_);
  bool done = cv_.wait_for(lock, Seconds(timeout_s), [&] {
    return released_.count(name) > 0 || barrier_failed_.count(name) > 0 || !health_.ok() || shutdown_;
  });
  if (!health_.ok()) return health_;
  if (auto failed = barrier_failed_.find(name); failed != barrier_failed_.end()) {
    Status why = failed->second;
    barrier_failed_.erase(failed);
    return why;
  }
  if (released_.count(name)) {
    std::vector<std::string> out;
    if (auto it = gathered_.find(name); it != gathered_.end()) {
      out = std::move(it->second);
      gathered_.erase(it);
    }
    return out;
  }
  if (shutdown_) return AbortedError("the job shut down during barrier '" + name + "'");
  (void)done;
  return DeadlineExceededError("barrier '" + name + "' not released within " + SecondsText(timeout_s) + " s");
}

Status SchedulerClient::AnnounceMessageLimit(int64_t bytes, double timeout_s) {
  ControlMessage h = Control(wire::MESSAGE_LIMIT);
  h.max_message_bytes = static_cast<uint64_t>(bytes);
  Enqueue(std::move(h));
  std::unique_lock lock(mu_);
  const bool done = cv_.wait_for(lock, Seconds(timeout_s), [&] {
    return limit_accepted_ >= bytes || !limit_error_.ok() || !health_.ok() || shutdown_;
  });
  if (!health_.ok()) return health_;
  if (!limit_error_.ok()) return limit_error_;
  if (limit_accepted_ >= bytes) return OkStatus();
  if (shutdown_) return AbortedError("the job shut down before the shards accepted this worker's messages");
  (void)done;
  return DeadlineExceededError("the shards did not accept messages of " + std::to_string(bytes) + " bytes within " +
                               SecondsText(timeout_s) + " s");
}

void SchedulerClient::Listening(int64_t bytes) {
  ControlMessage h = Control(wire::LISTENING);
  h.max_message_bytes = static_cast<uint64_t>(bytes);
  Enqueue(std::move(h));
}

void SchedulerClient::TrainingEnded(int64_t clock, bool joined) {
  ControlMessage h = Control(wire::TRAINING_ENDED);
  h.clock = clock;
  h.joined = joined;
  Enqueue(std::move(h));
}

void SchedulerClient::Finished(const Status& status) {
  ControlMessage h = Control(wire::FINISHED);
  h.status = status;
  Enqueue(std::move(h));
}

void SchedulerClient::Flush(double timeout_s) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, Seconds(timeout_s), [&] { return outbox_.empty() || !health_.ok(); });
  lock.unlock();
  // The frames are queued in ZeroMQ now; give its I/O thread a moment to write them out.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

bool SchedulerClient::shutdown_requested() const {
  std::lock_guard lock(mu_);
  return shutdown_;
}

std::string SchedulerClient::replica_key() const {
  std::lock_guard lock(mu_);
  return replica_key_;
}

Status SchedulerClient::job_failure() const {
  std::lock_guard lock(mu_);
  return job_failure_;
}

Status SchedulerClient::health() const {
  std::lock_guard lock(mu_);
  return health_;
}

std::vector<wire::NodeInfo> SchedulerClient::dead_nodes() const {
  std::lock_guard lock(mu_);
  return dead_;
}

bool SchedulerClient::IsDead(wire::Role role, int rank) const {
  std::lock_guard lock(mu_);
  return dead_now_.count({role, rank}) > 0;
}

std::vector<wire::NodeInfo> SchedulerClient::joined_nodes() const {
  std::lock_guard lock(mu_);
  return joined_;
}

std::vector<EndedWorker> SchedulerClient::ended_workers() const {
  std::lock_guard lock(mu_);
  return ended_;
}

wire::ClusterTable SchedulerClient::table() const {
  std::lock_guard lock(mu_);
  return table_;
}

bool SchedulerClient::rejoined() const {
  std::lock_guard lock(mu_);
  return rejoined_;
}

uint64_t SchedulerClient::events() const { return events_.load(); }

TrafficCounters SchedulerClient::traffic() const {
  std::lock_guard lock(mu_);
  return traffic_;
}

}  // namespace gradsync
