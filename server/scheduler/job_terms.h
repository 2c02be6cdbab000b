// JobTerms: what a job runs, which every node that registers must agree with: its mode and ssp
// staleness bound (the first node's, or the scheduler's --mode / --staleness), the workers'
// settings (the first worker's fingerprint: common/config/train_config.h's JobFingerprint), who
// set each (named in a refusal), and the job's identity (a random job id, in every checkpoint, and
// the replication key told to servers only), drawn once. Admit and AdmitAgain are the checks;
// Fill writes the terms into the cluster table.
//
// Threading: the scheduler's.
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/net/control/control_protocol.h"
#include "gradsync.pb.h"

namespace gradsync {

class JobTerms {
 public:
  // `mode` and `staleness`: the scheduler's (""/-1: whatever the first node says).
  JobTerms(const std::string& mode, int staleness);

  // A node's first registration (`who` names it): its mode, staleness and (workers) settings
  // must agree with the job's, which the first node to say them sets. The refusal otherwise.
  Status Admit(const std::string& who, const ControlMessage& reg);
  // A restarted node registering with the running job: the same checks, against the job's.
  Status AdmitAgain(const ControlMessage& reg) const;
  // The table's terms: mode, staleness, job id, the workers' fingerprint.
  void Fill(wire::ClusterTable& table) const;

  const std::string& mode() const { return mode_; }
  const std::string& replica_key() const { return replica_key_; }

 private:
  std::string mode_;
  int staleness_ = -1;  // -1 until known
  std::string mode_source_;
  std::string fingerprint_;
  std::string fingerprint_source_;
  std::string job_id_;       // this run of the job, in every checkpoint
  std::string replica_key_;  // told to servers only (wire::ControlFields.replica_key)
};

}  // namespace gradsync
