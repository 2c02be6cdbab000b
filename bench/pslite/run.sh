#!/usr/bin/env bash
# ps-lite dense push/pull throughput, measured the way gradsync-bench-ps --processes measures
# gradsync (see README.md here).
#
#   bench/pslite/run.sh PSLITE_DIR [--sizes=1048576,16777216] [--configs=1x1,2x2] [--repeats=7]
#                       [--iters=N] [--timeout=600] [--glibc-tunables] [--tsv=FILE]
#   bench/pslite/run.sh PSLITE_DIR --rows-keys=PREFIX [--dims=16,64] [--configs=2x2] ...
#
# PSLITE_DIR: a ps-lite tree built with `make ps` (include/ and build/libps.a). Compiles
# pslite_driver.cc against it, then per size and SERVERSxWORKERS configuration starts a ps-lite
# scheduler, the servers and the workers as local processes on 127.0.0.1 and prints a markdown
# table. --iters defaults to gradsync-bench-ps's: 20 up to 4M floats, 6 above.
# --glibc-tunables runs every ps-lite process with the allocator settings gradsync's processes
# make in-process (TuneAllocatorForLargeMessages: mallopt M_MMAP_MAX 0, M_TRIM_THRESHOLD 1 GiB).
# --rows-keys=PREFIX: sparse push+pull of embedding rows instead, per dim of --dims: each worker
# pushes and pulls the batches of keys gradsync-bench-ps --processes --rows --row-keys-out=PREFIX
# drew (the same rows), in rows/s (--iters default 10). --tsv=FILE: rows mode's results as
# tab-separated values too (rows, dim, servers, workers, rows/s, p50 ms, p99 ms, wrong).
set -euo pipefail

usage() {
  sed -n '5,7p' "$0" | sed 's/^# \{0,3\}//' >&2
  exit 2
}

[[ $# -ge 1 && $1 != --* ]] || usage
PSLITE_DIR=$(cd "$1" && pwd)
shift
sizes=1048576,16777216
configs=1x1,2x2
repeats=7
iters=0
limit=600
tunables=""
rows_keys=""
dims=16,64
tsv=""
for a in "$@"; do
  case "$a" in
    --rows-keys=*) rows_keys=${a#*=} ;;
    --dims=*) dims=${a#*=} ;;
    --tsv=*) tsv=${a#*=} ;;
    --sizes=*) sizes=${a#*=} ;;
    --configs=*) configs=${a#*=} ;;
    --repeats=*) repeats=${a#*=} ;;
    --iters=*) iters=${a#*=} ;;
    --timeout=*) limit=${a#*=} ;;
    --glibc-tunables) tunables=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1073741824 ;;
    *) echo "run.sh: unknown argument '$a'" >&2; usage ;;
  esac
done
for f in include/ps/ps.h build/libps.a; do
  [[ -e $PSLITE_DIR/$f ]] || { echo "run.sh: $PSLITE_DIR/$f missing (build ps-lite: make ps)" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "run.sh: needs python3" >&2; exit 1; }

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/pslite-bench-XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bin=$work/pslite_driver
g++ -O2 -std=c++11 -isystem "$PSLITE_DIR/include" "$here/pslite_driver.cc" "$PSLITE_DIR/build/libps.a" \
  -lzmq -lprotobuf -pthread -o "$bin"

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# One configuration: scheduler, S servers, W workers. The workers' stdout goes to
# $dir/worker<i>.out. Fails when a process fails or the time limit passes.
run_config() {
  local size=$1 s=$2 w=$3 n=$4 dir=$5 i
  local args=(--floats="$size" --iters="$n" --repeats="$repeats")
  # Rows mode: SIZE is the dim.
  [[ -z $rows_keys ]] || args=(--rows-keys="$rows_keys" --dim="$size" --iters="$n" --repeats="$repeats")
  mkdir -p "$dir"
  pids=()
  # Loopback only: the scheduler binds DMLC_PS_ROOT_URI, every other node DMLC_NODE_HOST.
  local envs=(DMLC_PS_ROOT_URI=127.0.0.1 "DMLC_PS_ROOT_PORT=$(free_port)" "DMLC_NUM_SERVER=$s"
              "DMLC_NUM_WORKER=$w" DMLC_INTERFACE=lo DMLC_NODE_HOST=127.0.0.1)
  [[ -z $tunables ]] || envs+=("GLIBC_TUNABLES=$tunables")
  env "${envs[@]}" DMLC_ROLE=scheduler timeout -k 5 "$limit" "$bin" "${args[@]}" \
    >"$dir/scheduler.out" 2>"$dir/scheduler.err" &
  pids+=($!)
  for ((i = 0; i < s; ++i)); do
    env "${envs[@]}" DMLC_ROLE=server timeout -k 5 "$limit" "$bin" "${args[@]}" \
      >"$dir/server$i.out" 2>"$dir/server$i.err" &
    pids+=($!)
  done
  for ((i = 0; i < w; ++i)); do
    env "${envs[@]}" DMLC_ROLE=worker timeout -k 5 "$limit" "$bin" "${args[@]}" \
      >"$dir/worker$i.out" 2>"$dir/worker$i.err" &
    pids+=($!)
  done
  # Every process must exit 0; the first failure (or timeout's 124) stops the configuration.
  local left=${#pids[@]} p rc
  declare -A done_=()
  while ((left > 0)); do
    for p in "${pids[@]}"; do
      [[ -n ${done_[$p]:-} ]] && continue
      kill -0 "$p" 2>/dev/null && continue
      rc=0
      wait "$p" || rc=$?
      done_[$p]=1
      left=$((left - 1))
      if ((rc != 0)); then
        echo "run.sh: ${size} floats ${s}x${w}: a process exited with $rc (logs below)" >&2
        tail -n 5 "$dir"/*.err >&2 || true
        for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
        wait 2>/dev/null || true
        pids=()
        return 1
      fi
    done
    sleep 0.1
  done
  pids=()
}

results=$work/results.tsv
: >"$results"
failed=0
if [[ -n $rows_keys ]]; then
  IFS=, read -ra dim_list <<<"$dims"
  IFS=, read -ra config_list <<<"$configs"
  ((iters > 0)) || iters=10
  for dim in "${dim_list[@]}"; do
    for c in "${config_list[@]}"; do
      s=${c%x*}
      w=${c#*x}
      dir=$work/rows-$dim-$c
      echo "# ps-lite rows of dim ${dim} ${s}x${w}: ${repeats} repeats of ${iters} push+pulls" >&2
      if run_config "$dim" "$s" "$w" "$iters" "$dir"; then
        python3 - "$dir" "$dim" "$s" "$w" "$repeats" >>"$results" <<'EOF' || failed=1
import glob, sys
d, dim, s, w, repeats = sys.argv[1], *map(int, sys.argv[2:])
t0, t1, moved = [None] * repeats, [None] * repeats, [0] * repeats
lat, wrong, lines = [], 0, 0
for f in glob.glob(d + "/worker*.out"):
    for line in open(f):
        p = line.split()
        if not p:
            continue
        if p[0] == "R":
            r, a, b, n = map(int, p[1:5])
            t0[r] = a if t0[r] is None else min(t0[r], a)
            t1[r] = b if t1[r] is None else max(t1[r], b)
            moved[r] += n
            lines += 1
        elif p[0] == "L":
            lat += map(float, p[1:])
        elif p[0] == "W":
            wrong += int(p[1])
if lines != repeats * w:
    sys.exit(f"run.sh: rows of dim {dim} {s}x{w}: the workers reported {lines} repeats, not {repeats * w}")
rates = sorted(moved[r] / ((t1[r] - t0[r]) / 1e9) for r in range(repeats))
n = len(rates)
median = rates[n // 2] if n % 2 else 0.5 * (rates[n // 2 - 1] + rates[n // 2])
lat.sort()
q = lambda x: lat[min(len(lat) - 1, int(x * len(lat)))]
print("rows", dim, s, w, median, q(0.5), q(0.99), wrong, sep="\t")
EOF
      else
        failed=1
      fi
    done
  done
  [[ -z $tsv ]] || cp "$results" "$tsv"
  python3 - "$results" "$repeats" "$failed" <<'EOF'
import sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines() if l]
print(f"# ps-lite (ZPush then ZPull of a batch's rows, waited), rows/s over every worker, median of {sys.argv[2]} repeats")
print()
print("| dim | servers x workers | rows/s | p50 / p99 ms |")
print("|---|---|---|---|")
for _, dim, s, w, rate, p50, p99, wrong in rows:
    print(f"| {dim} | {s}x{w} | {float(rate):.0f} | {float(p50):.3g} / {float(p99):.3g} |")
wrong = sum(int(r[7]) for r in rows)
print()
print("# check: " + ("every pulled row moved by this worker's push" if wrong == 0 else f"{wrong} WRONG ROWS")
      + ("; SOME CONFIGURATIONS FAILED (see stderr)" if sys.argv[3] != "0" else ""))
EOF
  ((failed == 0)) || { echo "run.sh: SOME CONFIGURATIONS FAILED (see above)" >&2; exit 1; }
  exit 0
fi
IFS=, read -ra size_list <<<"$sizes"
IFS=, read -ra config_list <<<"$configs"
for size in "${size_list[@]}"; do
  n=$iters
  ((n > 0)) || n=$((size <= 4194304 ? 20 : 6))
  for c in "${config_list[@]}"; do
    s=${c%x*}
    w=${c#*x}
    dir=$work/$size-$c
    echo "# ps-lite ${size} floats ${s}x${w}: ${repeats} repeats of ${n} ops" >&2
    if run_config "$size" "$s" "$w" "$n" "$dir"; then
      python3 - "$dir" "$size" "$s" "$w" "$n" "$repeats" >>"$results" <<'EOF' || failed=1
import glob, sys
d, size, s, w, iters, repeats = sys.argv[1], *map(int, sys.argv[2:])
t0 = [[None] * repeats for _ in range(3)]
t1 = [[None] * repeats for _ in range(3)]
lat = [[] for _ in range(3)]
wrong, lines = 0, 0
for f in glob.glob(d + "/worker*.out"):
    for line in open(f):
        p = line.split()
        if not p:
            continue
        if p[0] == "R":
            k, r, a, b = map(int, p[1:5])
            t0[k][r] = a if t0[k][r] is None else min(t0[k][r], a)
            t1[k][r] = b if t1[k][r] is None else max(t1[k][r], b)
            lines += 1
        elif p[0] == "L":
            lat[int(p[1])] += map(float, p[2:])
        elif p[0] == "W":
            wrong += int(p[1])
if lines != 3 * repeats * w:
    sys.exit(f"run.sh: {size} floats {s}x{w}: the workers reported {lines} repeats, not {3 * repeats * w}")
def median(v):
    v = sorted(v); n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
def quantile(v, q):  # nearest rank, as gradsync-bench-ps
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]
for k, op in enumerate(["push", "pull", "push+pull"]):
    per_op = (2 if k == 2 else 1) * size * 4
    rates = [per_op * iters * w / ((t1[k][r] - t0[k][r]) / 1e9) / 1e9 for r in range(repeats)]
    print(size, s, w, op, median(rates), quantile(lat[k], 0.5), quantile(lat[k], 0.99), wrong, sep="\t")
EOF
    else
      failed=1
    fi
  done
done

python3 - "$results" "$repeats" "$tunables" "$failed" <<'EOF'
import sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines() if l]
print(f"# ps-lite (ZPush/ZPull, one key per server), GB/s of values (1e9 B), median of {sys.argv[2]} repeats; "
      "latency per op over all repeats" + (f"; GLIBC_TUNABLES={sys.argv[3]}" if sys.argv[3] else ""))
print()
print("| floats | servers x workers | op | GB/s | p50 / p99 ms |")
print("|---|---|---|---|---|")
def floats(n):
    n = int(n)
    return f"{n >> 20}M" if n % (1 << 20) == 0 else str(n)
def ms(x):
    x = float(x)
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"
for size, s, w, op, gbps, p50, p99, wrong in rows:
    print(f"| {floats(size)} | {s}x{w} | {op} | {float(gbps):.2f} | {ms(p50)} / {ms(p99)} |")
wrong = sum(int(r[7]) for r in rows) // 3  # each configuration's count is on its 3 rows
print()
print("# check: " + ("every pulled value correct" if wrong == 0 else f"{wrong} WRONG VALUES")
      + ("; SOME CONFIGURATIONS FAILED (see stderr)" if sys.argv[4] != "0" else ""))
EOF
if ((failed)); then
  echo "run.sh: SOME CONFIGURATIONS FAILED (see above)" >&2
  exit 1
fi
