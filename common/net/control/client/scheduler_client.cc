#include "common/net/control/client/scheduler_client.h"

#include <chrono>

#include "common/base/clock.h"
#include "common/base/logging.h"

namespace gradsync {

SchedulerClient::SchedulerClient(TransportContext& ctx, SchedulerClientOptions options)
    : options_(std::move(options)),
      standing_([this] {
        registration_.Wake();
        barriers_.Wake();
        clock_.Wake();
        link_.Wake();
      }),
      registration_(standing_),
      news_(standing_),
      barriers_(standing_),
      link_(ctx, options_, standing_, registration_, [this](const ControlMessage& c) { Handle(c); }),
      clock_(link_, standing_) {
  thread_ = std::jthread([this](std::stop_token st) { link_.Run(st); });
}

void SchedulerClient::Handle(const ControlMessage& h) {
  switch (h.type) {
    case wire::REGISTER_REPLY:
      news_.Registered(h.job.table);
      registration_.Accept(h);
      break;
    case wire::ERROR:
      if (registration_.TakeRefusal(h.status)) break;
      if (h.status.code() == StatusCode::kAborted) {
        // Declared dead: this node is out of the job and must stop.
        if (!standing_.Fail(AbortedError("the scheduler says: " + h.status.message()))) standing_.Bump();
      } else {
        GRADSYNC_LOG(WARNING) << "scheduler: " << h.status.message();
      }
      break;
    case wire::BARRIER_RELEASE:
      barriers_.Released(h);
      break;
    case wire::NODE_DEAD:
      news_.Dead(h.node);
      break;
    case wire::NODE_JOINED:
      news_.Joined(h.node);
      break;
    case wire::TRAINING_ENDED:
      news_.Ended(h);
      break;
    case wire::SHUTDOWN:
      standing_.Shutdown(h.status);
      break;
    case wire::MESSAGE_LIMIT:
      barriers_.LimitAnswer(h);
      break;
    case wire::SHARD_LIMIT:
      news_.ShardLimit(h.max_message_bytes);
      break;
    case wire::HEARTBEAT:
      clock_.Answered(h);
      break;
    default:
      break;
  }
}

Result<wire::ClusterTable> SchedulerClient::Register(double timeout_s) {
  ControlMessage h = Control(wire::REGISTER);
  h.node = options_.self;
  h.job.mode = options_.mode;
  h.job.staleness = options_.staleness;
  h.job.fingerprint = options_.job_fingerprint;
  link_.Send(h);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::optional<Status> answer = registration_.Wait(deadline);
  while (answer && answer->code() == StatusCode::kUnavailable) {
    // The scheduler wants this node to ask again (a restarted node whose predecessor is not
    // declared dead yet).
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    link_.Send(h);
    answer = registration_.Wait(deadline);
  }
  if (answer && !answer->ok()) return *answer;
  if (Status health = standing_.health(); !health.ok()) return health;
  if (!answer) {
    return DeadlineExceededError("registration with the scheduler at " + options_.scheduler_endpoint +
                                 " did not complete within " + SecondsText(timeout_s) +
                                 " s (are all servers and workers started?)");
  }
  wire::ClusterTable table = news_.table();
  clock_.Estimate(kClockProbes, 1.0);
  return table;
}

int SchedulerClient::rank() const { return registration_.rank(); }

bool SchedulerClient::rejoined() const { return registration_.rejoined(); }

std::string SchedulerClient::replica_key() const { return registration_.replica_key(); }

wire::ClusterTable SchedulerClient::table() const { return news_.table(); }

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
  h.barrier.name = name;
  h.barrier.group = group;
  h.barrier.data = std::move(data);
  link_.Send(std::move(h));
  return barriers_.Wait(name, timeout_s);
}

Status SchedulerClient::AnnounceMessageLimit(int64_t bytes, double timeout_s) {
  ControlMessage h = Control(wire::MESSAGE_LIMIT);
  h.max_message_bytes = static_cast<uint64_t>(bytes);
  link_.Send(std::move(h));
  return barriers_.WaitLimit(bytes, timeout_s);
}

void SchedulerClient::Listening(int64_t bytes) {
  ControlMessage h = Control(wire::LISTENING);
  h.max_message_bytes = static_cast<uint64_t>(bytes);
  link_.Send(std::move(h));
}

void SchedulerClient::TrainingEnded(int64_t clock, bool joined) {
  ControlMessage h = Control(wire::TRAINING_ENDED);
  h.ended.clock = clock;
  h.ended.joined = joined;
  link_.Send(std::move(h));
}

void SchedulerClient::Finished(const Status& status) {
  ControlMessage h = Control(wire::FINISHED);
  h.status = status;
  link_.Send(std::move(h));
}

void SchedulerClient::Flush(double timeout_s) { link_.Flush(timeout_s); }

bool SchedulerClient::shutdown_requested() const { return standing_.shutdown_requested(); }

Status SchedulerClient::job_failure() const { return standing_.job_failure(); }

Status SchedulerClient::health() const { return standing_.health(); }

bool SchedulerClient::IsDead(wire::Role role, int rank) const { return news_.IsDead(role, rank); }

void SchedulerClient::set_on_dead(std::function<void(const wire::NodeInfo&)> fn) { news_.set_on_dead(std::move(fn)); }

void SchedulerClient::set_on_unhealthy(std::function<void(const Status&)> fn) {
  link_.set_on_unhealthy(std::move(fn));
}

TrafficCounters SchedulerClient::traffic() const { return link_.traffic(); }

}  // namespace gradsync
