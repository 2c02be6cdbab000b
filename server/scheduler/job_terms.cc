#include "server/scheduler/job_terms.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "common/base/logging.h"
#include "common/config/train_config.h"
#include "common/net/control/node.h"

namespace gradsync {

JobTerms::JobTerms(const std::string& mode, int staleness) : mode_(mode), staleness_(staleness) {
  // This run's identity: two checkpoint directories of the same settings still tell runs apart.
  std::random_device rd;
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", rd(), rd());
  job_id_ = id;
  for (int i = 0; i < 4; ++i) {
    const uint32_t v = rd();
    replica_key_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  if (!mode.empty()) mode_source_ = "the scheduler's --mode";
}

Status JobTerms::Admit(const std::string& who, const ControlMessage& h) {
  const auto& info = h.node;
  // A staleness of -1 (a worker started without --staleness) takes the job's bound.
  const std::string& ssp = ModeName(config::SSP);
  if (mode_.empty()) {
    mode_ = h.job.mode;
    staleness_ = h.job.staleness;
    mode_source_ = who;
  } else if (h.job.mode != mode_ ||
             (mode_ == ssp && staleness_ >= 0 && h.job.staleness >= 0 && h.job.staleness != staleness_)) {
    std::string mine = mode_ == ssp ? "ssp with staleness " + std::to_string(staleness_) : mode_;
    std::string theirs = h.job.mode == ssp ? "ssp with staleness " + std::to_string(h.job.staleness) : h.job.mode;
    GRADSYNC_LOG(ERROR) << "refused " << who << ": it runs " << theirs << " but the job runs " << mine;
    return InvalidArgumentError("mode mismatch: this job runs " + mine + " (set by " + mode_source_ + "), this " +
                                RoleName(info.role()) + " asked for " + theirs);
  }
  if (mode_ == ssp && staleness_ < 0) staleness_ = h.job.staleness;
  if (info.role() == wire::WORKER) {
    if (fingerprint_source_.empty()) {
      fingerprint_ = h.job.fingerprint;
      fingerprint_source_ = who;
    } else if (h.job.fingerprint != fingerprint_) {
      const FingerprintDifference d = DescribeFingerprintDifference(h.job.fingerprint, fingerprint_);
      return InvalidArgumentError("settings differ between workers: " + who + " has [" + d.mine + "] but " +
                                  fingerprint_source_ + " has [" + d.theirs + "]");
    }
  }
  return OkStatus();
}

Status JobTerms::AdmitAgain(const ControlMessage& h) const {
  const auto& info = h.node;
  if (h.job.mode != mode_ || (mode_ == ModeName(config::SSP) && h.job.staleness >= 0 && h.job.staleness != staleness_)) {
    return InvalidArgumentError("mode mismatch: this job runs " + mode_ + ", this " + RoleName(info.role()) +
                                " asked for " + h.job.mode);
  }
  if (info.role() == wire::WORKER && h.job.fingerprint != fingerprint_) {
    const FingerprintDifference d = DescribeFingerprintDifference(h.job.fingerprint, fingerprint_);
    return InvalidArgumentError("settings differ from the running job's: [" + d.mine + "] vs [" + d.theirs + "]");
  }
  return OkStatus();
}

void JobTerms::Fill(wire::ClusterTable& table) const {
  table.set_mode(mode_);
  table.set_staleness(std::max(0, staleness_));
  table.set_job_id(job_id_);
  table.set_job_fingerprint(fingerprint_);
}

}  // namespace gradsync
