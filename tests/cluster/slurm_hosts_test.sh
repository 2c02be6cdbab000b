#!/usr/bin/env bash
# Slurm across hosts: with_slurm.sh --hosts=3 makes three Slurm nodes n1..n3, each a network
# namespace with its own address (10.215.0.2-4) and /etc/hosts, and the controller on a fourth.
# srun deals a job's tasks to the nodes: a PS job (2 servers, 2 workers, cyclic: the servers on
# different nodes) and a 3-rank all-reduce job (one rank per node). Each task must advertise its
# own node's address, find the scheduler at the allocation's first node (n1, through scontrol and
# that node's name), and the jobs must train.
#   tests/cluster/slurm_hosts_test.sh BIN_DIR       exit 77 (skipped) without root or the packages
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[[ -n ${WITH_SLURM:-} ]] || exec "$here/with_slurm.sh" --hosts=3 "$here/slurm_hosts_test.sh" "$@"
bin=$(cd "${1:?usage: slurm_hosts_test.sh BIN_DIR}" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=hosts.sh
source "$here/hosts.sh"
dir=$(mktemp -d /tmp/gradsync-slurm-hosts-test.XXXXXX)
trap 'rm -rf "$dir"' EXIT
flags=(--model=softmax --dataset=fashion-mnist --epochs=1 --batch=32)

job() {  # name srun-options... -- gradsync-launch options...
  local name=$1; shift
  echo "== srun $*" | sed "s|$bin/||"
  timeout 180 srun --kill-on-bad-exit=1 --label "$@" > "$dir/$name.out" 2>&1 || { cat "$dir/$name.out" >&2; fail "$name failed"; }
  grep -E 'gradsync-launch:|final test_acc|shard\(s\)|over the ring' "$dir/$name.out" | sort -n -s -k1,1
  final_accuracy_at_least "$dir/$name.out" 75
  grep -q "scheduler n1:[0-9]* (10.215.0.2)" "$dir/$name.out" || fail "$name: the scheduler is not on n1"
}
# The node a task ran on, from the address it advertised: n1 is 10.215.0.2.
node_of() {  # name task
  grep -o "^ *$2: gradsync-launch: task $2 of [0-9]* .* at 10\.215\.0\.[0-9]*" "$dir/$1.out" | grep -o '[0-9]*$' |
    awk '{ print "n" ($1 - 1) }'
}

job ps -N 3 -n 4 --distribution=cyclic "$bin/gradsync-launch" --slurm --servers=2 --mode=bsp --out="$dir/ps" -- "${flags[@]}"
s0=$(node_of ps 0) s1=$(node_of ps 1)
echo "   server 0 on $s0, server 1 on $s1"
[[ $s0 == n1 && $s1 == n2 ]] || fail "ps: the servers are not on n1 and n2 (cyclic)"
job allreduce -N 3 -n 3 "$bin/gradsync-launch" --slurm --mode=allreduce --out="$dir/allreduce" -- "${flags[@]}"
[[ "$(node_of allreduce 0) $(node_of allreduce 1) $(node_of allreduce 2)" == "n1 n2 n3" ]] || fail "allreduce: not one rank per node"
[[ $(grep -c 'received over the ring' "$dir/allreduce.out") == 3 ]] || fail "allreduce: not 3 ring members"
echo "PASS: a PS job and an all-reduce job over 3 Slurm nodes with their own addresses"
