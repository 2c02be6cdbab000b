#!/usr/bin/env bash
# Shows that tests fail when the property they name does not hold: for each mutation below, breaks
# the code on purpose (one exact text replacement), rebuilds what the test needs in build/, runs
# the test, and restores the file. Prints one row per mutation: the mutation, the test, and
# "red" (the named test failed, and its output holds the row's message: it failed on its own
# assertion) or why not: "GREEN" (the test missed it), "red elsewhere" (ctest failed, but not on
# that test, or that test timed out), "red without its message" (it failed some other way: a
# crash, another assertion). Exits non-zero unless every row is red, or when a mutation's text
# was not found (the code moved: update the table). Run it with nothing else building in build/;
# build/ is rebuilt at the end from the restored sources.
# Usage: scripts/mutation-table.sh [NAME...] (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d build ]] || { echo "mutation-table: build/ is missing: run scripts/build.sh first" >&2; exit 2; }
if ! git diff --quiet; then
  echo "mutation-table: the working tree has changes; commit or stash them first (each mutation is undone with git checkout)" >&2
  exit 2
fi

# name | file | text | replacement | make targets | ctest -R regex
mutations=(
  "nan-compares-close|common/base/numeric/tensor.cc|    if (!std::isfinite(x) \|\| !std::isfinite(y)) return std::numeric_limits<double>::infinity();|    (void)0;|common_test|TensorTest.NonFiniteValuesNeverCompareClose|tensor_test.cc:"
  "trace-offset-ignored|common/obs/trace.cc|  r.out.offset_us.store(clock_offset_us);|  r.out.offset_us.store(0);|common_test|TraceTest.OffRecordsNothingAndOnWritesChromeTraceEvents|trace_test.cc:"
  "controller-overstates-clocks|common/ps/worker_clocks.cc|    if (live_[w]) m = std::min(m, pushed_[w]);|    if (live_[w]) m = std::min(m, pushed_[w] + 1);|server_test|ConsistencyTest.SspBoundsTheGapToTheSlowestLiveWorker$|c.CanAnswerPull(0, 4)"
  "no-checkpoint-after-init|server/server_checkpoints.cc|  if (!checkpointer_.Due(updated, now)) return;|  if (!checkpointer_.Due(updated, now) \|\| true) return;|gradsync-server ps_binary_test|Modes/KilledServerTest.ComesBackFromItsCheckpointAndTheRunCompletes/bsp\$|fault_test.cc:"
  "ps-fp16-gradient-zeroed|python/gradsync/torch/amp.py|                grads.mul_(1.0 / self._scale)|                grads.mul_(0.0)|gradsync_python|python.test_precision|AssertionError"
  "backup-acks-ignored|server/replication/replication.cc|    if (!link.refused) all = std::min(all, link.acked);|    if (link.refused) all = std::min(all, link.acked);|gradsync-server ps_binary_test|FaultTest.APushIsAcknowledgedOnlyOnceItsBackupHoldsIt|fault_test.cc:"
  "backup-acks-ignored-unit|server/replication/replication.cc|    if (!link.refused) all = std::min(all, link.acked);|    if (link.refused) all = std::min(all, link.acked);|server_test|ReplicatorTest.AReplyWaitsForEveryLiveBackupAndASilentOneHoldsItUntilDropped|replication_test.cc:"
  "backup-skips-asp-pushes|server/replication/replication.cc|  c.core->round().TakeChunk(w, std::move(chunk), h.push.scale, h.push.counts, h.push.lr, shard);|  if (h.seq % 50 != 0) c.core->round().TakeChunk(w, std::move(chunk), h.push.scale, h.push.counts, h.push.lr, shard);|gradsync-server ps_binary_test|Modes/ReplicatedServerTest.ABackupTakesOverAndNothingIsLost/asp\$|fault_test.cc:"
  "frame-written-into-closed-channel|common/net/data_channel.cc|  if (PeerClosed()) return UnavailableError(|  if (false && PeerClosed()) return UnavailableError(|ps_test|PsJobTest.ADataChannelThatEndsBetweenPushesFallsBackToZeroMq|ps_job_test.cc:"
  "dead-workers-lane-kept|server/server_lifecycle.cc|      push_pull_.DetachWorker(n.rank());|      (void)0;|gradsync-server ps_binary_test|FaultTest.SharedMemoryOfADeadProcessIsLetGoByEveryOther|fault_test.cc:"
  "lane-pull-answer-off|server/channels/lane_channel.cc|    reply.part = reply.parts > 1 ? static_cast<int>(i) : 0;|    area[one.begin - base] += 1e-3f; reply.part = reply.parts > 1 ? static_cast<int>(i) : 0;|gradsync-server ps_binary_test|Modes/ChannelFaultTest.EveryChannelEndsOnTheSameBitsThroughAWorkersDeathAndAShardsTakeover/bsp\$|fault_test.cc:"
  "plan-tree-stores-instead-of-sums|allreduce/plan/tree.cc|    if (rank + mask < n) plan.push_back(RecvStep(level, rank + mask, all, /*reduce=*/true));|    if (rank + mask < n) plan.push_back(RecvStep(level, rank + mask, all, /*reduce=*/false));|allreduce_test|Algorithms/PlanTest.EveryRankEndsWithTheSumAndEverySendIsReceived/tree\$|plan_test.cc:"
  "sim-choice-ignores-shared-memory|experiments/sim/settings.cc|  l.setting.shared_memory = s.allreduce_shm && per_host > 1;|  l.setting.shared_memory = false;|experiments_test|SimAllReduceChoiceTest.ItIsWhatRingCollectiveRanOnThisMachine|sim_choice_test.cc:"
  "sim-gather-decode-timed-here|experiments/sim/codec_costs.cc|  if (gather_decode_per_float_ >= 0) return gather_decode_per_float_ * static_cast<double>(n) * payloads;|  if (gather_decode_per_float_ < 0) return gather_decode_per_float_ * static_cast<double>(n) * payloads;|experiments_test|SimCodecTimesTest.WithoutDecodeSpansTheCodecIsTimedHere|sim_codec_test.cc:"
  "lost-updates-not-counted|server/server_lifecycle.cc|      stats_.lost_updates += *lost;|      stats_.lost_updates += 0;|gradsync-server ps_binary_test|FaultTest.AServerKilledBeforeItsFirstIntervalComesBack$|the shard counted no update lost"
  "powersgd-residual-dropped|compression/powersgd.cc|      for (size_t i = 0; i < n; ++i) m[i] = g[i] + e[i];|      (void)e; for (size_t i = 0; i < n; ++i) m[i] = g[i];|compression_test|PowerSgdTest.EachStepApproximatesTheGradientPlusTheLastResidual|rank-2 approximation of its gradient plus the last residual"
  "rounds-outer-step-not-applied|server/shard/shard_round.cc|  shard.Apply(c.segments, c.keys, c.values(), scale, counts, lr, c.absent);|  shard.Apply(c.segments, c.keys, c.values(), 0.0f * scale, counts, lr, c.absent);|ps_test|PeriodicTest.AspAndSspRulesApplyToRounds|the shards' parameters are not the rounds'"
  "rounds-outer-step-sign|worker/sync/periodic_sync.cc|delta[i] = global[i] - own[i];|delta[i] = own[i] - global[i];|ps_test|PeriodicTest.AspAndSspRulesApplyToRounds|the shards' parameters are not the rounds'"
  "dc-asgd-sign-flipped|server/shard/transform/delay_compensation.cc|        out[k] = g + lambda * g * g * (now[i] - was[i]);|        out[k] = g - lambda * g * g * (now[i] - was[i]);|ps_test|DelayCompensationTrainTest.TheShardAppliesTheCorrectedGradientOfTheFormula|the shard did not apply g + lambda * g * g * (w_now - w_pulled)"
  "busy-poll-ignored|worker/ps/client/ps_requests.h|  void set_wait_policy(const WaitPolicy& policy) { wait_ = policy; }|  void set_wait_policy(const WaitPolicy& policy) { (void)policy; }|ps_test|BusyPollTest.AWaitThatPollsKeepsItsTimeoutAndTakesTheReplyWhenItComes|but its waits never polled"
  "shm-busy-poll-ignored|allreduce/shm/shm_group.h|    wait_ = policy;|    (void)policy;|ps_test|BusyPollTest.ASharedMemoryBarrierPollsOnlyWhenAsked|but its barrier never polled"
  "ps-params-not-set|python/gradsync/torch/collectives.py|                o._gs_sync.set_parameters()|                pass|gradsync_python|python.test_resume_horovod|the resumed job differs from the uninterrupted one"
  "shard-params-set-ignored|server/shard/kv/kv_shard.cc|  std::vector<float>& own = values_.Own();  // a pull reply may still be sending the old values|  std::vector<float> own(params.size());  // a pull reply may still be sending the old values|ps_test|Optimizers/ResumeTest.AFreshJobGivenTheParametersAfterItStartedGoesOnBitForBit/Adam$|the resumed job's parameters differ from the job that never stopped"
  "gpu-error-read-as-no-device|tests/support/gpu_gate.cc|\|\| f.count_error == kCudaErrorNoDevice \|\||\|\| f.count_error != kCudaSuccess \|\||gpu_gate_test|GpuGateTest.AnErrorOtherThanNoDeviceFailsUnderCi|GpuGate::kFail"
  "gpu-skip-where-nvidia-smi-lists-one|tests/support/gpu_gate.cc|  if (!f.smi_gpu.empty()) {|  if (false) {|gpu_gate_test|GpuGateTest.ASkipWhereNvidiaSmiListsAGpuFails|GpuGate::kFail"
  "dataset-cache-lock-noop|common/data/dataset_cache.cc|  while (::flock(fd, LOCK_EX \| LOCK_NB) != 0) {|  while (false) {|common_test|DatasetCacheTest.TwoProcessesLoadingAtOnceWriteOneFileUnderTheLockAndShareItsPages|processes that wrote the cache file"
  "parameter-guard-noop|python/gradsync/torch/guard.py|    if _PENDING and func not in _METADATA:|    if False:|gradsync_python|python.test_stale_reads|it did not wait for its pull"
  "frontend-predivide-not-undone|python/gradsync/torch/strategies.py|            opt._gs_flat_grads.mul_(self.predivide)|            pass|gradsync_python|python.test_arithmetic|predivide, step 1: max"
  "frontend-fp16-as-bf16|python/gradsync/torch/compression.py|    fp16 = Compressor(\"fp16\", \"fp16\")|    fp16 = Compressor(\"bf16\", \"fp16\")|gradsync_python|python.test_arithmetic|fp16: error"
  "frontend-adasum-as-average|python/gradsync/torch/strategies.py|        if op is Adasum and job.size > 1:|        if False:|gradsync_python|python.test_arithmetic|adasum, step 1: max"
  "frontend-join-not-rescaled|python/gradsync/torch/strategies.py|            opt._gs_flat_grads.mul_(float(self.job.size) / max(1, self.active))|            pass|gradsync_python|python.test_arithmetic|join, step 2"
  "frontend-optimizer-state-not-broadcast|python/gradsync/torch/functions.py|    state = collectives.broadcast_object(optimizer.state_dict()[\"state\"], root_rank)|    return|gradsync_python|python.test_resume_horovod|the resumed job differs from the uninterrupted one"
  "frontend-exit-without-finish-hangs|python/gradsync/torch/live.py|_job._exit_hooks.append(_end_at_exit)|pass|gradsync_python|python.test_uneven|a worker still waited"
  "lost-shard-takeover-awaited-forever|server/scheduler/shard_copies.cc|    if (now < t->second.due) return std::nullopt;|    return std::nullopt;|gradsync-server ps_binary_test|Orders/LostShardTest.StopsTheJobNamingTheShardWhenATakeoverFillsItsBackupsRank/server1_then_server0$|s after the last kill"
  "overlap-ignores-straggler|common/config/sync_decisions.cc|f.per_tensor_params && !f.straggles && !f.rounds;|f.per_tensor_params && !f.rounds;|common_test|OverlapDecisionTest.PsOverlapsADenseRawCpuModelWithoutStragglerOrRounds|PsOverlaps(without(fact, true))"
  "waiter-ignores-busy-poll|common/base/wait_policy.cc|  if (!minimum && now >= poll_until_) return false;|  if (!minimum) return false;|common_test|WaiterTest.PollsForBusyPollMsAndCountsThosePolls|the waiter stopped polling before busy_poll_ms"
  "factory-never-overlaps|worker/sync/sync_factory.cc|    built.overlapped = PsOverlaps(facts);|    built.overlapped = false;|worker_test|SyncFactoryTest.ThePsModesOverlapWhereTheModelAndSettingsAllowIt|\"ps-overlap\""
  "shard-transform-skipped|server/shard/shard_core.cc|  if (!aggregates) transform_->Transform(worker, &push, shard_->params());|  (void)0;|server_test|DelayCompensationTest.AStalePushIsAppliedCorrectedAndAnnouncedCorrected|b[2][i]"
)

want=("$@")
failed=0
rows=0
printf '| mutation | file | test | result |\n|---|---|---|---|\n'
for m in "${mutations[@]}"; do
  IFS='|' read -r name file text replacement targets test message <<<"${m//\\|/$'\x1f'}"
  text=${text//$'\x1f'/|}
  replacement=${replacement//$'\x1f'/|}
  message=${message//$'\x1f'/|}
  if [[ ${#want[@]} -gt 0 && ! " ${want[*]} " == *" $name "* ]]; then continue; fi
  rows=$((rows + 1))
  if [[ -z $message ]]; then
    printf '| %s | %s | %s | NO MESSAGE IN THE ROW |\n' "$name" "$file" "$test"
    failed=1
    continue
  fi
  if ! grep -qF -- "$text" "$file"; then
    printf '| %s | %s | %s | TEXT NOT FOUND |\n' "$name" "$file" "$test"
    failed=1
    continue
  fi
  python3 - "$file" "$text" "$replacement" <<'EOF'
import sys
path, old, new = sys.argv[1:4]
s = open(path).read()
open(path, "w").write(s.replace(old, new, 1))
EOF
  log=/tmp/mutation-$name.test.log
  result=GREEN
  # shellcheck disable=SC2086
  if ! (cd build && make -j"$(nproc)" $targets > "/tmp/mutation-$name.build.log" 2>&1); then
    result="does not build (/tmp/mutation-$name.build.log)"
  elif ! (cd build && ctest -R "$test" --output-on-failure --timeout 300 > "$log" 2>&1); then
    # ctest lists what failed after "The following tests FAILED:", a "N - NAME (Failed)" line each
    # (a time-out says "(Timeout)", a crash "(Subprocess aborted)"): a test the row's regex
    # matches, as ctest -R matched it, must be among those that failed on an assertion.
    if ! sed -n '/The following tests FAILED:/,$s/^[[:space:]]*[0-9]* - \(.*\) (Failed)$/\1/p' "$log" | grep -qE -- "$test"; then
      result="red elsewhere ($log)"
    elif ! grep -qF -- "$message" "$log"; then
      result="red without its message ($log)"
    else
      result=red
    fi
  elif ! grep -q "tests passed" "$log" || grep -q "No tests were found" "$log"; then
    result="no test ran ($log)"
  fi
  git checkout -q -- "$file"
  [[ $result == red ]] || failed=1
  printf '| %s | %s | %s | %s |\n' "$name" "$file" "$test" "$result"
done
echo "mutation-table: $rows rows"
echo "mutation-table: rebuilding build/ from the restored sources"
(cd build && make -j"$(nproc)" > /tmp/mutation-restore.build.log 2>&1) || { echo "mutation-table: the restored build failed (/tmp/mutation-restore.build.log)" >&2; exit 1; }
exit "$failed"
