#!/usr/bin/env bash
# Overlap of communication with computation, both paths, measured in one run on this machine:
# runs experiments/specs/overlap.textproto (wide MLP 784-2048-2048-10, 4 workers, batch 32;
# all-reduce (overlap with 4 MB buckets, and with the default 25 MB: ar-overlap25) and PS bsp
# with 2 servers; --overlap=true/false alternated, 3 repeats each) and
# prints, from worker 0's metrics rows (every 5 steps, the first row left out as warm-up):
#   step ms      median over rows of the wall time per step (wall_s delta / 5), then the median
#                of the repeats
#   compute ms   median compute_ms (forward + backward, waits for parameters excluded)
#   comm ms      median comm_ms + wait_ms: all-reduce, the communication thread's busy time;
#                PS, the time the training thread was blocked on the shards plus the hidden part
#   hidden       sum hidden_ms / sum comm_ms (the overlap fraction; PS: a lower bound, measured
#                at layer boundaries)
#   vs seq       step time with overlap / without, the same path
# Usage: bench/overlap_compare.sh [OUT_DIR]    (default $BUILD_DIR/bench-overlap; BUILD_DIR=build)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/machine.sh
bin=${BUILD_DIR:-build}/bin
out=${1:-${BUILD_DIR:-build}/bench-overlap}
mkdir -p "$out"
# Without gnuplot gradsync-run writes everything but the plots and exits non-zero: the table
# below needs only the metrics.
if ! "$bin"/gradsync-run experiments/specs/overlap.textproto --out "$out" >"$out.log" 2>&1; then
  if ! grep -q "plots need gnuplot" "$out.log"; then tail -20 "$out.log"; exit 1; fi
  echo "# (no gnuplot here: no plots)"
fi
echo "# gradsync overlap: $(machine)"
for f in "$out"/overlap/*/metrics.csv; do
  # Columns by their names in the header (ARCHITECTURE.md defines them).
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $col["worker"] == 0 && $col["test_accuracy"] == "" && $col["step"] > 0 {
      t = $col["wall_s"]; st = $col["step"]; cm = $col["comm_ms"]; hd = $col["hidden_ms"]
      if (n++ > 0) { step[n] = (t - w) / (st - s) * 1000; sc += cm; sh += hd } w = t; s = st
      c[n] = $col["compute_ms"]; m[n] = cm + $col["wait_ms"]; h[n] = hd }
    function med(a, k,   i, j, t, v) { for (i = 2; i <= k; i++) v[i - 1] = a[i]; k--
      for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2 }
    END { printf "%s %.2f %.2f %.2f %.4f\n", run, med(step, n), med(c, n), med(m, n), (sc > 0 ? sh / sc : 0) }' \
    run="$(basename "$(dirname "$f")")" "$f"
done | awk '
  { split($1, p, "-"); key = p[1] "-" p[2]; k = ++cnt[key]; st[key, k] = $2; co[key, k] = $3; cm[key, k] = $4; hid[key, k] = $5 }
  function med3(a, key, k,   i, j, t, v) { for (i = 1; i <= k; i++) v[i] = a[key, i]
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2 }
  END {
    printf "%-16s %8s %11s %9s %8s %7s\n", "path", "step ms", "compute ms", "comm ms", "hidden", "vs seq"
    split("ar-sequential ar-overlap ar-overlap25 ps-sequential ps-overlap", order, " ")
    for (o = 1; o <= 5; o++) { key = order[o]; k = cnt[key]; if (!k) continue
      s = med3(st, key, k); split(key, p, "-"); base = p[1] "-sequential"
      printf "%-16s %8.1f %11.1f %9.1f %8s %7s\n", key, s, med3(co, key, k), med3(cm, key, k),
        p[2] ~ /^overlap/ ? sprintf("%.0f%%", 100 * med3(hid, key, k)) : "-",
        p[2] ~ /^overlap/ && cnt[base] ? sprintf("%.2f", s / med3(st, base, cnt[base])) : "-" } }'
