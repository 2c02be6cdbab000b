#include "worker/ps_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/clock.h"
#include "common/sampler.h"
#include "worker/epoch.h"

namespace gradsync {

wire::JobConfig MakeJobConfig(const Model& model, const PsTrainOptions& o, int64_t total_steps,
                              int64_t steps_per_epoch) {
  wire::JobConfig job;
  for (const auto& t : model.layout()) {
    auto* spec = job.add_tensors();
    spec->set_name(t.name);
    spec->set_offset(static_cast<uint64_t>(t.offset));
    spec->set_size(static_cast<uint64_t>(t.size));
    spec->set_sparse(t.sparse);
  }
  job.set_num_params(static_cast<uint64_t>(model.num_params()));
  job.set_num_workers(o.num_workers);
  job.set_lr(o.train.lr.base);
  job.set_lr_schedule(o.train.lr.kind == LrSchedule::Kind::kCosine ? "cosine" : "constant");
  const LrSchedule lr = RunSchedule(o.train, total_steps, steps_per_epoch);
  job.set_total_steps(lr.total_steps);
  job.set_warmup_steps(lr.warmup_steps);
  job.set_warmup_start_lr(lr.warmup_start);
  job.set_momentum(o.train.optimizer.momentum);
  job.set_nesterov(o.train.optimizer.nesterov);
  job.set_weight_decay(o.train.optimizer.weight_decay);
  job.set_staleness_aware_lr(o.staleness_aware_lr);
  if (!o.compression.empty() && o.compression != "none") {
    job.set_compression(o.compression);
    job.set_compression_seed(o.train.seed);
    job.set_compress_pull(o.compress_pull);
  }
  return job;
}

PsTrainer::PsTrainer(const PsTrainOptions& options, Model* model, const Dataset* train, const Dataset* test,
                     MetricsWriter* metrics, PsClient* client, SchedulerClient* scheduler)
    : options_(options), model_(model), train_(train), test_(test), metrics_(metrics), client_(client),
      scheduler_(scheduler) {}

namespace {
// Sorted unique flat keys of the batch for the model's sparse tensors (keys index tensor 0's rows,
// which start at its offset).
void BatchKeys(const Model& model, const Batch& batch, std::vector<uint64_t>* keys) {
  keys->clear();
  for (const auto& t : model.layout()) {
    if (!t.sparse) continue;
    for (uint64_t k : batch.keys) keys->push_back(static_cast<uint64_t>(t.offset) + k);
  }
  std::sort(keys->begin(), keys->end());
  keys->erase(std::unique(keys->begin(), keys->end()), keys->end());
}
}  // namespace

Result<std::vector<EpochReport>> PsTrainer::Run(const std::function<void(const EpochReport&)>& on_epoch) {
  const auto& o = options_.train;
  const int rank = options_.rank, n_workers = options_.num_workers;
  ShardedSampler sampler(train_->n, n_workers, rank, o.seed);
  const int64_t steps_per_epoch = StepsPerEpoch(train_->n, n_workers, o.batch);
  int64_t total_steps = steps_per_epoch * o.epochs;
  if (o.max_steps > 0) total_steps = std::min(total_steps, o.max_steps);
  const double timeout = options_.request_timeout_s;
  RETURN_IF_ERROR(CheckDeviceTraining(*model_, o));
  if (!options_.compression.empty()) {
    RETURN_IF_ERROR(client_->SetCompression(options_.compression, o.seed, options_.error_feedback,
                                            options_.correction_momentum, options_.compress_pull));
  }

  std::vector<int> all_shards(static_cast<size_t>(scheduler_->table().servers_size()));
  for (size_t i = 0; i < all_shards.size(); ++i) all_shards[i] = static_cast<int>(i);
  int64_t start_clock = 0;
  if (scheduler_->rejoined()) {
    // A restarted worker in a running job: the shards say where to start (the open round, or
    // the slowest live worker's clock); it takes the largest and goes on from there with its
    // own shard of the data. The shards were initialized long ago.
    ASSIGN_OR_RETURN(int64_t suggested, client_->Join(all_shards, -1, timeout));
    ASSIGN_OR_RETURN(start_clock, client_->Join(all_shards, suggested, timeout));
    std::printf("worker %d: rejoined the job at step %lld of %lld\n", rank, static_cast<long long>(start_clock),
                static_cast<long long>(total_steps));
    std::fflush(stdout);
  } else {
    if (rank == 0) {
      RETURN_IF_ERROR(client_->Init(MakeJobConfig(*model_, options_, total_steps, steps_per_epoch), model_->params(), timeout)
                          .WithContext("initializing the shards"));
    }
    RETURN_IF_ERROR(scheduler_->Barrier("init", "workers", options_.barrier_timeout_s));
  }
  if (options_.after_init) options_.after_init();

  const bool sparse = std::any_of(model_->layout().begin(), model_->layout().end(),
                                  [](const TensorInfo& t) { return t.sparse; });
  const bool evaluates = rank == 0 && options_.evaluate;
  Straggler straggler(o.straggler, o.straggler_seed);
  const bool overlap = options_.overlap && !sparse && options_.compression.empty() && !model_->on_device() &&
                       model_->waits_for_params() && !straggler.active();
  if (options_.overlap && !overlap) {
    std::printf("worker %d: overlap off (it needs a dense CPU mlp/softmax model, no compression, no straggler)\n", rank);
    std::fflush(stdout);
  }
  if (overlap) client_->set_part_floats(options_.push_part_floats);
  // The model must not call into this trainer after Run.
  struct Unhook {
    Model* m;
    ~Unhook() {
      m->set_grad_ready({});
      m->set_param_wait({});
    }
  } unhook{model_};
  BatchBuffer buffer;
  std::vector<float> accum;
  std::vector<uint64_t> keys, push_keys;
  std::vector<float> push_values;
  std::vector<EpochReport> reports;
  Stopwatch run_clock;
  int64_t clock = start_clock;
  PsClient::RequestId pending_push = 0;
  EpochTotals totals;

  auto evaluate_and_report = [&](int epoch) -> Status {
    const auto t = client_->traffic();
    const auto st = scheduler_->traffic();
    const EpochClose close{.epoch = epoch, .step = clock, .steps_per_epoch = steps_per_epoch, .run_clock = &run_clock,
                           .evaluate = evaluates, .test = test_, .eval_batch = o.eval_batch,
                           .bytes_sent = t.bytes_sent + st.bytes_sent,
                           .bytes_received = t.bytes_received + st.bytes_received};
    ASSIGN_OR_RETURN(EpochReport r, CloseEpoch(close, totals, *model_, metrics_));
    reports.push_back(r);
    if (on_epoch) on_epoch(r);
    totals = EpochTotals();
    return OkStatus();
  };

  // A server that died and came back from its checkpoint: reconnect, tell it where this worker
  // is, and redo the step (the pushes it lost are counted on its side).
  auto recover = [&](const Status& failure) -> Status {
    const std::vector<int> shards = client_->shards_to_reconnect();
    if (options_.recovery_timeout_s <= 0 || failure.code() != StatusCode::kUnavailable || shards.empty()) return failure;
    std::printf("worker %d: step %lld: %s; waiting up to %.0f s for it to come back\n", rank, static_cast<long long>(clock),
                failure.message().c_str(), options_.recovery_timeout_s);
    std::fflush(stdout);
    RETURN_IF_ERROR(client_->Reconnect(options_.recovery_timeout_s).WithContext("after: " + failure.message()));
    RETURN_IF_ERROR(client_->Join(shards, clock, options_.recovery_timeout_s).status());
    pending_push = 0;  // what the dead shard had not applied is lost; the others applied it
    std::printf("worker %d: step %lld: going on with the restarted shard(s)\n", rank, static_cast<long long>(clock));
    std::fflush(stdout);
    return OkStatus();
  };

  // A training row with what every PS step reports (the caller adds the timings).
  auto step_row = [&](float loss) {
    MetricsRow row = StepRow(clock, steps_per_epoch, run_clock.Seconds(), loss);
    if (client_->last_version_lag() >= 0) row.version_lag = client_->last_version_lag();
    if (client_->last_clock_staleness() >= 0) row.clock_staleness = static_cast<double>(client_->last_clock_staleness());
    const auto t = client_->traffic();
    const auto st = scheduler_->traffic();
    row.bytes_sent = t.bytes_sent + st.bytes_sent;
    row.bytes_received = t.bytes_received + st.bytes_received;
    return row;
  };
  // An evaluation row in the middle of an epoch (--eval-every).
  auto evaluate_mid_epoch = [&]() -> Status {
    const auto t = client_->traffic();
    const auto st = scheduler_->traffic();
    const EpochClose at{.step = clock, .steps_per_epoch = steps_per_epoch, .run_clock = &run_clock,
                        .test = test_, .eval_batch = o.eval_batch,
                        .bytes_sent = t.bytes_sent + st.bytes_sent,
                        .bytes_received = t.bytes_received + st.bytes_received};
    return WriteEvaluationRow(at, totals.loss_sum / static_cast<double>(std::max<int64_t>(1, totals.steps)), *model_,
                              metrics_);
  };

  const int first_epoch = static_cast<int>(start_clock / steps_per_epoch);
  for (int epoch = first_epoch; epoch < o.epochs && clock < total_steps; ++epoch) {
    const std::vector<uint32_t> order = sampler.EpochIndices(epoch);
    for (int64_t s = epoch == first_epoch ? start_clock % steps_per_epoch : 0; s < steps_per_epoch && clock < total_steps;
         ++s) {
      const auto [begin, end] = BatchRange(s, steps_per_epoch, o.batch, static_cast<int64_t>(order.size()));
      const auto indices = std::span(order).subspan(begin, end - begin);
      // A sparse model's batch is gathered before the pull, which needs its keys.
      Batch batch;
      if (sparse) {
        batch = buffer.Gather(*train_, indices);
        BatchKeys(*model_, batch, &keys);
      }

      if (overlap) {
        // Pulls in forward order, waited for layer by layer inside forward; pushes tensor by
        // tensor inside backward. A failed pull stops the step before anything is pushed, and
        // the step is redone once the shard is back.
        double blocked_ms = 0, compute_ms = 0, hidden_ms = 0;
        float loss = 0;
        bool evaluated = false;  // a redone step does not evaluate twice
        for (int attempt = 0;; ++attempt) {
          Status failed;
          std::vector<PsClient::RequestId> ids;
          std::vector<bool> waited;
          // The hidden part of communication, to layer granularity: the model calls back at
          // every layer boundary; a stretch of computation between two of them counts as
          // hidden when communication was in progress at both its ends (a lower bound).
          double seg_start = -1;
          bool seg_busy = false;
          hidden_ms = 0;
          auto boundary = [&](bool computed) {
            client_->Poll();
            const double now = run_clock.Millis();
            const bool busy = client_->InFlight();
            if (computed && seg_start >= 0 && seg_busy && busy) hidden_ms += now - seg_start;
            seg_start = now;
            seg_busy = busy;
          };
          auto wait_tensor = [&](size_t t) {
            if (!failed.ok() || t >= ids.size() || ids[t] == 0 || waited[t]) return;
            waited[t] = true;
            boundary(true);
            Stopwatch w;
            failed = client_->Wait(ids[t], timeout).WithContext("pull " + std::to_string(clock));
            blocked_ms += w.Millis();
            boundary(false);  // waiting is not computing
          };
          Stopwatch step_clock;
          blocked_ms = 0;
          {
            Stopwatch w;
            ids = client_->PullTensors(clock, model_->params());
            waited.assign(ids.size(), false);
            // The previous push's parts must be out of the gradient buffer before backward.
            if (pending_push) failed = client_->Wait(pending_push, timeout).WithContext("push " + std::to_string(clock - 1));
            pending_push = 0;
            blocked_ms += w.Millis();
          }
          const bool epoch_end = s == 0 && epoch > 0;
          const bool mid_eval = evaluates && EvaluateMidEpoch(o.eval_every, clock, steps_per_epoch);
          if (epoch_end || mid_eval) {
            for (size_t t = 0; t < ids.size(); ++t) wait_tensor(t);  // evaluation reads every parameter
          }
          if (failed.ok() && epoch_end && !evaluated) RETURN_IF_ERROR(evaluate_and_report(epoch));
          if (failed.ok() && mid_eval && !evaluated) RETURN_IF_ERROR(evaluate_mid_epoch());
          if (failed.ok()) evaluated = true;
          if (options_.step_hook) options_.step_hook(clock);
          bool pushing = false, diverged = false;
          model_->set_param_wait(wait_tensor);
          model_->set_grad_ready([&](size_t t) {
            if (!failed.ok() || diverged) return;  // parameters missing, or nothing sane to push
            boundary(true);
            if (!pushing) {
              // The first tensor backward reports is the last layer's, whose gradient a
              // non-finite loss makes non-finite: a diverged step sends no part at all (as the
              // sequential path checks the loss before its push), and no shard takes it in.
              if (!AllFinite(model_->grad(t))) {
                diverged = true;
                return;
              }
              client_->BeginPush(clock, model_->grads());
              pushing = true;
            }
            client_->PushReady(t);
            boundary(false);
          });
          step_clock.Reset();
          const double blocked_before = blocked_ms;
          boundary(false);
          if (failed.ok()) loss = ComputeGradients(*model_, *train_, indices, o.micro_batch, buffer, accum);
          boundary(true);  // the last layer's backward
          model_->set_param_wait({});
          model_->set_grad_ready({});
          for (size_t t = 0; t < ids.size(); ++t) wait_tensor(t);  // every request answered or failed
          compute_ms = std::max(0.0, step_clock.Millis() - (blocked_ms - blocked_before));
          if (failed.ok() && (diverged || !std::isfinite(loss))) {
            return AbortedError("training diverged: loss is " + std::to_string(loss) + " at step " + std::to_string(clock));
          }
          if (failed.ok()) {
            Stopwatch w;
            if (!pushing) client_->BeginPush(clock, model_->grads());
            pending_push = client_->FinishPush();
            blocked_ms += w.Millis();
            break;
          }
          if (attempt >= 3) return failed;  // (nothing was pushed: a failed pull stops every part)
          RETURN_IF_ERROR(recover(failed));
        }
        ++clock;
        const double wait_ms = std::min(blocked_ms, client_->last_wait_ms());
        totals.AddStep(loss, static_cast<int64_t>(indices.size()), (compute_ms + blocked_ms) / 1e3);
        if (metrics_ && o.log_every > 0 && clock % o.log_every == 0) {
          MetricsRow row = step_row(loss);
          row.compute_ms = compute_ms;
          row.comm_ms = blocked_ms - wait_ms + hidden_ms;  // exposed + hidden, as all-reduce's
          row.wait_ms = wait_ms;
          row.hidden_ms = hidden_ms;
          RETURN_IF_ERROR(metrics_->Write(row));
        }
        continue;
      }

      Stopwatch comm;
      for (int attempt = 0;; ++attempt) {
        Status st = [&]() -> Status {
          ASSIGN_OR_RETURN(PsClient::RequestId pull, client_->Pull(clock, model_->params(), keys));
          RETURN_IF_ERROR(client_->Wait(pull, timeout).WithContext("pull " + std::to_string(clock)));
          if (pending_push) RETURN_IF_ERROR(client_->Wait(pending_push, timeout).WithContext("push " + std::to_string(clock - 1)));
          return OkStatus();
        }();
        if (st.ok()) break;
        if (attempt >= 3) return st;
        RETURN_IF_ERROR(recover(st));
      }
      pending_push = 0;
      const double comm_ms = comm.Millis();
      const double wait_ms = std::min(comm_ms, client_->last_wait_ms());
      const bool epoch_end = s == 0 && epoch > 0;
      const bool mid_eval = evaluates && EvaluateMidEpoch(o.eval_every, clock, steps_per_epoch);
      if ((epoch_end || mid_eval) && evaluates && (sparse || options_.compress_pull)) {
        // Refresh every weight (sparse: not only this batch's keys; compressed pulls: the exact
        // parameters, not this worker's approximation).
        ASSIGN_OR_RETURN(PsClient::RequestId full, client_->Pull(clock, model_->params(), {}, true));
        RETURN_IF_ERROR(client_->Wait(full, timeout).WithContext("evaluation pull"));
      }
      // A device model computes on its copy: upload what was pulled (enqueued; ForwardBackward's
      // wait covers it, and params() is not written again before that).
      RETURN_IF_ERROR(model_->ParamsToDevice());
      if (epoch_end) RETURN_IF_ERROR(evaluate_and_report(epoch));
      if (mid_eval) RETURN_IF_ERROR(evaluate_mid_epoch());

      if (options_.step_hook) options_.step_hook(clock);
      Stopwatch compute;
      const float loss = ComputeGradients(*model_, *train_, indices, o.micro_batch, buffer, accum, sparse ? &batch : nullptr);
      if (!std::isfinite(loss)) {
        return AbortedError("training diverged: loss is " + std::to_string(loss) + " at step " + std::to_string(clock));
      }
      push_keys.clear();
      push_values.clear();
      for (size_t t = 0; t < model_->layout().size(); ++t) {
        const TensorInfo& ti = model_->layout()[t];
        if (!ti.sparse) continue;
        const SparseGrad& g = model_->sparse_grad(t);
        for (size_t i = 0; i < g.keys.size(); ++i) {
          push_keys.push_back(static_cast<uint64_t>(ti.offset) + g.keys[i]);
          push_values.push_back(g.values[i]);
        }
      }
      RETURN_IF_ERROR(model_->GradsToHost());  // device models: the push reads the pinned mirror
      const double compute_ms = compute.Millis();
      const double delay_ms = straggler.Sleep(compute_ms);
      Stopwatch push_clock;
      ASSIGN_OR_RETURN(pending_push, client_->Push(clock, model_->grads(), push_keys, push_values));
      ++clock;
      totals.AddStep(loss, static_cast<int64_t>(indices.size()), (compute_ms + comm_ms) / 1e3 + push_clock.Seconds());
      if (metrics_ && o.log_every > 0 && clock % o.log_every == 0) {
        MetricsRow row = step_row(loss);
        row.compute_ms = compute_ms;
        row.comm_ms = comm_ms - wait_ms + push_clock.Millis();
        row.wait_ms = wait_ms;
        row.delay_ms = delay_ms;
        RETURN_IF_ERROR(metrics_->Write(row));
      }
    }
  }
  if (pending_push) {
    Status st = client_->Wait(pending_push, timeout).WithContext("last push");
    if (!st.ok()) RETURN_IF_ERROR(recover(st));  // a restarted shard lost it: counted there
  }
  // Every worker's last push is applied before anyone passes this barrier.
  RETURN_IF_ERROR(scheduler_->Barrier("trained", "workers", options_.barrier_timeout_s));
  if (evaluates) {
    ASSIGN_OR_RETURN(PsClient::RequestId pull, client_->Pull(clock, model_->params(), {}, /*full=*/true));
    RETURN_IF_ERROR(client_->Wait(pull, timeout).WithContext("final pull"));
    RETURN_IF_ERROR(model_->ParamsToDevice());
  }
  RETURN_IF_ERROR(evaluate_and_report(static_cast<int>((clock + steps_per_epoch - 1) / steps_per_epoch)));
  return reports;
}

}  // namespace gradsync
