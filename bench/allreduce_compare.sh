#!/usr/bin/env bash
# All-reduce latency and busbw of gradsync's CPU algorithms against Gloo (ring_chunked and
# halving_doubling) and OpenMPI's MPI_Allreduce over TCP and over shared memory, interleaved
# repeat by repeat: each repeat runs every library once, one after the other, so that one
# repeat's noise hits them all; the tables give the median over repeats of each library's p50
# (and p99), and the ratios of those medians.
# Needs build/bin/gradsync-bench-allreduce; the Gloo and OpenMPI columns appear when Debian's
# libgloo-dev / openmpi-bin + libopenmpi-dev are installed (scripts/setup.sh --bench installs them).
#
# Usage: bench/allreduce_compare.sh [--repeats R] [--iters I] [--ranks "2 4"] [--algos LIST] [--sizes "BYTES..."]
#   defaults: 5 repeats, 200 iterations (fewer for big sizes: iters * size <= 2 GiB), ranks 2 and 4,
#   algos auto,ring,rhd,rd,tree, sizes 4 KiB, 64 KiB, 1 MiB, 4, 16, 64, 256 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=5 iters=200 ranks="2 4" algos=auto,ring,rhd,rd,tree
sizes="4096 65536 1048576 4194304 16777216 67108864 268435456"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --repeats) repeats=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --algos) algos=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "allreduce_compare.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
out=build/bench-compare
mkdir -p "$out"
have_gloo=0 have_mpi=0
if [[ -f /usr/include/gloo/allreduce_ring_chunked.h ]]; then
  g++ -O2 -std=c++17 bench/compare/gloo_allreduce.cc -o "$out/gloo_allreduce" -L/usr/lib -lgloo -pthread && have_gloo=1
fi
if command -v mpicxx >/dev/null; then
  mpicxx -O2 bench/compare/mpi_allreduce.cc -o "$out/mpi_allreduce" && have_mpi=1
fi
read -r -a size_list <<< "$sizes"
# Each runner prints "LIB N BYTES P50_US P99_US BUSBW".
run_ours() {  # n
  build/bin/gradsync-bench-allreduce --processes --ranks "$1" --iters "$iters" --algos "$algos" --sizes "$(IFS=,; echo "${size_list[*]}")" |
    awk -v n="$1" '!/^#/ && NF >= 11 {print "gradsync_" $11, n, $1, $5, $6, $8}'
}
run_gloo() {  # n
  local dir; dir=$(mktemp -d)
  local pids=()
  for ((r = 1; r < $1; r++)); do "$out/gloo_allreduce" "$r" "$1" "$dir" "$iters" "${size_list[@]}" >/dev/null 2>&1 & pids+=($!); done
  # Gloo's TCP pairs now and then abort a run ("Connection closed by peer"): that repeat then
  # has no Gloo sample, which the summary's medians skip, and the next repeat goes on.
  if ! "$out/gloo_allreduce" 0 "$1" "$dir" "$iters" "${size_list[@]}" 2>/dev/null | awk -v n="$1" '/^RESULT/ {print "gloo_" $2, n, $3, $4, $5, $6}' ||
     ! wait "${pids[@]}"; then
    echo "# gloo failed at n = $1 in this repeat; its rows lack this repeat" >&2
  fi
  rm -rf "$dir"
}
run_mpi() {  # n btl label
  mpirun --allow-run-as-root --oversubscribe -np "$1" --mca btl "$2" --mca btl_tcp_if_include lo \
    "$out/mpi_allreduce" "$iters" "${size_list[@]}" 2>/dev/null | awk -v n="$1" -v l="$3" '/^RESULT/ {print l, n, $2, $3, $4, $5}'
}
results="$out/results.txt"
: > "$results"
for ((rep = 1; rep <= repeats; rep++)); do
  echo "# repeat $rep of $repeats" >&2
  for n in $ranks; do
    run_ours "$n" >> "$results"
    if [[ $have_gloo == 1 ]]; then run_gloo "$n" >> "$results"; fi
    if [[ $have_mpi == 1 ]]; then
      run_mpi "$n" tcp,self mpi_tcp >> "$results"
      run_mpi "$n" vader,self mpi_shm >> "$results"
    fi
  done
done
python3 - "$results" "$repeats" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    lib, n, size, p50, p99, busbw = line.split()
    rows[(lib, int(n), int(size))].append((float(p50), float(p99), float(busbw)))
libs = sorted({k[0] for k in rows}, key=lambda l: (not l.startswith("gradsync"), l))
ns = sorted({k[1] for k in rows})
sizes = sorted({k[2] for k in rows})
def med(lib, n, size, i):
    v = rows.get((lib, n, size))
    return statistics.median(x[i] for x in v) if v else None
def fmt(x, f="%.1f"):
    return "-" if x is None else f % x
def ratio(a, b, f="%.2f"):
    return "-" if a is None or b is None or b == 0 else f % (a / b)
def human(b):
    return "%d KiB" % (b >> 10) if b < (1 << 20) else "%d MiB" % (b >> 20)
print("# median over %s interleaved repeats of each library's p50 (p99); gradsync_auto's ratios" % sys.argv[2])
small = [s for s in sizes if s <= (1 << 20)]
large = [s for s in sizes if s >= (4 << 20)]
if small:
    print("\n## latency, us: p50 (p99)\n")
    print("| n | size | " + " | ".join(libs) + " | auto / mpi_tcp | auto / ring |")
    print("|---:|---:|" + "---:|" * (len(libs) + 2))
    for n in ns:
        for s in small:
            cells = ["%s (%s)" % (fmt(med(l, n, s, 0)), fmt(med(l, n, s, 1))) for l in libs]
            a = med("gradsync_auto", n, s, 0)
            print("| %d | %s | %s | %s | %s |" % (n, human(s), " | ".join(cells), ratio(a, med("mpi_tcp", n, s, 0)),
                                                  ratio(a, med("gradsync_ring", n, s, 0))))
if large:
    print("\n## busbw, GB/s (p50)\n")
    best_gloo = lambda n, s: max([x for x in (med("gloo_ring_chunked", n, s, 2), med("gloo_halving_doubling", n, s, 2)) if x is not None], default=None)
    print("| n | size | " + " | ".join(libs) + " | auto / best Gloo | auto / mpi_tcp | auto / mpi_shm |")
    print("|---:|---:|" + "---:|" * (len(libs) + 3))
    for n in ns:
        for s in large:
            a = med("gradsync_auto", n, s, 2)
            print("| %d | %s | %s | %s | %s | %s |" % (n, human(s), " | ".join(fmt(med(l, n, s, 2), "%.2f") for l in libs),
                  ratio(a, best_gloo(n, s)), ratio(a, med("mpi_tcp", n, s, 2)), ratio(a, med("mpi_shm", n, s, 2))))
PY
