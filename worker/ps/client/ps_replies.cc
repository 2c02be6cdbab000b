#include "worker/ps/client/ps_replies.h"

#include <algorithm>

#include "common/obs/process_summary.h"
#include "common/obs/trace.h"
#include "worker/ps/client/state_transfer.h"

namespace gradsync {

PsReplies::PsReplies(ShardLinks& links, WorkerChannels& channels, PsCodec& codec, const Partitioner& partitioner)
    : links_(links),
      channels_(channels),
      codec_(codec),
      partitioner_(partitioner),
      last_(static_cast<size_t>(links.size())) {}

bool PsReplies::Apply(int shard, const Message& m, const Result<PsReply>& decoded, bool more, PsPending& p,
                      bool* frame_read) {
  auto fail = [&](Status s) {
    if (p.status.ok()) p.status = std::move(s);
  };
  if (!decoded.ok()) {
    fail(DataLossError("malformed reply from " + links_.Name(shard) + ": " + decoded.status().message()));
    return false;
  }
  const PsReply& r = *decoded;
  Last& from = last_[static_cast<size_t>(shard)];
  switch (r.type) {
    case wire::ERROR: fail(r.error); return false;
    case wire::PUSH_REPLY:
      from.version_lag = static_cast<double>(r.staleness.version_lag);
      ++counts_.pushes;
      ++counts_.version_lag[r.staleness.version_lag];
      return false;
    case wire::JOIN_REPLY:
      links_.set_join_clock(shard, r.clock);
      links_.set_version(shard, r.version);
      return false;
    case wire::CHANNEL_ATTACH_REPLY:
      if (p.answer) *p.answer = r;
      return false;
    case wire::STATE_PULL_REPLY: {
      const std::string who = links_.Name(shard);
      Status st = p.state ? p.state->Take(shard, m, r, partitioner_.range(shard), who)
                          : DataLossError("an optimizer state from " + who + " that was not asked for");
      if (!st.ok()) fail(st);
      return false;
    }
    case wire::PULL_REPLY: break;
    default: return false;
  }
  if (!p.is_pull) return false;
  auto taken = TakePull(shard, m, r, p, frame_read);
  if (!taken.ok()) {
    fail(taken.status());
    return false;
  }
  if (!*taken) return true;  // to be asked again
  links_.set_version(shard, r.version);
  from.wait_ms = r.staleness.wait_ms;
  from.clock_staleness = r.staleness.clock_staleness;
  if (!more) NotePull(shard, m, r, p);
  return false;
}

Result<bool> PsReplies::TakePull(int shard, const Message& m, const PsReply& r, PsPending& p, bool* frame_read) {
  if (!r.tables.empty()) {
    // Table rows: where the step's plan put this shard's ids, once checked to be what was asked.
    const TablePlan* plan = p.rows.plan;
    const std::span<const TableRun> asked = plan != nullptr ? plan->runs(shard) : std::span<const TableRun>();
    if (plan == nullptr || !std::equal(r.tables.begin(), r.tables.end(), asked.begin(), asked.end()) ||
        m.num_values() != plan->floats(shard) || m.values.size() % sizeof(float) != 0) {
      return DataLossError("table rows from " + links_.Name(shard) + " are not the rows asked for");
    }
    plan->Scatter(shard, static_cast<const float*>(m.values.data()), p.rows.rows);
    *frame_read = true;
    return true;
  }
  // The reply's values go where its segments and keys say, once checked to fit.
  const Segment& range = partitioner_.range(shard);
  const int64_t n = static_cast<int64_t>(p.target.size());
  for (const Segment& seg : r.segments) {
    if (seg.begin < range.begin || seg.end < seg.begin || seg.end > range.end || seg.end > n) {
      return DataLossError("pull reply from " + links_.Name(shard) + " is out of range");
    }
  }
  if (!r.codec.empty()) {
    // A compressed delta since the last pull: decoded (and so validated) whole, then added.
    if (!codec_.compresses_pull() || r.codec != codec_.spec() || r.num_keys > 0) {
      return DataLossError("unexpected compressed pull reply ('" + r.codec + "') from " + links_.Name(shard));
    }
    TraceSpan decode("decode", "comm", {{"shard", static_cast<double>(shard)}, {"bytes", static_cast<double>(m.values.size())}});
    RETURN_IF_ERROR(codec_.AddPull(m.values.bytes(), r.segments, r.clock, p.target)
                        .WithContext("pull reply from " + links_.Name(shard)));
    return true;
  }
  *frame_read = true;
  return channels_.TakePull(shard, m, r, p.target.data());
}

void PsReplies::NotePull(int shard, const Message& m, const PsReply& r, const PsPending& p) {
  ++counts_.pulls;
  ++counts_.clock_staleness[r.staleness.clock_staleness];
  if (p.sent_us >= 0 && Trace::on()) {
    // From the request to this shard's (last) reply: the wait, the shard's work, the transfer.
    const double values = static_cast<double>(TotalSize(r.segments) + r.num_keys);
    Trace::Complete("pull", "comm", p.sent_us, Trace::NowUs() - p.sent_us,
                    {{"shard", static_cast<double>(shard)}, {"clock", static_cast<double>(r.clock)},
                     {"bytes", r.codec.empty() ? values * sizeof(float) : static_cast<double>(m.values.size())},
                     {"held ms", r.staleness.wait_ms}});
  }
}

double PsReplies::last_version_lag() const {
  double most = -1;
  for (const Last& s : last_) most = std::max(most, s.version_lag);
  return most;
}

int64_t PsReplies::last_clock_staleness() const {
  int64_t most = -1;
  for (const Last& s : last_) most = std::max(most, s.clock_staleness);
  return most;
}

double PsReplies::last_wait_ms() const {
  double most = 0;
  for (const Last& s : last_) most = std::max(most, s.wait_ms);
  return most;
}

void SetReplyCounts(const ReplyCounts& counts, summary::ProcessSummary* s) {
  s->set_pushes(counts.pushes);
  s->set_pulls(counts.pulls);
  SetHistogram(counts.version_lag, s->mutable_version_lag());
  SetHistogram(counts.clock_staleness, s->mutable_clock_staleness());
}

}  // namespace gradsync
