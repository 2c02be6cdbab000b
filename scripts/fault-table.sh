#!/usr/bin/env bash
# The fault table: a parameter-server job (2 servers, 3 workers, Fashion-MNIST MLP, 4 epochs,
# batch 32, heartbeat timeout 3 s; checkpoints every 0.5 s unless said) run once per fault, on
# loopback:
#   none              no fault (the reference accuracy)
#   worker-kill       kill -9 worker 2 after 4 s
#   worker-rejoin     kill -9 worker 2 after 4 s, start it again 5 s later
#   worker-stop       SIGSTOP worker 2 for 6 s (past the timeout), then SIGCONT
#   server-kill       kill -9 server 1 after 4 s and start it again 1 s later (same rank and dir)
#   primary-kill-r2   --replicas=2: kill -9 server 1 after 4 s; server 0 takes its shard over
#   standby-r2        --replicas=2: kill -9 server 1, start it again 1 s later (it comes back as a
#                     standby and catches up), kill -9 server 0 5 s later (the standby takes both)
#   ckpt-other-job    kill -9 server 1, put another job's shard-1.ckpt (the "none" run's of the
#                     same mode) in its directory, start it again
#   ckpt-flipped      kill -9 server 1, flip one exponent bit of a parameter in shard-1.ckpt,
#                     start it again
#   kill-before-ckpt  checkpoint interval 1000 s: kill -9 server 1 after 4 s (only the checkpoint
#                     written at INIT exists), start it again
#   server-stop       SIGSTOP server 1 for 6 s (past the timeout), then SIGCONT
#   server-stop-r2    --replicas=2: the same; server 0 takes the shard over, server 1 comes back as
#                     a standby
#   lost-r2           --replicas=2, no --checkpoint-dir: kill -9 both servers after 4 s (every
#                     copy of both shards gone): the job must stop at once, naming the shards
#   lost-ckpt-r2      --replicas=2: kill -9 both servers after 4 s, start both again 1.5 s later
#                     (they restore their checkpoints)
#   sched-stop-hogs   heartbeat timeout 5 s: three CPU hogs on the machine's cores from 4 s on,
#                     and the scheduler stopped (SIGSTOP) for 4 s meanwhile: nobody may be
#                     declared dead, the job finishes
#   unwritable-dir    a server started with a --checkpoint-dir that cannot take a file (no job)
#   lane-kills        LANE_KILLS (50) times: a 1-server, 1-worker bsp job on one host, every
#                     process killed with SIGKILL the moment the worker holds a shared-memory
#                     lane; then the gradsync files in /dev/shm and the host's shared memory
#                     (Shmem in /proc/meminfo) against before
# Prints one Markdown row per run: fault, mode, detected after (s, the scheduler's first
# "declared dead" line minus the moment of the fault), run completed (the scheduler's exit
# status), final test accuracy (worker 0's summary), updates lost (summed over the shards'
# summaries: pushes workers had made past what a restarted or taken-over shard restored) and
# what the log said. About 5 minutes.
#
# Then the fault matrix (about 12 minutes): small jobs of 2 to 4 servers, --replicas 1 or 2, every
# set of one or two servers killed (together; a second apart, before the first one's takeover;
# a second after that takeover; with one replica, restarted from their checkpoints) and a worker
# killed in bsp, ssp and asp. scripts/fault_matrix.py computes each row's outcome from the replica
# placement alone (completes with nothing lost / stops within the heartbeat timeout + 5 s, every
# process exiting non-zero and the scheduler and workers naming the lost shard / recovers from
# the checkpoints with the lost updates counted) and judges the run against it: one row each of
# spec, expected, observed, match. Exits 1 if any row does not match.
# Logs and summaries stay in OUT (default results/faults); every process it starts is gone when
# it returns. FAULTS picks the first table's rows, MATRIX the matrix's (specs as
# `fault_matrix.py rows` prints them), MATRIX_ONLY=1 runs the matrix alone, MATRIX_HB sets its
# heartbeat timeout (2 s), GRADSYNC_BIN_DIR the binaries (build/bin).
#   scripts/fault-table.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
B=${GRADSYNC_BIN_DIR:-$PWD/build/bin}
out=$(realpath -m "${1:-results/faults}")
mkdir -p "$out"
trap 'pkill -9 -P $$ 2>/dev/null; true' EXIT

# One line of LOG files matching PATTERN, cut to its message.
said() {
  grep -h -E "$2" $1 2>/dev/null | head -1 |
    sed -E 's/^[IWE] [0-9:.]+ [a-z_]+\.cc:[0-9]+\] //; s/^.*\(its parameters are lost\): [^ ]*\/(shard-[0-9]+\.ckpt)/refused \1/; s/\|/\\|/g' | cut -c1-200
}

run() {  # MODE FAULT
  local mode=$1 fault=$2 d=$out/$1-$2
  rm -rf "$d" && mkdir -p "$d"
  local extra=() replicas=1 interval=0.5 hb=3
  [[ $fault == sched-stop-hogs ]] && hb=5
  [[ $mode == ssp ]] && extra=(--staleness=2)
  [[ $fault == *-r2 ]] && replicas=2
  local ckpt_flags=(--checkpoint-dir="$d/ckpt" --checkpoint-interval=$interval)
  [[ $fault == lost-r2 ]] && ckpt_flags=()
  [[ $fault == kill-before-ckpt ]] && interval=1000
  "$B/gradsync-server" --role=scheduler --num-servers=2 --num-workers=3 --port-file="$d/port" --heartbeat-timeout=$hb \
    --replicas=$replicas --register-timeout=60 > "$d/scheduler.log" 2>&1 &
  local sched=$!
  for i in $(seq 200); do [[ -s $d/port ]] && break; sleep 0.05; done
  local port
  port=$(cat "$d/port")
  local server=("$B/gradsync-server" --role=server --mode="$mode" "${extra[@]}" --scheduler=127.0.0.1:"$port"
                "${ckpt_flags[@]}" --heartbeat-timeout=$hb --out="$d")
  local -a spid wpid
  for r in 0 1; do "${server[@]}" --rank=$r > "$d/server-$r.log" 2>&1 & spid[$r]=$!; done
  local worker=("$B/gradsync-worker" --mode="$mode" "${extra[@]}" --scheduler=127.0.0.1:"$port" --epochs=4 --batch=32
                --heartbeat-timeout=$hb --recovery-timeout=30 --out="$d")
  for r in 0 1 2; do "${worker[@]}" --rank=$r > "$d/worker-$r.log" 2>&1 & wpid[$r]=$!; done
  sleep 4
  local t0
  t0=$(date +%s.%N)
  local ckpt=$d/ckpt/shard-1.ckpt
  case $fault in
    worker-kill) kill -9 "${wpid[2]}" ;;
    worker-rejoin) kill -9 "${wpid[2]}"; sleep 5; "${worker[@]}" --rank=2 > "$d/worker-2-restarted.log" 2>&1 & ;;
    worker-stop) kill -STOP "${wpid[2]}"; sleep 6; kill -CONT "${wpid[2]}" ;;
    server-kill|kill-before-ckpt)
      kill -9 "${spid[1]}"; sleep 1; "${server[@]}" --rank=1 > "$d/server-1-restarted.log" 2>&1 & ;;
    primary-kill-r2) kill -9 "${spid[1]}" ;;
    standby-r2)
      kill -9 "${spid[1]}"; sleep 1; "${server[@]}" --rank=1 > "$d/server-1-restarted.log" 2>&1 &
      sleep 5; kill -9 "${spid[0]}" ;;
    ckpt-other-job)
      kill -9 "${spid[1]}"; sleep 0.2
      cp "$out/$mode-none/ckpt/shard-1.ckpt" "$ckpt"
      "${server[@]}" --rank=1 > "$d/server-1-restarted.log" 2>&1 & ;;
    ckpt-flipped)
      kill -9 "${spid[1]}"; sleep 0.2
      python3 -c "
f = open('$ckpt', 'r+b'); b = bytearray(f.read()); b[-2] ^= 0x40; f.seek(0); f.write(b)"
      "${server[@]}" --rank=1 > "$d/server-1-restarted.log" 2>&1 & ;;
    server-stop|server-stop-r2) kill -STOP "${spid[1]}"; sleep 6; kill -CONT "${spid[1]}" ;;
    lost-r2) kill -9 "${spid[0]}" "${spid[1]}" ;;
    sched-stop-hogs)
      local -a hogs
      for i in 1 2 3; do (timeout 60 sh -c 'while :; do :; done') & hogs+=($!); done
      kill -STOP "$sched"; sleep 4; kill -CONT "$sched"
      sleep 4; kill "${hogs[@]}" 2>/dev/null ;;
    lost-ckpt-r2)
      kill -9 "${spid[0]}" "${spid[1]}"; sleep 1.5
      for r in 0 1; do "${server[@]}" --rank=$r > "$d/server-$r-restarted.log" 2>&1 & done ;;
  esac
  timeout 300 tail --pid="$sched" -f /dev/null
  local ended
  ended=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
  wait "$sched"
  local rc=$?
  sleep 1
  pkill -9 -P $$ 2>/dev/null  # a worker left waiting for a shard that never came back
  wait
  local acc lost det=-
  acc=$(python3 -c "import json; print('%.2f' % (100 * json.load(open('$d/worker-0.json'))['final_test_accuracy']))" 2>/dev/null)
  # Every shard's summary (a restarted or taken-over shard's replaced the dead one's file).
  lost=$(python3 -c "
import glob, json
print(sum(int(json.load(open(p)).get('lost_updates', 0)) for p in glob.glob('$d/server-*.json')))" 2>/dev/null)
  if [[ $fault != none ]]; then
    local line
    line=$(grep -h "declared dead" "$d/scheduler.log" | head -1 | awk '{print $2}')
    if [[ -n $line ]]; then
      det=$(python3 -c "import datetime; t=datetime.datetime.fromtimestamp($t0); h,m,s='$line'.split(':');
print(round(int(h)*3600+int(m)*60+float(s)-(t.hour*3600+t.minute*60+t.second+t.microsecond/1e6),2))")
    fi
  fi
  local note=""
  case $fault in
    primary-kill-r2) note=$(said "$d/server-0.log" "took over from its backup copy") ;;
    standby-r2) note=$(said "$d/server-1-restarted.log" "server 0: took over from its backup copy") ;;
    ckpt-other-job|ckpt-flipped) note=$(said "$d/server-1-restarted.log" "error:") ;;
    server-kill|kill-before-ckpt) note=$(said "$d/server-1-restarted.log" "restored from") ;;
    server-stop) note=$(said "$d/server-1.log" "back in the job") ;;
    server-stop-r2) note=$(said "$d/server-1.log" "standby") ;;
    worker-stop) note=$(said "$d/worker-2.log" "declared dead") ;;
    lost-r2)
      local alive=0 p
      for p in "${wpid[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
      note="job stopped ${ended} s after the kills ($alive workers still running then): $(said "$d/worker-0.log" "the scheduler stopped the job")" ;;
    sched-stop-hogs) note=$(said "$d/scheduler.log" "this process was paused for") ;;
    lost-ckpt-r2) note="$(said "$d/scheduler.log" "has no live copy"); $(said "$d/server-1-restarted.log" "restored from")" ;;
  esac
  echo "| $fault | $mode | $det | $([[ $rc == 0 ]] && echo yes || echo no) | ${acc:--} | ${lost:-0} | ${note} |"
}

# A --checkpoint-dir that cannot take a file is refused before anything starts.
unwritable() {
  local start=$SECONDS err rc
  err=$("$B/gradsync-server" --role=server --mode=bsp --scheduler=127.0.0.1:9 --checkpoint-dir=/proc/self/gradsync-ckpt 2>&1)
  rc=$?
  echo "| unwritable-dir | bsp | $((SECONDS - start)) (at start) | no (exit $rc) | - | - | ${err//|/\\|} |"
}

# Kill every process of a small job the moment its worker holds a lane, LANE_KILLS times.
lane_kills() {
  local n=${LANE_KILLS:-50} d=$out/lane-kills hits=0 i
  rm -rf "$d" && mkdir -p "$d"
  local shm0 files0
  shm0=$(awk '/^Shmem:/ {print $2}' /proc/meminfo)
  files0=$(find /dev/shm -maxdepth 1 -name 'gradsync-*' | wc -l)
  for ((i = 0; i < n; ++i)); do
    rm -f "$d/port"
    "$B/gradsync-server" --role=scheduler --num-servers=1 --num-workers=1 --port-file="$d/port" > "$d/scheduler.log" 2>&1 &
    local sched=$! j
    for j in $(seq 200); do [[ -s $d/port ]] && break; sleep 0.01; done
    local port
    port=$(cat "$d/port")
    "$B/gradsync-server" --role=server --mode=bsp --rank=0 --scheduler=127.0.0.1:"$port" > "$d/server.log" 2>&1 &
    local server=$!
    "$B/gradsync-worker" --mode=bsp --rank=0 --scheduler=127.0.0.1:"$port" --max-steps=50 > "$d/worker.log" 2>&1 &
    local worker=$!
    # Poll the worker's descriptors (a lane is published by one from its creation until the shard
    # has mapped it, a few ms) and kill all three the moment one is there; at most 20 s.
    if /usr/bin/python3 - "$worker" "$server" "$sched" <<'PY'
import os, signal, sys, time
pids = [int(p) for p in sys.argv[1:]]
end = time.time() + 20
while time.time() < end:
    try:
        fds = os.listdir(f"/proc/{pids[0]}/fd")
    except OSError:
        sys.exit(1)
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pids[0]}/fd/{fd}").startswith("/memfd:gradsync-"):
                for p in pids:
                    os.kill(p, signal.SIGKILL)
                sys.exit(0)
        except OSError:
            pass
sys.exit(1)
PY
    then hits=$((hits + 1)); fi
    kill -9 $worker $server $sched 2>/dev/null
    wait $worker $server $sched 2>/dev/null
  done
  sleep 0.5
  local shm1 files1
  shm1=$(awk '/^Shmem:/ {print $2}' /proc/meminfo)
  files1=$(find /dev/shm -maxdepth 1 -name 'gradsync-*' | wc -l)
  echo "| lane-kills | bsp | - | $hits of $n killed holding a lane | - | - | gradsync files in /dev/shm: $files0 before, $files1 after; Shmem $shm0 KiB before, $shm1 KiB after |"
}

# One row of the fault matrix (scripts/fault_matrix.py has the specs): N servers, --replicas=R, 2
# workers (blobs, a 32-unit MLP, 5 ms a step), heartbeats every 0.2 s, timeout MATRIX_HB (2 s: more
# than the 1 s between two kills, so that "before" comes before the first takeover); the servers
# or worker KILLED with SIGKILL once worker 0 has logged 50 steps, at TIMING. Writes `observed`
# (the survivors' exit codes, and the seconds from the last kill to the last survivor's exit) for
# the judge, in OUT/matrix/SPEC.
matrix_run() {  # SPEC
  local spec=$1 n r killed timing mode
  IFS=: read -r n r killed timing mode <<< "$spec"
  mode=${mode:-bsp}
  local d=$out/matrix/${spec//:/_} hb=$MATRIX_HB steps=900
  rm -rf "$d" && mkdir -p "$d"
  [[ $timing == after ]] && steps=1500  # still training after two takeovers
  local extra=() ckpt=()
  [[ $mode == ssp ]] && extra=(--staleness=2)
  # Only the checkpoint written at INIT: every push before the kill is lost, and counted.
  [[ $timing == restart ]] && ckpt=(--checkpoint-dir="$d/ckpt" --checkpoint-interval=1000)
  "$B/gradsync-server" --role=scheduler --num-servers="$n" --num-workers=2 --port-file="$d/port" --replicas="$r" \
    --heartbeat-interval=0.2 --heartbeat-timeout="$hb" --register-timeout=30 > "$d/scheduler.log" 2>&1 &
  local -A pid=([scheduler]=$!)
  local i port
  for i in $(seq 200); do [[ -s $d/port ]] && break; sleep 0.05; done
  port=$(cat "$d/port")
  local server=("$B/gradsync-server" --role=server --mode="$mode" "${extra[@]}" --scheduler=127.0.0.1:"$port"
                "${ckpt[@]}" --heartbeat-interval=0.2 --heartbeat-timeout="$hb" --out="$d")
  for ((i = 0; i < n; ++i)); do "${server[@]}" --rank=$i > "$d/server-$i.log" 2>&1 & pid[server-$i]=$!; done
  for i in 0 1; do
    "$B/gradsync-worker" --mode="$mode" "${extra[@]}" --scheduler=127.0.0.1:"$port" --rank=$i --dataset=blobs \
      --hidden=32 --epochs=100 --batch=16 --max-steps=$steps --straggle=ms:5 --log-every=10 --heartbeat-interval=0.2 \
      --heartbeat-timeout="$hb" --recovery-timeout=20 --out="$d" > "$d/worker-$i.log" 2>&1 &
    pid[worker-$i]=$!
  done
  local setup=""
  for i in $(seq 600); do (($(cat "$d/worker-0.csv" 2>/dev/null | wc -l) > 5)) && break; sleep 0.025; done
  (($(cat "$d/worker-0.csv" 2>/dev/null | wc -l) > 5)) || setup="no progress before the kill"
  local -a order
  IFS=- read -ra order <<< "$killed"
  local k victims=()
  for k in "${order[@]}"; do [[ $k == w* ]] && victims+=("worker-${k#w}") || victims+=("server-$k"); done
  case $timing in
    one|together) for k in "${victims[@]}"; do kill -9 "${pid[$k]}"; done ;;
    before) kill -9 "${pid[${victims[0]}]}"; sleep 1; kill -9 "${pid[${victims[1]}]}" ;;
    after)
      kill -9 "${pid[${victims[0]}]}"
      for i in $(seq 200); do grep -q "rejoins the job as server ${order[0]} (" "$d/scheduler.log" && break; sleep 0.05; done
      grep -q "rejoins the job as server ${order[0]} (" "$d/scheduler.log" || setup="no takeover of shard ${order[0]} within 10 s"
      sleep 1; kill -9 "${pid[${victims[1]}]}" ;;
    restart)
      for k in "${victims[@]}"; do kill -9 "${pid[$k]}"; done
      for k in "${order[@]}"; do
        for i in $(seq 200); do grep -q "shard $k has no live copy" "$d/scheduler.log" && break; sleep 0.05; done
        "${server[@]}" --rank="$k" > "$d/server-$k-restarted.log" 2>&1 & pid[server-$k-restarted]=$!
      done ;;
  esac
  local killed_at=$EPOCHREALTIME
  for k in "${victims[@]}"; do wait "${pid[$k]}" 2>/dev/null; unset "pid[$k]"; done
  # Every survivor's end (at most 60 s), then its exit code.
  local last=$killed_at alive
  for i in $(seq 1200); do
    alive=0
    for k in "${!pid[@]}"; do kill -0 "${pid[$k]}" 2>/dev/null && alive=1; done
    ((alive)) || break
    last=$EPOCHREALTIME
    sleep 0.05
  done
  {
    [[ -n $setup ]] && echo "setup=$setup"
    echo "stop_s=$(awk -v a="$killed_at" -v b="$last" 'BEGIN { printf "%.2f", b - a }')"
    for k in "${!pid[@]}"; do
      kill -9 "${pid[$k]}" 2>/dev/null  # still running after 60 s: counted as such (137)
      wait "${pid[$k]}" 2>/dev/null
      echo "rc_$k=$?"
    done
  } > "$d/observed"
}

matrix() {
  local specs fails=0 spec
  specs=${MATRIX:-$(python3 scripts/fault_matrix.py rows)}
  echo
  echo "| row (servers:replicas:killed:timing[:mode]) | expected (computed from the placement) | observed | match |"
  echo "|---|---|---|---|"
  for spec in $specs; do
    matrix_run "$spec" 2>/dev/null
    python3 scripts/fault_matrix.py judge "$spec" "$out/matrix/${spec//:/_}" "$MATRIX_HB" || fails=$((fails + 1))
  done
  echo
  echo "fault matrix: $(echo $specs | wc -w) rows, $fails mismatched"
  return $((fails > 0))
}

MATRIX_HB=${MATRIX_HB:-2}
if [[ ${MATRIX_ONLY:-0} != 1 ]]; then
  echo "| fault | mode | detected after (s) | run completed | final test acc (%) | updates lost | what the log said |"
  echo "|---|---|---|---|---|---|---|"
  faults=${FAULTS:-"bsp:none asp:none bsp:worker-kill ssp:worker-kill asp:worker-kill bsp:worker-rejoin bsp:worker-stop
    bsp:server-kill asp:server-kill bsp:primary-kill-r2 asp:primary-kill-r2 bsp:standby-r2 asp:ckpt-other-job
    asp:ckpt-flipped bsp:kill-before-ckpt asp:server-stop asp:server-stop-r2 bsp:lost-r2 bsp:lost-ckpt-r2 bsp:sched-stop-hogs"}
  for spec in $faults; do
    run "${spec%%:*}" "${spec##*:}" 2>/dev/null  # bash's "Killed" notices for the processes killed on purpose
  done
  unwritable
  lane_kills
fi
matrix
