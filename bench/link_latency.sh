#!/usr/bin/env bash
# What a small message's trip costs on this machine's emulated links, for gradsync-sim's
# latency_us: two network namespaces on a bridge, as experiments/launch/netns.cc builds a run's
# (a veth pair per host, tc tbf with its bucket on the bridge's end), and a TCP ping-pong between
# them whose ends poll instead of sleeping (bench/link_latency.py). Prints the median round trip
# per message size; half of it is the one-way latency (an upper bound: Python's own send and
# receive calls are in it). Needs root and iproute2; its namespaces are removed on exit.
# Usage: bench/link_latency.sh [RATE|unshaped] [COUNT]    (default 1gbit, 2000 round trips a size)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/machine.sh
rate=${1:-1gbit}
count=${2:-2000}
case "$rate" in -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
[[ $count =~ ^[1-9][0-9]{1,5}$ ]] || { echo "link_latency.sh: COUNT '$count' is not a count from 10 to 999999" >&2; exit 2; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "link_latency.sh: needs iproute2 (ip and tc)" >&2; exit 2; }
p=gslat$$
cleanup() { for ns in $p-h1 $p-h2 $p-br; do ip netns del "$ns" 2>/dev/null || true; done; }
trap cleanup EXIT
ip netns add $p-br
ip -n $p-br link add br0 type bridge
ip -n $p-br link set br0 up
for h in 1 2; do
  ip netns add $p-h$h
  ip -n $p-h$h link add in$h type veth peer name out$h
  ip -n $p-h$h link set out$h netns $p-br
  ip -n $p-br link set out$h master br0
  ip -n $p-br link set out$h up
  ip -n $p-h$h addr add 10.77.0.$h/24 dev in$h
  ip -n $p-h$h link set in$h up
  ip -n $p-h$h link set lo up
  if [ "$rate" != unshaped ]; then
    # The bucket netns.cc gives a link (experiments/spec/link.cc, TbfBurstBytes): 4 ms of the rate, at least 70,000 bytes.
    burst=$(/usr/bin/python3 -c "
import re, sys
m = re.fullmatch(r'([0-9.]+)(bit|kbit|mbit|gbit)', sys.argv[1])
if not m: sys.exit('link_latency.sh: ' + sys.argv[1] + ' is not a tc rate like 1gbit or 100mbit')
bits = float(m[1]) * {'bit': 1, 'kbit': 1e3, 'mbit': 1e6, 'gbit': 1e9}[m[2]]
print(int(max(70000, bits / 8 * 0.004)))" "$rate")
    tc -n $p-br qdisc add dev out$h root tbf rate "$rate" burst "$burst" latency 200ms
  fi
done
echo "# link latency, $rate link, $count round trips a size: $(machine)"
for size in 64 1024 4096; do
  timeout 60 ip netns exec $p-h1 /usr/bin/python3 bench/link_latency.py serve 10.77.0.1 5599 "$count" "$size" &
  sleep 0.3
  timeout 60 ip netns exec $p-h2 /usr/bin/python3 bench/link_latency.py ping 10.77.0.1 5599 "$count" "$size"
  wait
done
