#!/usr/bin/env bash
# Runs COMMAND inside a real Slurm on this host, made from Debian's slurm-wlm and munge: a
# generated munge key and slurm.conf (one node named after this host, 16 CPUs oversubscribed,
# partition "test"), munged, slurmctld and slurmd in a temporary folder on ports of their own.
# SLURM_CONF points the command's sbatch, srun and scontrol at it. Every daemon it started is
# stopped, and the folder removed, when the command ends; its exit code is the command's.
#   tests/cluster/with_slurm.sh COMMAND [ARGS...]
#   tests/cluster/with_slurm.sh build/bin/gradsync-run experiments/specs/quick.textproto --slurm
# Exit 77 (skipped) without root or the packages.
set -euo pipefail
[[ $# -gt 0 ]] || { echo "usage: with_slurm.sh COMMAND [ARGS...]" >&2; exit 2; }
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || skip "needs root: it starts munged, slurmctld and slurmd"
export PATH=$PATH:/usr/sbin
for c in munged slurmctld slurmd sbatch srun scontrol sinfo; do
  command -v "$c" >/dev/null || skip "$c is missing (scripts/setup.sh installs slurm-wlm and munge)"
done

dir=$(mktemp -d /tmp/gradsync-slurm.XXXXXX)
chmod 755 "$dir"
mkdir -p "$dir"/{munge,state,spool,log}
chmod 700 "$dir/munge"
daemons=()
cleanup() {
  # Jobs still running (an interrupted command) end first: slurmd's steps would outlive it.
  if [[ ${#daemons[@]} -eq 3 ]]; then
    squeue -h -o %i 2>/dev/null | xargs -r timeout 10 scancel 2>/dev/null || true
    for _ in $(seq 50); do [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break; sleep 0.1; done
  fi
  for p in "${daemons[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${daemons[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

host=$(hostname -s)
base=$((20000 + RANDOM % 9000))
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
cat > "$dir/slurm.conf" <<CONF
ClusterName=gradsync
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/sock
SlurmctldPort=$base
SlurmdPort=$((base + 1))
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
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
NodeName=$host NodeAddr=127.0.0.1 CPUs=16 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF=$dir/slurm.conf

munged -F --force --socket="$dir/munge/sock" --key-file="$dir/munge/munge.key" --log-file="$dir/log/munged.log" \
  --pid-file="$dir/munged.pid" --seed-file="$dir/munge/seed" > "$dir/log/munged.out" 2>&1 &
daemons+=($!)
for _ in $(seq 50); do [[ -S $dir/munge/sock ]] && break; sleep 0.1; done
slurmctld -D -i > "$dir/log/slurmctld.out" 2>&1 &
daemons+=($!)
slurmd -D > "$dir/log/slurmd.out" 2>&1 &
daemons+=($!)
for i in $(seq 100); do
  [[ $(sinfo -h -o %T 2>/dev/null) == idle ]] && break
  [[ $i == 100 ]] && { tail -5 "$dir"/log/*.log >&2; fail "the test Slurm's node did not become idle in 30 s"; }
  sleep 0.3
done
echo "== Slurm up: $(sinfo -h -o '%P %D node(s) %c CPUs %T') (slurmctld :$base)"

export WITH_SLURM=$dir
set +e
"$@"
rc=$?
set -e
exit $rc
