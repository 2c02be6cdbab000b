#include "server/server_registration.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "common/base/logging.h"

namespace gradsync {

Status ServerRegistration::Register() {
  SchedulerClientOptions sc;
  sc.scheduler_endpoint = options_.link.scheduler_endpoint;
  sc.self.set_role(wire::SERVER);
  sc.self.set_host(options_.link.advertise_host);
  sc.self.set_port(socket_.port());
  sc.self.set_requested_rank(rank_ >= 0 ? rank_ : options_.link.requested_rank);
  sc.self.set_adopted(options_.takeover.restore_from != nullptr);
  sc.self.set_checkpoints(!options_.checkpoints.dir.empty());
  sc.mode = ConsistencyModeName(options_.rule.mode);
  sc.staleness = options_.rule.mode == ConsistencyMode::kSsp ? options_.rule.staleness : 0;
  sc.heartbeat_interval_s = options_.link.heartbeat_interval_s;
  sc.scheduler_timeout_s = options_.link.scheduler_timeout_s;
  scheduler_.reset();  // a previous link (declared dead) stops its heartbeats first
  scheduler_ = std::make_unique<SchedulerClient>(ctx_, sc);
  // Nothing is served before the job is complete (workers connect after it), but what strangers
  // send meanwhile must not pile up unread in the data socket: it is read and dropped.
  auto registered = std::async(std::launch::async, [&] { return scheduler_->Register(options_.link.register_timeout_s); });
  while (registered.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    if (auto m = socket_.Recv(20); m.ok()) stats_.rejected++;
  }
  ASSIGN_OR_RETURN(table_, registered.get());
  rank_ = scheduler_->rank();
  return OkStatus();
}

Status ServerRegistration::ApplyMessageLimit() {
  const auto want = static_cast<int64_t>(scheduler_->table().max_message_bytes());
  if (want > kMaxJobMessageBytes) {
    return InvalidArgumentError("the scheduler's message limit of " + std::to_string(want) + " bytes is not sane");
  }
  if (want > socket_.max_message_bytes()) {
    RETURN_IF_ERROR(socket_.RaiseMaxMessageBytes(want));
    GRADSYNC_LOG(INFO) << "server " << rank_ << ": accepts messages of up to " << want << " bytes";
  }
  listening_ = std::max(want, socket_.max_message_bytes());
  scheduler_->Listening(socket_.max_message_bytes());
  return OkStatus();
}

}  // namespace gradsync
