#!/usr/bin/env bash
# Runs COMMAND inside a real Slurm made from Debian's slurm-wlm and munge: a generated munge key
# and slurm.conf, munged, slurmctld and slurmd in a temporary folder. SLURM_CONF points the
# command's sbatch, srun and scontrol at it. Every daemon it started is stopped, and everything
# it made removed, when the command ends; its exit code is the command's.
#
#   tests/cluster/with_slurm.sh COMMAND [ARGS...]
#       one node named after this host (16 CPUs, oversubscribed), on ports of its own; COMMAND
#       runs here
#   tests/cluster/with_slurm.sh --hosts=N COMMAND [ARGS...]
#       N nodes n1..nN, each a network namespace of its own (10.215.0.2..) on a private bridge
#       with its own /etc/hosts, and the controller on a head namespace (10.215.0.1) where
#       COMMAND runs: every task runs on its node's address, as on a cluster
#
#   tests/cluster/with_slurm.sh build/bin/gradsync-run experiments/specs/quick.textproto --slurm
# Exit 77 (skipped) without root or the packages.
set -euo pipefail
hosts=0
if [[ ${1:-} == --hosts=* ]]; then
  hosts=${1#--hosts=}
  shift
  [[ $hosts =~ ^[1-8]$ ]] || { echo "with_slurm.sh: --hosts takes 1 to 8" >&2; exit 2; }
fi
[[ $# -gt 0 ]] || { echo "usage: with_slurm.sh [--hosts=N] COMMAND [ARGS...]" >&2; exit 2; }
# Skipped (77) on a developer's machine without the prerequisites; under CI=true that fails.
skip() { [[ ${CI:-} == true ]] && { echo "FAIL: $* (CI=true: a missing prerequisite fails)" >&2; exit 1; }; echo "SKIP: $*"; exit 77; }
# shellcheck source=hosts.sh
source "$(dirname "$0")/hosts.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || skip "needs root: it starts munged, slurmctld and slurmd"
export PATH=$PATH:/usr/sbin
for c in munged slurmctld slurmd sbatch srun scontrol sinfo squeue scancel; do
  command -v "$c" >/dev/null || skip "$c is missing (scripts/setup.sh installs slurm-wlm and munge)"
done
if [[ $hosts -gt 0 ]]; then
  for c in ip nsenter unshare; do command -v "$c" >/dev/null || skip "$c is missing (iproute2, util-linux)"; done
fi

dir=$(mktemp -d /tmp/gradsync-slurm.XXXXXX)
chmod 755 "$dir"
mkdir -p "$dir"/{munge,state,log}
chmod 700 "$dir/munge"
p=gsl$$   # namespace names: ${p}head, ${p}n1, ...
names=()
daemons=()
# A command on host $1 (with --hosts): its network namespace and its /etc/hosts; /sys stays this
# host's (slurmd needs its cgroups), unlike `ip netns exec`.
on() {
  local h=$1
  shift
  if [[ $hosts -eq 0 ]]; then "$@"; return; fi
  nsenter --net="/run/netns/$p$h" unshare --mount sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "/etc/netns/$p$h/hosts" "$@"
}
# The same, becoming the command (for a daemon started with &: $! is then the daemon).
become_on() {
  local h=$1
  shift
  if [[ $hosts -eq 0 ]]; then exec "$@"; fi
  exec nsenter --net="/run/netns/$p$h" unshare --mount sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "/etc/netns/$p$h/hosts" "$@"
}
cleanup() {
  # Jobs still running (an interrupted command) end first: slurmd's steps would outlive it.
  if [[ ${#daemons[@]} -ge 3 ]]; then
    local jobs
    jobs=$(on head squeue -h -o %i 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      on head timeout 10 scancel $jobs 2>/dev/null || true
      for _ in $(seq 100); do [[ -z $(on head squeue -h -o %i 2>/dev/null || true) ]] && break; sleep 0.1; done
    fi
  fi
  for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${daemons[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  remove_hosts
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
if [[ $hosts -eq 0 ]]; then
  # Slurm's own two ports: above the ports gradsync-launch --slurm derives from job ids
  # (10000-29999, experiments/launch/cluster_task.cc), below the kernel's ephemeral range.
  base=$((30000 + RANDOM % 2700))
  ctld_host="$(hostname -s)(127.0.0.1)"
  node_lines="NodeName=$(hostname -s) NodeAddr=127.0.0.1 CPUs=16 RealMemory=1000 State=UNKNOWN"
  node_list=$(hostname -s)
else
  base=6817
  names=(head)
  for ((i = 1; i <= hosts; i++)); do names+=("n$i"); done
  make_hosts "$p" 10.215.0 "${names[@]}"
  # slurmctld insists on running where SlurmctldHost's name is this machine's.
  ctld_host="$(hostname -s)(10.215.0.1)"
  node_lines=""
  for ((i = 1; i <= hosts; i++)); do
    node_lines+="NodeName=n$i NodeAddr=10.215.0.$((i + 1)) CPUs=8 RealMemory=1000 State=UNKNOWN"$'\n'
  done
  node_list=n[1-$hosts]
fi
# Job ids from a random start: gradsync-launch --slurm derives its scheduler's port from the job
# id, and two such Slurms on one machine (two checkouts testing at once) would otherwise both run
# job 1 and bind the same port.
first_job=$((1 + RANDOM % 30000))
cat > "$dir/slurm.conf" <<CONF
ClusterName=gradsync
SlurmctldHost=$ctld_host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/sock
SlurmctldPort=$base
SlurmdPort=$((base + 1))
FirstJobId=$first_job
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=5
$node_lines
PartitionName=test Nodes=$node_list Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF=$dir/slurm.conf

# munged's socket is a file: every namespace host reaches it.
munged -F --force --socket="$dir/munge/sock" --key-file="$dir/munge/munge.key" --log-file="$dir/log/munged.log" \
  --pid-file="$dir/munged.pid" --seed-file="$dir/munge/seed" > "$dir/log/munged.out" 2>&1 &
daemons+=($!)
for _ in $(seq 50); do [[ -S $dir/munge/sock ]] && break; sleep 0.1; done
become_on head slurmctld -D -i > "$dir/log/slurmctld.out" 2>&1 &
daemons+=($!)
if [[ $hosts -eq 0 ]]; then
  slurmd -D > "$dir/log/slurmd.out" 2>&1 &
  daemons+=($!)
else
  for ((i = 1; i <= hosts; i++)); do
    become_on "n$i" slurmd -D -N "n$i" > "$dir/log/slurmd-n$i.out" 2>&1 &
    daemons+=($!)
  done
fi
want="idle $((hosts > 0 ? hosts : 1))"
for i in $(seq 100); do
  [[ $(on head sinfo -h -o '%T %D' 2>/dev/null || true) == "$want" ]] && break
  [[ $i == 100 ]] && { tail -n 5 "$dir"/log/*.log >&2; fail "the test Slurm's nodes did not become idle in 30 s"; }
  sleep 0.3
done
echo "== Slurm up: $(on head sinfo -h -o '%P %D node(s) %N, %c CPUs each, %T')"

export WITH_SLURM=$dir
# In the background, so that a TERM or INT (Ctrl-C, a test's timeout) stops it and cleans up at
# once instead of after it.
set -m  # its own process group: the signal reaches everything it started
on head "$@" &
command_pid=$!
set +m
trap 'kill -TERM -- "-$command_pid" 2>/dev/null; exit 143' TERM INT
set +e
wait "$command_pid"
rc=$?
set -e
exit $rc
