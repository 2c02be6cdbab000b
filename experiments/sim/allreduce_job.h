// The all-reduce job: each rank's forward and backward, its buckets reduced one after another by
// the real collective's own steps (allreduce/plan/schedule.h) and choice of algorithm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "allreduce/plan/schedule.h"
#include "common/base/status.h"
#include "common/config/sync_decisions.h"
#include "experiments/sim/codec_costs.h"
#include "experiments/sim/engine/engine.h"
#include "experiments/sim/job.h"
#include "experiments/sim/sim.h"

namespace gradsync::sim {

// Each collective replays the real one's steps (allreduce/plan/schedule.h), with the algorithm
// the real collective would pick (SimulatedAllReduceAlgo): at each step a rank sends its range to
// `to` (the step's header included) and waits for the message of the same step from `from`,
// then sums it in; the shared-memory phases of shm and hier cost CPU on the host's ranks and wait
// for each other, not for the network.
class AllreduceJob {
 public:
  AllreduceJob(Job& job, Codecs& codecs) : j_(job), codecs_(codecs) {}
  // The buckets (readiness order), the codec costs of each, and the ranks' hosts.
  Status Build();
  // Rank 0's broadcast of the parameters, then every rank's first step.
  void Start();

 private:
  // What the communication thread reduces, one after another: the gradient's buckets, or
  // PowerSGD's two exchanges of plain floats (its factors: the codec's passes are their encode and
  // decode).
  struct Bucket {
    int64_t floats = 0;
    int last_tensor = 0;
    double encode_us = 0, decode_us = 0;  // before the collective, and after it (decode and sum)
    // What the collective moves: `count` elements of `elem` bytes all-reduced, or, when
    // gather_payload > 0, every rank's payload of that many bytes all-gathered.
    size_t count = 0, elem = 4, gather_payload = 0;
  };
  // One collective on one rank: its steps, their element size, and for an all-gather of
  // per-rank payloads their sizes (the wire bytes of AllGatherPlan's steps).
  struct Op {
    Plan plan;
    size_t elem = 4;
    std::vector<size_t> gather_sizes;  // empty: not an all-gather
  };
  struct Rank {
    int64_t clock = 0;
    Time step_start = 0;
    size_t next_bucket = 0;  // the next bucket the communication thread reduces
    size_t ready = 0;        // buckets backward has produced
    bool busy = false;       // the communication thread is reducing
    bool backward_done = false;
    Time comm_busy_us = 0, hidden_us = 0;
    // The current collective: its steps, the step it is at (-1 while reducing), what runs when
    // it is done, and the messages that arrived early.
    Op op;
    std::function<void()> done;
    int64_t op_seq = -1;  // the collectives this rank has started (every rank runs the same sequence)
    int k = 0;
    bool in_op = false;
    std::map<int64_t, int> arrived;  // Key(op, tag) -> messages
  };
  // A shared-memory phase's messages between the host's ranks (no network), by tag.
  static constexpr uint32_t kShmReduceTag = 0xfff1, kShmBroadcastTag = 0xfff2;

  // What the real collective runs for a bucket: the all-reduce of its floats (no codec, or
  // PowerSGD's factors), the all-reduce of a summable codec's payload (fp16 and bf16 halves,
  // random-k's floats), or the all-gather of every rank's payload.
  Op BucketOp(int r, const Bucket& b) const;
  // Rank r starts a collective; `done` runs after its last step.
  void RunOp(int r, Op op, std::function<void()> done);
  // The ranks of r's host.
  const std::vector<int>& HostOf(int r) const;
  // A step's message from `from` to `to` (0 bytes: through shared memory).
  void Post(int from, int to, uint32_t tag, uint64_t bytes);
  // Rank r's current step: a shared-memory phase, or its send and then its receive; past the last
  // step, the collective's end.
  void RunStep(int r);

  // A shared-memory phase among the host's ranks: they meet at the leader (a reduce or an
  // all-reduce needs every member's buffer, a broadcast the leader's result), each spends its
  // copies and sums on its own CPU (apply_ns_per_byte a pass: copy in and sum a share, then copy
  // out), and the region's bytes are counted as the real ShmGroup counts them.
  void ShmStep(int r, const PlanStep& st);
  // Step k of rank r goes on once `need` messages of `tag` have come: `ready` runs, then `us` of CPU.
  void Resume(int r, int k, int need, uint32_t tag, double us, std::function<void()> ready);
  void TryShm(int r);

  static int64_t Key(int64_t op, uint32_t tag) { return op * 1000000 + static_cast<int64_t>(tag); }
  // A message at rank r: the step that waits for it goes on.
  void Arrived(int r, int64_t key);
  // Rank r's step receives its message, if it has come, and sums it in.
  void TryAdvance(int r);

  // A training step: the forward, then the backward tensor by tensor.
  void BeginStep(int r);
  // Backward of tensor i in reverse order (i = 0 is the last tensor).
  void BackwardTensor(int r, int i);
  // The communication thread: the next ready bucket, one at a time.
  void Pump(int r);
  // A bucket reduced: its payloads decoded, then the next bucket or the step's end.
  void BucketDone(int r);
  // The step's end once backward, the straggler's delay and every bucket are done: the
  // optimizer, the row, the next step.
  void MaybeEndStep(int r);

  Job& j_;
  Codecs& codecs_;
  bool overlap_ = true, compress_ = false, summable_ = false, low_rank_ = false;
  // Local SGD / DiLoCo (sync_every): steps a round; a step that ends none reduces nothing, one
  // that ends a round takes the worker's update and the pseudo-gradient (a pass each) first.
  RoundSchedule rounds_;  // sync_every (every 0: no rounds), as PeriodicSync cuts them
  std::vector<Bucket> buckets_;
  std::vector<Rank> ranks_;
  std::map<int, Time> op_start_, backward_end_;
  SimAllReduceLayout layout_;
  struct ShmWait {
    int k = 0, need = 0;
    uint32_t tag = 0;
    double us = 0;
    std::function<void()> ready;
  };
  std::map<int, ShmWait> waits_;  // ranks in a shared-memory phase, waiting for the others
};

}  // namespace gradsync::sim
