#include "experiments/sim/allreduce_job.h"

#include <algorithm>
#include <utility>

#include "allreduce/plan/algorithm.h"
#include "common/config/train_config.h"

namespace gradsync::sim {

Status AllreduceJob::Build() {
  const auto& t = j_.plan.run.train();
  const int N = j_.plan.workers;
  rounds_ = {.every = t.sync_every(), .total_steps = j_.s.steps};
  compress_ = codecs_.on();
  low_rank_ = compress_ && codecs_.factored();
  summable_ = compress_ && !low_rank_ && codecs_.summable();
  // AllreduceOverlaps, as the real worker decides (worker/sync/sync_factory.h): a compressed gradient is
  // averaged after backward, and the rounds' exchange is one all-reduce after the step;
  // --overlap's default off where a host runs more workers than host_cores (OverlapOf, on the
  // hosts the real job would make).
  overlap_ = AllreduceOverlaps(j_.OverlapFactsOf(compress_));
  const int last = static_cast<int>(j_.s.tensors.size()) - 1;
  if (low_rank_) {
    // PowerSGD's LowRankAverager: First, the all-reduce of the P factors and the whole tensors,
    // Second, the all-reduce of the Q factors, Finish.
    ASSIGN_OR_RETURN(const LowRankCost c, codecs_.LowRank(j_.s.shapes, t.threads()));
    buckets_.push_back({static_cast<int64_t>(c.first_floats), last, c.first_us, 0});
    buckets_.push_back({static_cast<int64_t>(c.second_floats), last, c.second_us, c.finish_us});
    if (buckets_.back().floats == 0) {  // no matrix: the whole tensors alone, in one all-reduce
      buckets_.front().decode_us = c.finish_us;
      buckets_.pop_back();
    }
  } else {
    // Buckets in readiness order (the last tensor first): the first of first_bucket_mib, then bucket_mib.
    std::vector<int64_t> rev(j_.s.tensors.rbegin(), j_.s.tensors.rend());
    const double first = t.first_bucket_mib() * 1024 * 1024 / 4, rest = t.bucket_mib() * 1024 * 1024 / 4;
    int64_t filled = 0;
    buckets_.push_back({0, 0});
    for (size_t i = 0; i < rev.size(); ++i) {
      const double cap = buckets_.size() == 1 ? first : rest;
      if (filled > 0 && static_cast<double>(filled + rev[i]) > cap) {
        buckets_.push_back({0, 0});
        filled = 0;
      }
      buckets_.back().floats += rev[i];
      buckets_.back().last_tensor = static_cast<int>(i);  // ready once backward has produced tensor i (reverse order)
      filled += rev[i];
    }
  }
  const size_t summed_elem = summable_ ? codecs_.summed_element_bytes() : 4;
  for (auto& b : buckets_) {
    b.count = static_cast<size_t>(b.floats);
    if (!compress_ || low_rank_) continue;
    ASSIGN_OR_RETURN(const CodecCost c, codecs_.Cost(static_cast<size_t>(b.floats)));
    b.encode_us = c.encode_us;
    if (summable_) {  // the payload's elements summed by the all-reduce
      b.decode_us = c.decode_us;
      b.elem = summed_elem;
      b.count = c.payload / summed_elem;
    } else {  // every rank's payload all-gathered, decoded and added
      ASSIGN_OR_RETURN(b.decode_us, codecs_.GatherDecodeUs(static_cast<size_t>(b.floats), N, j_.s.apply_ns_per_byte));
      b.gather_payload = c.payload;
    }
  }
  layout_ = SimulatedAllReduceLayout(j_.plan, j_.s);
  ranks_.resize(static_cast<size_t>(N));
  return OkStatus();
}

void AllreduceJob::Start() {
  // Rank 0's parameters to everyone, along the ring, segment by segment (Collective::Broadcast).
  const int N = j_.plan.workers;
  const size_t bytes = 4 * static_cast<size_t>(j_.s.params);
  for (int r = 0; r < N; ++r) {
    Op op;
    op.plan = BroadcastPlan(r, N, 0, bytes);
    op.elem = 1;
    RunOp(r, std::move(op), [this, r] { BeginStep(r); });
  }
}

AllreduceJob::Op AllreduceJob::BucketOp(int r, const Bucket& b) const {
  const int N = j_.plan.workers;
  Op op;
  if (b.gather_payload == 0) {
    op.elem = b.elem;
    op.plan = AllReducePlan(ResolveAllReduceAlgo(layout_.setting, b.count * b.elem, N), r, N, b.count, layout_.hosts);
    return op;
  }
  op.plan = AllGatherPlan(r, N);
  op.elem = 1;
  op.gather_sizes.assign(static_cast<size_t>(N), b.gather_payload);
  return op;
}

void AllreduceJob::RunOp(int r, Op op, std::function<void()> done) {
  auto& rk = ranks_[static_cast<size_t>(r)];
  rk.op = std::move(op);
  rk.done = std::move(done);
  rk.op_seq++;
  rk.k = 0;
  rk.in_op = true;
  RunStep(r);
}

const std::vector<int>& AllreduceJob::HostOf(int r) const {
  for (const auto& h : layout_.hosts)
    if (std::find(h.begin(), h.end(), r) != h.end()) return h;
  return layout_.hosts.front();
}

void AllreduceJob::Post(int from, int to, uint32_t tag, uint64_t bytes) {
  const int64_t key = Key(ranks_[static_cast<size_t>(from)].op_seq, tag);
  if (bytes == 0) {  // through shared memory
    j_.engine.At(j_.engine.now(), [this, to, key] { Arrived(to, key); });
    return;
  }
  j_.rec[static_cast<size_t>(from)].sent += bytes;
  j_.rec[static_cast<size_t>(to)].received += bytes;
  j_.net->Send(from, to, bytes, [this, to, key] { Arrived(to, key); });
}

void AllreduceJob::RunStep(int r) {
  auto& rk = ranks_[static_cast<size_t>(r)];
  if (rk.k >= static_cast<int>(rk.op.plan.size())) {
    rk.in_op = false;
    auto done = std::move(rk.done);
    rk.done = nullptr;
    done();
    return;
  }
  const PlanStep& st = rk.op.plan[static_cast<size_t>(rk.k)];
  if (st.shm != PlanStep::Shm::kNone) return ShmStep(r, st);
  if (st.to >= 0) {
    const uint64_t bytes = rk.op.gather_sizes.empty() ? StepWireBytes(st, rk.op.elem)
                                                      : AllGatherWireBytes(st, j_.plan.workers, rk.op.gather_sizes);
    Post(r, st.to, st.tag, bytes);
  }
  if (st.from < 0) {
    rk.k++;
    RunStep(r);
    return;
  }
  TryAdvance(r);
}

void AllreduceJob::ShmStep(int r, const PlanStep& st) {
  auto& rk = ranks_[static_cast<size_t>(r)];
  const auto& host = HostOf(r);
  const int index = static_cast<int>(std::find(host.begin(), host.end(), r) - host.begin());
  const int m = static_cast<int>(host.size()), leader = host.front();
  const ShmBytes moved = SharedMemoryBytes(st.shm, index, m, st.recv.size(), rk.op.elem);
  j_.rec[static_cast<size_t>(r)].shm_sent += moved.sent;
  j_.rec[static_cast<size_t>(r)].shm_received += moved.received;
  const double pass_us = j_.s.apply_ns_per_byte * static_cast<double>(st.recv.size() * rk.op.elem) / 1e3;
  const int k = rk.k;
  rk.k = -1;
  auto hand_back = [this, r, host] {
    for (int x : host)
      if (x != r) Post(r, x, kShmBroadcastTag, 0);
  };
  if (st.shm == PlanStep::Shm::kBroadcast) {
    if (r == leader) {
      hand_back();
      return Resume(r, k, 0, kShmBroadcastTag, 0, nullptr);
    }
    return Resume(r, k, 1, kShmBroadcastTag, pass_us, nullptr);
  }
  const bool all_reduce = st.shm == PlanStep::Shm::kAllReduce;
  j_.cpus->Run(r, 2 * pass_us, [this, r, k, m, leader, all_reduce, pass_us, hand_back] {
    if (r == leader)
      return Resume(r, k, m - 1, kShmReduceTag, all_reduce ? pass_us : 0,
                    all_reduce ? std::function<void()>(hand_back) : nullptr);
    Post(r, leader, kShmReduceTag, 0);
    if (all_reduce) return Resume(r, k, 1, kShmBroadcastTag, pass_us, nullptr);
    Resume(r, k, 0, kShmReduceTag, 0, nullptr);  // a member of the hierarchy waits at the broadcast
  });
}

void AllreduceJob::Resume(int r, int k, int need, uint32_t tag, double us, std::function<void()> ready) {
  waits_[r] = {k, need, tag, us, std::move(ready)};
  ranks_[static_cast<size_t>(r)].k = -2;  // waiting in a shared-memory phase
  TryShm(r);
}

void AllreduceJob::TryShm(int r) {
  auto& rk = ranks_[static_cast<size_t>(r)];
  auto w = waits_.find(r);
  if (rk.k != -2 || w == waits_.end()) return;
  if (w->second.need > 0) {
    auto it = rk.arrived.find(Key(rk.op_seq, w->second.tag));
    if (it == rk.arrived.end() || it->second < w->second.need) return;
    rk.arrived.erase(it);
  }
  ShmWait wait = std::move(w->second);
  waits_.erase(w);
  rk.k = -1;
  if (wait.ready) wait.ready();
  j_.cpus->Run(r, wait.us, [this, r, k = wait.k] {
    ranks_[static_cast<size_t>(r)].k = k + 1;
    RunStep(r);
  });
}

void AllreduceJob::Arrived(int r, int64_t key) {
  ranks_[static_cast<size_t>(r)].arrived[key]++;
  TryAdvance(r);
  TryShm(r);
}

void AllreduceJob::TryAdvance(int r) {
  auto& rk = ranks_[static_cast<size_t>(r)];
  if (!rk.in_op || rk.k < 0 || rk.k >= static_cast<int>(rk.op.plan.size())) return;
  const PlanStep& st = rk.op.plan[static_cast<size_t>(rk.k)];
  if (st.from < 0 || st.shm != PlanStep::Shm::kNone) return;
  auto it = rk.arrived.find(Key(rk.op_seq, st.tag));
  if (it == rk.arrived.end()) return;
  if (--it->second == 0) rk.arrived.erase(it);
  const int k = rk.k;
  rk.k = -1;  // reducing
  const double reduce_bytes = st.reduce ? static_cast<double>(st.recv.size() * rk.op.elem) : 0;
  j_.cpus->Run(r, j_.s.apply_ns_per_byte * reduce_bytes / 1e3, [this, r, k] {
    auto& q = ranks_[static_cast<size_t>(r)];
    q.k = k + 1;
    RunStep(r);
  });
}

void AllreduceJob::BeginStep(int r) {
  auto& rk = ranks_[static_cast<size_t>(r)];
  rk.step_start = j_.engine.now();
  rk.next_bucket = 0;
  rk.ready = 0;
  rk.backward_done = false;
  rk.comm_busy_us = rk.hidden_us = 0;
  j_.cpus->Run(r, 1e3 * j_.s.compute_ms * j_.s.forward_fraction, [this, r] { BackwardTensor(r, 0); });
}

void AllreduceJob::BackwardTensor(int r, int i) {
  const int64_t total = j_.s.params;
  const int64_t size = j_.s.tensors[j_.s.tensors.size() - 1 - static_cast<size_t>(i)];
  const double us =
      1e3 * j_.s.compute_ms * (1 - j_.s.forward_fraction) * static_cast<double>(size) / static_cast<double>(total);
  j_.cpus->Run(r, us, [this, r, i] {
    auto& rk = ranks_[static_cast<size_t>(r)];
    while (rk.ready < buckets_.size() && buckets_[rk.ready].last_tensor <= i) rk.ready++;
    const bool last = i + 1 >= static_cast<int>(j_.s.tensors.size());
    double local_update_ms = 0;  // rounds: the worker's own update (and at a round's end Δ), on its CPU
    if (last && rounds_.every > 0) {
      if (!rounds_.EndsRound(rk.clock)) {
        rk.next_bucket = buckets_.size();  // nothing to reduce: the step's update alone (MaybeEndStep)
      } else {
        // The worker's update (its optimizer's cost) and Δ = global - own, then the buckets of Δ.
        const double pass_us = j_.s.apply_ns_per_byte * 4 * static_cast<double>(j_.s.params) / 1e3;
        const double update_us = j_.s.inner_optimizer_us + pass_us;
        local_update_ms = update_us / 1e3;
        rk.busy = true;
        j_.cpus->Run(r, update_us, [this, r] {
          ranks_[static_cast<size_t>(r)].busy = false;
          Pump(r);
        });
      }
    } else if (overlap_ || last) {
      Pump(r);
    }
    if (!last) {
      BackwardTensor(r, i + 1);
      return;
    }
    rk.backward_done = true;
    const double delay = j_.stragglers[static_cast<size_t>(r)].DelayMs(j_.s.compute_ms);
    j_.rec[static_cast<size_t>(r)].delay_ms = delay;
    j_.rec[static_cast<size_t>(r)].compute_ms = j_.s.compute_ms + local_update_ms;
    backward_end_[r] = j_.engine.now() + delay * 1e3;
    j_.engine.At(j_.engine.now() + delay * 1e3, [this, r] { MaybeEndStep(r); });
  });
}

void AllreduceJob::Pump(int r) {
  auto& rk = ranks_[static_cast<size_t>(r)];
  if (rk.busy || rk.next_bucket >= rk.ready) return;
  if (!overlap_ && !rk.backward_done && rk.ready < buckets_.size()) return;
  rk.busy = true;
  op_start_[r] = j_.engine.now();
  // The collective starts once encoded: messages that arrive before wait in `arrived`.
  j_.cpus->Run(r, buckets_[rk.next_bucket].encode_us, [this, r] {
    auto& q = ranks_[static_cast<size_t>(r)];
    RunOp(r, BucketOp(r, buckets_[q.next_bucket]), [this, r] { BucketDone(r); });
  });
}

void AllreduceJob::BucketDone(int r) {
  auto& rk = ranks_[static_cast<size_t>(r)];
  const Time started = op_start_[r];
  j_.cpus->Run(r, buckets_[rk.next_bucket].decode_us, [this, r, started] {
    auto& q = ranks_[static_cast<size_t>(r)];
    q.comm_busy_us += j_.engine.now() - started;
    if (!q.backward_done) q.hidden_us += j_.engine.now() - started;
    q.op = {};
    q.busy = false;
    q.next_bucket++;
    if (q.next_bucket >= buckets_.size()) {
      MaybeEndStep(r);
      return;
    }
    Pump(r);
  });
}

void AllreduceJob::MaybeEndStep(int r) {
  auto& rk = ranks_[static_cast<size_t>(r)];
  if (!rk.backward_done || rk.next_bucket < buckets_.size() || j_.engine.now() < backward_end_[r]) return;
  if (rk.busy) return;
  // The optimizer, then the row (rounds: a step that ends none runs the worker's own, whose cost
  // is its kind's; one that ends a round the outer SGD).
  const int64_t total = j_.s.params;
  const double pass_us = j_.s.apply_ns_per_byte * 4 * static_cast<double>(total) / 1e3;
  j_.cpus->Run(r, rounds_.every > 0 && !rounds_.EndsRound(rk.clock) ? j_.s.inner_optimizer_us : pass_us, [this, r] {
    auto& q = ranks_[static_cast<size_t>(r)];
    auto& rec = j_.rec[static_cast<size_t>(r)];
    rec.comm_ms = q.comm_busy_us / 1e3;
    rec.hidden_ms = q.hidden_us / 1e3;
    rec.wait_ms = 0;
    j_.worker_steps++;
    q.clock++;
    (void)j_.Row(r, q.clock);
    if (r == 0 && (j_.EvalDue(q.clock) || q.clock >= j_.s.steps)) (void)j_.EvalRow(q.clock);
    if (q.clock < j_.s.steps) BeginStep(r);
  });
}

}  // namespace gradsync::sim
