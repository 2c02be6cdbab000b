#include "server/shard/shard_checkpointer.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/base/atomic_file.h"
#include "common/base/clock.h"
#include "common/config/train_config.h"

namespace gradsync {

bool ShardCheckpointer::Due(bool updated, double now_s) {
  if (!enabled()) return false;
  if (updated && updates_since_++ == 0) first_dirty_s_ = now_s;
  if (updates_since_ == 0) return false;
  const bool by_count = every_ > 0 && updates_since_ >= every_;
  const bool by_time = now_s - first_dirty_s_ >= interval_s_;
  return by_count || by_time;
}

namespace {
constexpr char kMagic[] = "GSSHARD1";  // 8 bytes: the checked file's kind

std::string ShortId(const std::string& id) { return id.empty() ? "(none)" : id; }
}  // namespace

Status CheckFinite(const wire::ShardCheckpoint& c) {
  for (const std::string* blob : {&c.params(), &c.optimizer_state()}) {
    const size_t n = blob->size() / sizeof(float);
    for (size_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, blob->data() + i * sizeof(float), sizeof v);
      if (!std::isfinite(v)) {
        return DataLossError(std::string(blob == &c.params() ? "parameter" : "optimizer state element") + " " +
                             std::to_string(i) + " is " + (std::isnan(v) ? "NaN" : "infinite"));
      }
    }
  }
  return OkStatus();
}

Status ShardCheckpointer::Write(int rank, const std::function<wire::ShardCheckpoint()>& snapshot, double now_s) {
  Stopwatch took;
  const wire::ShardCheckpoint c = snapshot();
  Status s = CheckFinite(c);
  if (!s.ok()) {
    s = DataLossError("not written, the last good checkpoint stays: " + s.message());
  } else {
    std::string bytes;
    s = c.SerializeToString(&bytes) ? WriteCheckedFile(Path(rank), kMagic, bytes)
                                    : InternalError("could not serialize the checkpoint");
  }
  if (!s.ok()) {
    first_dirty_s_ = now_s;  // try again after another interval
    ++failed_since_;
    return s;
  }
  ++written_;
  slowest_ms_ = std::max(slowest_ms_, took.Millis());
  updates_since_ = 0;
  failed_since_ = 0;
  last_written_s_ = now_s;
  return OkStatus();
}

std::string ShardCheckpointer::LastGood(double now_s) const {
  if (last_written_s_ < 0) return "no checkpoint of this shard has been written yet";
  char text[160];
  std::snprintf(text, sizeof text, "the last good checkpoint is %.0f s old (%lld write(s) failed since)",
                now_s - last_written_s_, static_cast<long long>(failed_since_));
  return text;
}

Result<wire::ShardCheckpoint> ShardCheckpointer::Read(int rank, const wire::ClusterTable& table) const {
  const std::string path = Path(rank);
  ASSIGN_OR_RETURN(std::string bytes, ReadCheckedFile(path, kMagic));
  wire::ShardCheckpoint c;
  if (!c.ParseFromString(bytes)) return DataLossError(path + " is not a shard checkpoint");
  if (c.job_id() != table.job_id()) {
    std::string why = path + " belongs to another job (" + ShortId(c.job_id()) + ", this one is " +
                      ShortId(table.job_id());
    if (c.job_fingerprint() != table.job_fingerprint() && !c.job_fingerprint().empty() &&
        !table.job_fingerprint().empty()) {
      const FingerprintDifference d = DescribeFingerprintDifference(c.job_fingerprint(), table.job_fingerprint());
      why += "; its settings [" + d.mine + "], this job's [" + d.theirs + "]";
    }
    return DataLossError(why + ")");
  }
  if (c.rank() != rank) {
    return DataLossError(path + " belongs to shard " + std::to_string(c.rank()) + ", this is shard " +
                         std::to_string(rank));
  }
  if (c.params().size() % sizeof(float) != 0 || c.optimizer_state().size() % sizeof(float) != 0) {
    return DataLossError(path + " does not hold whole floats");
  }
  if (Status s = CheckFinite(c); !s.ok()) return DataLossError(path + ": " + s.message());
  return c;
}

}  // namespace gradsync
