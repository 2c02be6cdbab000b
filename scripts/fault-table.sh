#!/usr/bin/env bash
# The fault table: a parameter-server job (2 servers with checkpoints every 0.5 s, 3 workers,
# Fashion-MNIST MLP, 4 epochs, batch 32, heartbeat timeout 3 s) run once per fault, on loopback:
#   none           no fault (the reference accuracy)
#   worker-kill    kill -9 worker 2 after 4 s
#   worker-rejoin  kill -9 worker 2 after 4 s, start it again 5 s later
#   worker-stop    SIGSTOP worker 2 for 6 s (past the timeout), then SIGCONT
#   server-kill    kill -9 server 1 after 4 s and start it again 1 s later (same rank and dir)
# Prints one Markdown row per run: fault, mode, detected after (s, the scheduler's "declared
# dead" line minus the moment of the fault), run completed (the scheduler's exit status), final
# test accuracy and updates lost (from worker 0's and server 1's summaries, worker-0.json and
# server-1.json: the restarted server's count). Logs and summaries stay in OUT (default
# results/faults). About 3 minutes; every process it starts is gone when it returns.
#   scripts/fault-table.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
B=$PWD/build/bin
out=$(realpath -m "${1:-results/faults}")
mkdir -p "$out"
trap 'pkill -9 -P $$ 2>/dev/null; true' EXIT

run() {  # MODE FAULT
  local mode=$1 fault=$2 d=$out/$1-$2
  rm -rf "$d" && mkdir -p "$d"
  local extra=()
  [[ $mode == ssp ]] && extra=(--staleness=2)
  "$B/gradsync-server" --role=scheduler --num-servers=2 --num-workers=3 --port-file="$d/port" --heartbeat-timeout=3 \
    > "$d/scheduler.log" 2>&1 &
  local sched=$!
  for i in $(seq 200); do [[ -s $d/port ]] && break; sleep 0.05; done
  local port
  port=$(cat "$d/port")
  local server=("$B/gradsync-server" --role=server --mode="$mode" "${extra[@]}" --scheduler=127.0.0.1:"$port"
                --checkpoint-dir="$d/ckpt" --checkpoint-interval=0.5 --heartbeat-timeout=3 --out="$d")
  local -a spid wpid
  for r in 0 1; do "${server[@]}" --rank=$r > "$d/server-$r.log" 2>&1 & spid[$r]=$!; done
  local worker=("$B/gradsync-worker" --mode="$mode" "${extra[@]}" --scheduler=127.0.0.1:"$port" --epochs=4 --batch=32
                --heartbeat-timeout=3 --recovery-timeout=30 --out="$d")
  for r in 0 1 2; do "${worker[@]}" --rank=$r > "$d/worker-$r.log" 2>&1 & wpid[$r]=$!; done
  sleep 4
  local t0
  t0=$(date +%s.%N)
  case $fault in
    worker-kill) kill -9 "${wpid[2]}" ;;
    worker-rejoin) kill -9 "${wpid[2]}"; sleep 5; "${worker[@]}" --rank=2 > "$d/worker-2-restarted.log" 2>&1 & ;;
    worker-stop) kill -STOP "${wpid[2]}"; sleep 6; kill -CONT "${wpid[2]}" ;;
    server-kill) kill -9 "${spid[1]}"; sleep 1; "${server[@]}" --rank=1 > "$d/server-1-restarted.log" 2>&1 & ;;
  esac
  timeout 300 tail --pid="$sched" -f /dev/null
  wait "$sched"
  local rc=$?
  wait
  local acc lost det=-
  # From the processes' summaries (worker-0.json, server-1.json: the restarted shard's, which
  # replaced the killed one's file).
  acc=$(python3 -c "import json; print('%.2f' % (100 * json.load(open('$d/worker-0.json'))['final_test_accuracy']))" 2>/dev/null)
  lost=$(python3 -c "import json; print(int(json.load(open('$d/server-1.json'))['lost_updates']))" 2>/dev/null)
  if [[ $fault != none ]]; then
    local line
    line=$(grep -h "declared dead" "$d/scheduler.log" | head -1 | awk '{print $2}')
    if [[ -n $line ]]; then
      det=$(python3 -c "import datetime; t=datetime.datetime.fromtimestamp($t0); h,m,s='$line'.split(':');
print(round(int(h)*3600+int(m)*60+float(s)-(t.hour*3600+t.minute*60+t.second+t.microsecond/1e6),2))")
    fi
  fi
  echo "| $fault | $mode | $det | $([[ $rc == 0 ]] && echo yes || echo no) | ${acc:--} | ${lost:-0} |"
}

echo "| fault | mode | detected after (s) | run completed | final test acc (%) | updates lost |"
echo "|---|---|---|---|---|---|"
for spec in "bsp none" "bsp worker-kill" "ssp worker-kill" "asp worker-kill" "bsp worker-rejoin" "bsp worker-stop" \
            "ssp worker-stop" "bsp server-kill" "ssp server-kill" "asp server-kill"; do
  run $spec 2>/dev/null  # bash's "Killed" notices for the processes killed on purpose
done
