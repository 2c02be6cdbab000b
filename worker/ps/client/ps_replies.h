// PsReplies: what a shard's reply does to the request it answers: a pull's values into the
// request's target (through the channel the reply names, or decoded by the codec), a push's
// acknowledgement, a JOIN's clock, a channel attachment's answer, a piece of the optimizer state;
// and what the replies said, counted as the shards count them (ReplyCounts) and the last of each
// shard (version lag, clock staleness, hold time). PsRequests owns it and hands it each reply.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "common/base/status.h"
#include "common/net/transport.h"
#include "common/ps/partitioner.h"
#include "common/ps/ps_protocol.h"
#include "summary.pb.h"
#include "worker/channels/worker_channels.h"
#include "worker/ps/client/ps_codec.h"
#include "worker/ps/client/shard_links.h"
#include "worker/ps/table_plan.h"

namespace gradsync {

class StateGather;

// A request in flight: the replies still due, and where they go.
struct PsPending {
  int remaining = 0;
  Status status;
  bool is_pull = false;
  FloatSpan target;
  std::vector<int> waiting;  // shards not answered yet (one entry per message due)
  double sent_us = -1;  // traces: when it was sent (a pull's span ends with its reply)
  std::shared_ptr<StateGather> state;  // a STATE_PULL
  std::shared_ptr<PsReply> answer;     // a CHANNEL_ATTACH: its reply
  StepRows rows;                       // a pull of table rows too: where they go
};

// Every reply so far, counted as the shards count them in their summaries: pushes
// acknowledged and pulls answered (one per shard each), the version lag of each acknowledged
// push and the clock staleness of each answered pull.
struct ReplyCounts {
  int64_t pushes = 0;
  int64_t pulls = 0;
  std::map<int64_t, int64_t> version_lag;
  std::map<int64_t, int64_t> clock_staleness;
};

class PsReplies {
 public:
  PsReplies(ShardLinks& links, WorkerChannels& channels, PsCodec& codec, const Partitioner& partitioner);

  // Reply m of `shard` (`decoded`: its header, decoded once) to request p (`more`: a piece, the
  // rest to come): fails p with what went wrong; sets *frame_read once it has read the reply's
  // values from their channel. True when the pull's channel broke and the pull must be asked
  // again over ZeroMQ.
  bool Apply(int shard, const Message& m, const Result<PsReply>& decoded, bool more, PsPending& p, bool* frame_read);

  const ReplyCounts& counts() const { return counts_; }
  // Over the shards (max): the version lag the last push was applied with (-1 until known), the
  // clock staleness of the last answered pull (-1 until known), how long the last pull was held by
  // the consistency rule.
  double last_version_lag() const;
  int64_t last_clock_staleness() const;
  // Of shard s's last answered pull (-1 until known).
  int64_t last_clock_staleness(int shard) const { return last_[static_cast<size_t>(shard)].clock_staleness; }
  double last_wait_ms() const;

 private:
  // The last reply of a shard.
  struct Last {
    double version_lag = -1;
    double wait_ms = 0;
    int64_t clock_staleness = -1;
  };
  // A PULL_REPLY's values into p.target: true once taken, false when its channel broke; an error
  // for values that do not fit.
  Result<bool> TakePull(int shard, const Message& m, const PsReply& r, PsPending& p, bool* frame_read);
  // A pull's reply handled: its counts and trace.
  void NotePull(int shard, const Message& m, const PsReply& r, const PsPending& p);

  ShardLinks& links_;
  WorkerChannels& channels_;
  PsCodec& codec_;
  const Partitioner& partitioner_;
  ReplyCounts counts_;
  std::vector<Last> last_;  // per shard
};

// A worker's summary (OUT/worker-<rank>.json) of its replies: pushes, pulls and the two
// histograms, in the shards' units.
void SetReplyCounts(const ReplyCounts& counts, summary::ProcessSummary* s);

}  // namespace gradsync
