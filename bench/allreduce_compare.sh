#!/usr/bin/env bash
# All-reduce busbw of gradsync's CPU ring against Gloo's ring_chunked and OpenMPI's MPI_Allreduce
# (TCP, and shared memory), measured in the same run on this machine, with ratios.
# Needs build/bin/gradsync-bench-allreduce; Gloo and OpenMPI columns appear when Debian's
# libgloo-dev / openmpi-bin + libopenmpi-dev are installed (scripts/setup.sh --bench installs them).
# Usage: bench/allreduce_compare.sh [ITERS] [BYTES...]    (defaults: 20; 1 MiB .. 256 MiB, x4)
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-20}
shift || true
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(1048576 4194304 16777216 67108864 268435456)
out=build/bench-compare
mkdir -p "$out"
have_gloo=0 have_mpi=0
if [[ -f /usr/include/gloo/allreduce_ring_chunked.h ]]; then
  g++ -O2 -std=c++17 bench/compare/gloo_allreduce.cc -o "$out/gloo_allreduce" -L/usr/lib -lgloo -pthread && have_gloo=1
fi
if command -v mpicxx >/dev/null; then
  mpicxx -O2 bench/compare/mpi_allreduce.cc -o "$out/mpi_allreduce" && have_mpi=1
fi
declare -A result
run_ours() {  # n
  build/bin/gradsync-bench-allreduce --ranks "$1" --iters "$iters" --sizes "$(IFS=,; echo "${sizes[*]}")" |
    awk -v n="$1" '!/^#/ {print "ours", n, $1, $8}'
}
run_gloo() {  # n
  local dir; dir=$(mktemp -d)
  local pids=()
  for ((r = 1; r < $1; r++)); do "$out/gloo_allreduce" "$r" "$1" "$dir" "$iters" "${sizes[@]}" >/dev/null & pids+=($!); done
  "$out/gloo_allreduce" 0 "$1" "$dir" "$iters" "${sizes[@]}" | awk -v n="$1" '/^RESULT/ {print "gloo", n, $2, $4}'
  wait "${pids[@]}"
  rm -rf "$dir"
}
run_mpi() {  # n btl label
  mpirun --allow-run-as-root --oversubscribe -np "$1" --mca btl "$2" --mca btl_tcp_if_include lo \
    "$out/mpi_allreduce" "$iters" "${sizes[@]}" 2>/dev/null | awk -v n="$1" -v l="$3" '/^RESULT/ {print l, n, $2, $4}'
}
{
  for n in 2 4; do
    run_ours "$n"
    [[ $have_gloo == 1 ]] && run_gloo "$n"
    [[ $have_mpi == 1 ]] && run_mpi "$n" tcp,self mpi_tcp && run_mpi "$n" vader,self mpi_shm
  done
} > "$out/results.txt"
printf "# busbw GB/s (p50 over %s iterations, fewer for big sizes); ratio = gradsync / other\n" "$iters"
printf "%-4s %12s %10s %10s %7s %10s %7s %10s\n" n bytes gradsync gloo ratio mpi_tcp ratio mpi_shm
awk '{v[$1" "$2" "$3]=$4; if (!seen[$2" "$3]++) keys[++k]=$2" "$3}
     END {for (i=1;i<=k;i++) {split(keys[i],a," "); o=v["ours "keys[i]]; g=v["gloo "keys[i]]; t=v["mpi_tcp "keys[i]]; s=v["mpi_shm "keys[i]];
          printf "%-4s %12s %10s %10s %7s %10s %7s %10s\n", a[1], a[2], o, (g==""?"-":g), (g==""?"-":sprintf("%.2f",o/g)), (t==""?"-":t), (t==""?"-":sprintf("%.2f",o/t)), (s==""?"-":s)}}' \
  "$out/results.txt"
