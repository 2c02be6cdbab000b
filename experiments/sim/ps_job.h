// The parameter server job: workers that pull, compute and push, and shards that apply pushes
// and answer pulls under the servers' own consistency rule (common/ps/consistency.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/base/numeric/segment.h"
#include "common/config/sync_decisions.h"
#include "common/base/status.h"
#include "common/obs/process_summary.h"
#include "common/ps/consistency.h"
#include "common/ps/partitioner.h"
#include "common/ps/ps_protocol.h"
#include "experiments/sim/codec_costs.h"
#include "experiments/sim/engine/engine.h"
#include "experiments/sim/job.h"

namespace gradsync::sim {

// A part of a pull or push: tensor `tensor`'s elements on shard `shard` (sequential: one per
// shard, tensor -1), pushed in `parts` messages.
struct Piece {
  int shard = 0;
  Segment seg;
  int group = 0;  // the forward group whose computation waits for it
};

class PsJob {
 public:
  PsJob(Job& job, Codecs& codecs) : j_(job), codecs_(codecs) {}
  // The workers' layouts (forward groups and pieces, with and without overlap), the shards and the
  // codec costs of each shard's part.
  Status Build();
  // Worker 0's INIT of every shard, then every worker's first pull.
  void Start();
  // server-<k>.json: each shard's pushes, pulls, bytes and histograms.
  Status WriteSummaries(const std::string& dir);

 private:
  struct Shard {
    ConsistencyController cc;
    int64_t version = 0;
    std::vector<int> parts_in;          // per worker: parts of its current push arrived
    std::vector<int64_t> push_version;  // per worker: the version its current push was computed on
    std::vector<int> round;             // aggregating: workers whose push waits for the round
    struct Held {
      int worker;
      Time since;
      std::function<void(double wait_ms)> answer;
    };
    // By clock: a pull the rule holds, every later clock's is held too (ConsistencyController:
    // answerable clocks only grow), so a push answers a prefix.
    std::multimap<int64_t, Held> held;
    Histogram lag, staleness;
    uint64_t sent = 0, received = 0;
    int64_t pushes = 0, pulls = 0;
    Shard(ConsistencyMode m, int s, int n)
        : cc(m, s, n), parts_in(static_cast<size_t>(n), 0), push_version(static_cast<size_t>(n), 0) {}
  };
  // How a worker cuts its model: forward groups and the pieces it pulls and pushes.
  struct Layout {
    bool overlap = false;
    std::vector<Piece> pieces;
    std::vector<int64_t> group_floats;  // per forward group
    std::vector<int> parts_per_shard;   // the pieces of one push to a shard
  };
  struct Worker {
    const Layout* layout = nullptr;
    int64_t clock = 0;
    int64_t step = 0;  // steps taken (with rounds several a clock)
    int group = 0;  // the forward group the step waits for
    bool waiting = false;
    std::vector<int> pending;  // per group: pull pieces not yet answered
    std::vector<int64_t> version, pushed;
    Time step_start = 0;
    double step_wait_ms = 0;
    bool done = false;
  };

  int ShardHost(int k) const { return k; }
  int WorkerHost(int w) const { return j_.plan.servers + w; }
  int64_t TotalFloats() const { return j_.s.params; }

  // The real protocol's header sizes (common/ps/ps_protocol.h's encoders).
  uint64_t HeaderBytes(const PsRequest& r) const { return EncodeRequest(r).ByteSizeLong(); }
  uint64_t ReplyBytes(wire::Type type, int64_t clock, const std::vector<Segment>& segs,
                      const std::string& codec = "") const;
  // A message from worker w to shard k, and back, counted at both ends.
  void SendToShard(int w, int k, uint64_t bytes, std::function<void()> at_shard);
  void ReplyToWorker(int k, int w, uint64_t bytes, std::function<void()> at_worker);

  // Pulls for clock c: a request per piece (one per shard without overlap); `eval`: worker 0's
  // final raw pull of everything.
  void SendPulls(int w, int64_t c, bool eval);
  // A pull at its shard: answered now, or held until the consistency rule lets it through.
  void ShardPull(const Piece& p, int w, int64_t c, bool delta, bool eval);
  // The held pulls the rule now answers, in clock order.
  void AnswerHeld(Shard& sh);
  // A pull's answer at its worker: the forward of the group it completes, or the final evaluation.
  void PullAnswered(const Piece& p, int w, int64_t c, int64_t version, int64_t staleness, double wait_ms, bool eval);

  // The forward of group wk.group, its parameters here.
  void Forward(int w, int64_t c);
  // The backward of group g (last first); with overlap its pieces are pushed when it ends.
  void Backward(int w, int64_t c, int g);
  void PushGroup(int w, int64_t c, int g);
  // A piece of the push of clock c; `encoded_payload`: a compressed payload's bytes (0: raw).
  void PushPiece(int w, int64_t c, const Piece& p, size_t encoded_payload);
  void FinishStep(int w, int64_t c);
  // Without overlap: each shard's part in turn, encoded (compressed) and pushed, as PsClient
  // does; then the step ends.
  void PushEncoded(int w, int64_t c, size_t i);
  // The step's row (and evaluation), then the next pull, or the end of the worker's steps.
  void EndStep(int w, int64_t c);
  // Local SGD / DiLoCo (sync_every): after backward the worker's own update, and at a round's
  // end the pseudo-gradient (a pass over the model each) before the push of round c.
  void FinishLocalStep(int w, int64_t c);
  // A step that starts no round: its forward at once (no pull).
  void ComputeStep(int w, int64_t c);
  // The clocks the workers end with: the steps, or with rounds the rounds.
  int64_t FinalClock() const { return rounds_.every > 0 ? (j_.s.steps + rounds_.every - 1) / rounds_.every : j_.s.steps; }
  // A push's piece at its shard: decoded and applied; with its push's last piece the consistency
  // rule takes the push (aggregating: the round's sum is applied once it is complete).
  void ShardPush(const Piece& p, int w, int64_t c, int64_t version, bool compressed);

  Job& j_;
  Codecs& codecs_;
  std::unique_ptr<Partitioner> part_;
  bool compress_ = false, compress_pull_ = false;
  RoundSchedule rounds_;  // sync_every: steps a round (every 0: every step pushes and pulls)
  // Delay compensation (ssp, asp): a shard copies what each pull read (a pass over its values)
  // and corrects each push before applying it (two passes: the drift, then the correction).
  bool compensates_ = false;
  Layout plain_, overlapped_;  // the workers point at these (stable: members, built once)
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<Worker> workers_;
  int finished_ = 0;
};

}  // namespace gradsync::sim
