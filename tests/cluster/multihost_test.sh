#!/usr/bin/env bash
# Multi-host without a cluster: four "hosts", each a network namespace with its own address on a
# private bridge (10.214.0.1-4) and its own /etc/hosts naming the others, and a real Open MPI
# mpirun whose remote shell enters a host's namespace. Every gradsync process runs on its host,
# started by mpirun (not by gradsync-launch's local launcher), and finds the scheduler by host
# name, so nothing can assume 127.0.0.1: a parameter-server job (2 servers, 2 workers, bsp), a
# 4-rank all-reduce job, and a 4-rank all-reduce job on two of the hosts, two ranks on each (the
# hierarchical all-reduce: shared memory within a host, the leaders' ring between them, against
# the same job over TCP alone). Removes the namespaces and their /etc/netns folders on exit.
#   tests/cluster/multihost_test.sh BIN_DIR    exit 77 (skipped) without root, ip or mpirun
set -euo pipefail
bin=$(cd "${1:?usage: multihost_test.sh BIN_DIR}" && pwd)
# Skipped (77) on a developer's machine without the prerequisites; under CI=true that fails.
skip() { [[ ${CI:-} == true ]] && { echo "FAIL: $* (CI=true: a missing prerequisite fails)" >&2; exit 1; }; echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || skip "needs root: it makes network namespaces"
command -v ip >/dev/null || skip "ip is missing (iproute2)"
command -v mpirun >/dev/null || skip "mpirun is missing (scripts/setup.sh installs openmpi-bin)"

# shellcheck source=hosts.sh
source "$(dirname "$0")/hosts.sh"
dir=$(mktemp -d /tmp/gradsync-multihost-test.XXXXXX)
trap 'remove_hosts; rm -rf "$dir"' EXIT
hosts=(h0 h1 h2 h3)
make_hosts "gsmh$$" 10.214.0 "${hosts[@]}"
# mpirun's remote shell: "agent HOST COMMAND..." runs COMMAND on HOST, i.e. in its namespace.
cat > "$dir/agent" <<AGENT
#!/bin/sh
host=\$1
shift
exec ip netns exec "$hosts_prefix\$host" sh -c "\$*"
AGENT
chmod +x "$dir/agent"

job() {  # name "HOST OF TASK 0..3" gradsync-launch-options... -- worker flags
  local name=$1 placement=($2); shift 2
  local spec
  spec=$(for h in "${placement[@]}"; do echo "h$h"; done | sort | uniq -c | awk '{printf "%s%s:%s", (NR > 1 ? "," : ""), $2, $1}')
  echo "== mpirun -n 4 (tasks on hosts ${placement[*]}): $name"
  local try
  for try in 1 2 3; do
    # Open MPI's session directories in a folder of this test's own (TMPDIR), not the shared /tmp
    # where another test's mpirun may hold the same names; a new one per try, as a failed try
    # leaves its session directory behind ("mkdir ... File exists" on the next).
    mkdir -p "$dir/ompi-tmp-$name-$try"
    if TMPDIR="$dir/ompi-tmp-$name-$try" timeout 180 ip netns exec "${hosts_prefix}h0" mpirun --allow-run-as-root -n 4 --host "$spec" --map-by slot \
      --mca plm_rsh_agent "$dir/agent" --mca oob_tcp_if_include 10.214.0.0/24 --mca btl_tcp_if_include 10.214.0.0/24 \
      "$bin/gradsync-launch" --cluster --scheduler="${hosts[0]}:29411" --out="$dir/$name" "$@" > "$dir/$name.out" 2>&1; then
      break
    fi
    # Open MPI's own daemons failing to start (seen once in ~20 runs alone, more often beside
    # another test run) is not the job's failure: up to three tries. Anything else fails the test.
    if [[ $try -lt 3 ]] && grep -aq 'ORTE was unable to reliably start one or more daemons' "$dir/$name.out"; then
      echo "   (mpirun could not start its daemons; trying again)"
      rm -rf "${dir:?}/$name"
      continue
    fi
    cat "$dir/$name.out" >&2
    fail "$name: the job failed"
  done
  grep -av '^\[' "$dir/$name.out" | grep -E 'gradsync-launch:|final test_acc|shard\(s\)|over the ring|all-reduce' || true
  local i h
  for i in 0 1 2 3; do
    h=${placement[$i]}
    grep -aq "task $i of 4 (Open MPI's OMPI_COMM_WORLD_RANK=$i of .* at 10.214.0.$((h + 1))[ ;]" "$dir/$name.out" ||
      fail "$name: task $i did not run on host h$h (10.214.0.$((h + 1)))"
  done
  final_accuracy_at_least "$dir/$name.out" 75
}

job bsp "0 1 2 3" --servers=2 --mode=bsp -- --model=softmax --dataset=fashion-mnist --epochs=1 --batch=32
# Each worker's files landed on its own host's disk (one disk here): both workers wrote theirs.
[[ -s $dir/bsp/worker-1.csv && -s $dir/bsp/server-1.json ]] || fail "bsp: a process wrote no files"
grep -aq 'values through shared memory' "$dir/bsp.out" && fail "bsp: shared memory between hosts"
job allreduce "0 1 2 3" --mode=allreduce -- --model=softmax --dataset=fashion-mnist --epochs=1 --batch=32
[[ $(grep -ac 'received over the ring' "$dir/allreduce.out") == 4 ]] || fail "allreduce: not 4 ring members"
grep -aq 'all-reduce over TCP between 4 workers on 4 host(s)' "$dir/allreduce.out" || fail "allreduce: not 4 hosts over TCP"
# Two hosts, two ranks on each: hierarchical, and the same job over TCP alone trains alike.
job hier "0 0 1 1" --mode=allreduce -- --model=softmax --dataset=fashion-mnist --epochs=1 --batch=32
grep -aq 'hierarchical all-reduce: 4 workers on 2 hosts' "$dir/hier.out" || fail "hier: not hierarchical"
job flat "0 0 1 1" --mode=allreduce -- --model=softmax --dataset=fashion-mnist --epochs=1 --batch=32 --allreduce-shm=false
grep -aq 'all-reduce over TCP between 4 workers on 2 host(s)' "$dir/flat.out" || fail "flat: shared memory though off"
# Only the leaders (tasks 0 and 2) send all-reduce data over TCP in the hierarchy; the others
# send what the set-up and the final barrier need. Over TCP alone every rank sends a ring's share.
acc() { grep -ao 'final test_acc *[0-9.]*%' "$1" | head -1 | grep -o '[0-9.]*'; }
awk -v a="$(acc "$dir/hier.out")" -v b="$(acc "$dir/flat.out")" 'BEGIN { d = a - b; exit !(d < 0.3 && d > -0.3) }' ||
  fail "hier: accuracy $(acc "$dir/hier.out")% against $(acc "$dir/flat.out")% over TCP alone"
sent() { grep -ao "worker $2: [0-9]* bytes sent" "$1" | grep -o '[0-9]* bytes' | grep -o '[0-9]*'; }
for w in 1 3; do
  [[ $(sent "$dir/hier.out" $w) -lt $(( $(sent "$dir/flat.out" $w) / 100 )) ]] ||
    fail "hier: worker $w sent $(sent "$dir/hier.out" $w) bytes over TCP (flat: $(sent "$dir/flat.out" $w))"
done
echo "   worker 1 sent $(sent "$dir/hier.out" 1) bytes over TCP in the hierarchy, $(sent "$dir/flat.out" 1) over TCP alone"
echo "PASS: a PS job and an all-reduce job over 4 namespace hosts, and the hierarchical all-reduce on 2 of them, started by mpirun"
