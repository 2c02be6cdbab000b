#include "server/shard/shard_round.h"

#include <utility>

namespace gradsync {
namespace {

void ApplyChunk(const PushChunk& c, float scale, bool counts, float lr, KvShard& shard) {
  shard.Apply(c.segments, c.keys, c.values(), scale, counts, lr, c.absent, c.tables);
}

}  // namespace

void ShardRound::Take(int worker, HeldPush push, float scale, KvShard& shard) {
  if (aggregates_) {
    // Held until the round completes, without copying the values where they came.
    if (held_.empty()) open_us_ = traced_ && Trace::on() ? Trace::NowUs() : -1;
    held_[worker] = std::move(push);
    return;
  }
  for (size_t i = 0; i < push.chunks.size(); ++i) {
    ApplyChunk(push.chunks[i], scale, i + 1 == push.chunks.size(), push.lr, shard);
  }
}

void ShardRound::TakeChunk(int worker, PushChunk chunk, float scale, bool counts, float lr, KvShard& shard) {
  if (!aggregates_) {
    ApplyChunk(chunk, scale, counts, lr, shard);
    return;
  }
  HeldPush& held = held_[worker];
  held.chunks.push_back(std::move(chunk));
  held.lr = lr;
}

AppliedRound ShardRound::Apply(KvShard& shard, int64_t round_number, int waited_for, std::optional<TraceSpan>* span) {
  AppliedRound out;
  out.pushes = static_cast<int>(held_.size());
  const double round = static_cast<double>(round_number);
  if (out.pushes > 0 && open_us_ >= 0 && Trace::on()) {
    // From the round's first push to its last: what the others waited for.
    Trace::Complete("round wait", "server", open_us_, Trace::NowUs() - open_us_,
                    {{"round", round}, {"waited for worker", static_cast<double>(waited_for)},
                     {"pushes", static_cast<double>(out.pushes)}});
  }
  open_us_ = -1;
  if (traced_) span->emplace("apply round", "server", std::initializer_list<TraceArg>{{"round", round}, {"pushes", static_cast<double>(out.pushes)}});
  for (auto& [worker, held] : held_) {
    for (const PushChunk& c : held.chunks) shard.Accumulate(c.segments, c.keys, c.values(), c.absent, c.tables);
    if (!std::isnan(held.lr)) out.lr = held.lr;
    held.chunks.clear();  // read: whatever lent the values may have them back
  }
  if (out.pushes > 0) shard.ApplyAccumulated(out.pushes, out.lr);
  held_.clear();
  return out;
}

void ShardRound::Clear() {
  held_.clear();
  open_us_ = -1;
}

}  // namespace gradsync
