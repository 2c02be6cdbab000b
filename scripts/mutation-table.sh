#!/usr/bin/env bash
# Shows that tests fail when the property they name does not hold: for each mutation below, breaks
# the code on purpose (one exact text replacement), rebuilds what the test needs in build/, runs
# the test, and restores the file. Prints one row per mutation: the mutation, the test, and
# "red" (the test failed, as it must) or "GREEN" (the test missed it). Exits non-zero if any test
# stayed green, or a mutation's text was not found (the code moved: update the table). Run it
# with nothing else building in build/; build/ is rebuilt at the end from the restored sources.
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
  "nan-compares-close|common/base/tensor.cc|    if (!std::isfinite(x) \|\| !std::isfinite(y)) return std::numeric_limits<double>::infinity();|    (void)0;|common_test|TensorTest.NonFiniteValuesNeverCompareClose"
  "trace-offset-ignored|common/obs/trace.cc|  r.offset_us.store(clock_offset_us);|  r.offset_us.store(0);|common_test|TraceTest.OffRecordsNothing"
  "controller-overstates-clocks|common/ps/consistency.cc|    if (live_[w]) m = std::min(m, pushed_[w]);|    if (live_[w]) m = std::min(m, pushed_[w] + 1);|ps_test|SspBoundTest.EveryAnsweredPullRespectsTheBound/s1_zmq"
  "no-checkpoint-after-init|server/server_lifecycle.cc|  if (!checkpointer_.Due(updated, now)) return;|  if (!checkpointer_.Due(updated, now) \|\| true) return;|gradsync-server ps_binary_test|KilledServerTest.ComesBackFromItsCheckpointAndTheRunCompletes/bsp\$"
  "ps-fp16-gradient-zeroed|python/gradsync/torch/amp.py|                grads.mul_(1.0 / self._scale)|                grads.mul_(0.0)|gradsync_python|python.test_precision"
  "backup-acks-ignored|server/replication/replication.cc|    if (!link.refused) all = std::min(all, link.acked);|    if (link.refused) all = std::min(all, link.acked);|gradsync-server ps_binary_test|FaultTest.APushIsAcknowledgedOnlyOnceItsBackupHoldsIt"
  "backup-acks-ignored-unit|server/replication/replication.cc|    if (!link.refused) all = std::min(all, link.acked);|    if (link.refused) all = std::min(all, link.acked);|server_test|ReplicatorTest.AReplyWaitsForEveryLiveBackupAndASilentOneHoldsItUntilDropped"
  "backup-skips-asp-pushes|server/replication/replication.cc|  c.core->TakeChunk(w, std::move(chunk), h.scale, h.counts, h.lr);|  if (h.seq % 50 != 0) c.core->TakeChunk(w, std::move(chunk), h.scale, h.counts, h.lr);|gradsync-server ps_binary_test|ReplicatedServerTest.ABackupTakesOverAndNothingIsLost/asp\$"
  "frame-written-into-closed-channel|common/net/data_channel.cc|  if (PeerClosed()) return UnavailableError(|  if (false && PeerClosed()) return UnavailableError(|ps_test|PsJobTest.ADataChannelThatEndsBetweenPushesFallsBackToZeroMq"
  "dead-workers-lane-kept|server/server_lifecycle.cc|      DetachWorker(n.rank());|      (void)0;|gradsync-server ps_binary_test|FaultTest.SharedMemoryOfADeadProcessIsLetGoByEveryOther"
  "lane-pull-answer-off|server/values/lane_channel.cc|    reply.part = reply.parts > 1 ? static_cast<int>(i) : 0;|    area[one.begin - base] += 1e-3f; reply.part = reply.parts > 1 ? static_cast<int>(i) : 0;|gradsync-server ps_binary_test|ChannelFaultTest.EveryChannelEndsOnTheSameBitsThroughAWorkersDeathAndAShardsTakeover/bsp\$"
  "plan-tree-stores-instead-of-sums|allreduce/plan/tree.cc|    if (rank + mask < n) plan.push_back(RecvStep(level, rank + mask, all, /*reduce=*/true));|    if (rank + mask < n) plan.push_back(RecvStep(level, rank + mask, all, /*reduce=*/false));|allreduce_test|Algorithms/PlanTest.EveryRankEndsWithTheSumAndEverySendIsReceived/tree\$"
  "sim-choice-ignores-shared-memory|experiments/sim/settings.cc|  l.setting.shared_memory = s.allreduce_shm && per_host > 1;|  l.setting.shared_memory = false;|experiments_test|SimAllReduceChoiceTest"
  "sim-gather-decode-timed-here|experiments/sim/codec_costs.cc|  if (gather_decode_per_float_ >= 0) return gather_decode_per_float_ * static_cast<double>(n) * payloads;|  if (gather_decode_per_float_ < 0) return gather_decode_per_float_ * static_cast<double>(n) * payloads;|experiments_test|SimCodecTimesTest"
  "lost-updates-not-counted|server/server.cc|      stats_.lost_updates += *lost;|      stats_.lost_updates += 0;|gradsync-server ps_binary_test|KilledServerTest.ComesBackFromItsCheckpointAndTheRunCompletes/asp\$"
)

want=("$@")
failed=0
printf '| mutation | file | test | result |\n|---|---|---|---|\n'
for m in "${mutations[@]}"; do
  IFS='|' read -r name file text replacement targets test <<<"${m//\\|/$'\x1f'}"
  text=${text//$'\x1f'/|}
  replacement=${replacement//$'\x1f'/|}
  if [[ ${#want[@]} -gt 0 && ! " ${want[*]} " == *" $name "* ]]; then continue; fi
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
  result=GREEN
  # shellcheck disable=SC2086
  if ! (cd build && make -j"$(nproc)" $targets > "/tmp/mutation-$name.build.log" 2>&1); then
    result="does not build (/tmp/mutation-$name.build.log)"
  elif ! (cd build && ctest -R "$test" --timeout 300 > "/tmp/mutation-$name.test.log" 2>&1); then
    result=red
  elif ! grep -q "tests passed" "/tmp/mutation-$name.test.log" || grep -q "No tests were found" "/tmp/mutation-$name.test.log"; then
    result="no test ran (/tmp/mutation-$name.test.log)"
  fi
  git checkout -q -- "$file"
  [[ $result == red ]] || failed=1
  printf '| %s | %s | %s | %s |\n' "$name" "$file" "$test" "$result"
done
echo "mutation-table: rebuilding build/ from the restored sources"
(cd build && make -j"$(nproc)" > /tmp/mutation-restore.build.log 2>&1) || { echo "mutation-table: the restored build failed (/tmp/mutation-restore.build.log)" >&2; exit 1; }
exit "$failed"
