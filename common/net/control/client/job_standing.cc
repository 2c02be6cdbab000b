#include "common/net/control/client/job_standing.h"

namespace gradsync {

Status JobStanding::health() const {
  std::lock_guard lock(mu_);
  return health_;
}

bool JobStanding::ok() const {
  std::lock_guard lock(mu_);
  return health_.ok();
}

bool JobStanding::running() const {
  std::lock_guard lock(mu_);
  return health_.ok() && !shutdown_;
}

bool JobStanding::Fail(Status why) {
  {
    std::lock_guard lock(mu_);
    if (!health_.ok()) return false;
    health_ = std::move(why);
    events_++;
  }
  wake_();
  return true;
}

void JobStanding::Shutdown(const Status& why) {
  {
    std::lock_guard lock(mu_);
    shutdown_ = true;
    if (!why.ok() && job_failure_.ok()) {
      job_failure_ = Status(why.code(), "the scheduler stopped the job: " + why.message());
      if (health_.ok()) health_ = job_failure_;
    }
    events_++;
  }
  wake_();
}

bool JobStanding::shutdown_requested() const {
  std::lock_guard lock(mu_);
  return shutdown_;
}

Status JobStanding::job_failure() const {
  std::lock_guard lock(mu_);
  return job_failure_;
}

}  // namespace gradsync
