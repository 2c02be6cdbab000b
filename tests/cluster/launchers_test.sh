#!/usr/bin/env bash
# One bsp job (2 servers, 2 workers, the Fashion-MNIST softmax model) started four ways on this
# host: gradsync-launch's own local launcher, Open MPI's mpirun, torchrun, and torchrun-style
# variables set by hand. bsp is deterministic, so every way must end with the same test loss and
# accuracy to the last digit worker 0 wrote. Then the errors: launchers that disagree on a rank,
# and no launcher at all.
#   tests/cluster/launchers_test.sh BIN_DIR
set -euo pipefail
bin=$(cd "${1:?usage: launchers_test.sh BIN_DIR}" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
# A leg's prerequisite is missing: skipped here, a failure under CI=true (CI must run every leg).
missing() { [[ ${CI:-} == true ]] && fail "$* (CI=true: a missing prerequisite fails)"; echo "== skipped: $*"; }
dir=$(mktemp -d /tmp/gradsync-launchers-test.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
flags=(--model=softmax --dataset=fashion-mnist --epochs=1 --batch=32)
port=$((30000 + RANDOM % 2000))
# worker 0's final test loss and accuracy
final() { tail -1 "$dir/$1/worker-0.csv" | awk -F, '{ print $14, $15 }'; }
check() {  # name
  local got
  got=$(final "$1")
  echo "== $1: test loss, accuracy $got"
  [[ $got == "$reference" ]] || fail "$1 ended at '$got', the local launcher at '$reference'"
}

timeout 120 "$bin/gradsync-launch" --servers=2 --workers=2 --mode=bsp --out="$dir/local" -- "${flags[@]}" > "$dir/local.out" 2>&1 ||
  { cat "$dir/local.out" >&2; fail "the local launcher's job failed"; }
reference=$(final local)
echo "== local (gradsync-launch --servers=2 --workers=2): test loss, accuracy $reference"

if command -v mpirun >/dev/null; then
  mkdir -p "$dir/ompi-tmp"  # Open MPI's session directories: this test's own, not the shared /tmp
  TMPDIR="$dir/ompi-tmp" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun --oversubscribe -n 4 \
    "$bin/gradsync-launch" --cluster --servers=2 --mode=bsp --scheduler=127.0.0.1:$port --out="$dir/mpirun" -- "${flags[@]}" \
    > "$dir/mpirun.out" 2>&1 || { cat "$dir/mpirun.out" >&2; fail "the mpirun job failed"; }
  grep -q "task 3 of 4 (Open MPI's OMPI_COMM_WORLD_RANK=3 of" "$dir/mpirun.out" || fail "mpirun: Open MPI's rank was not taken"
  check mpirun
else
  missing "mpirun (no mpirun: scripts/setup.sh installs openmpi-bin)"
fi

# Debian's torch 1.13 on Python 3.11 mis-parses torchrun's default --redirects: give it explicitly.
# The master port is below the ephemeral range (like $port): --standalone picks an ephemeral one,
# and the scheduler's MASTER_PORT+1 could then be a port some connection of the machine holds.
if [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null; then
  timeout 120 /usr/bin/python3 -m torch.distributed.run --nnodes=1 --nproc_per_node=4 --master_addr=127.0.0.1 \
    --master_port=$((port + 20)) --redirects=1 --tee=1 --no_python \
    "$bin/gradsync-launch" --cluster --servers=2 --mode=bsp --out="$dir/torchrun" -- "${flags[@]}" \
    > "$dir/torchrun.out" 2>&1 || { cat "$dir/torchrun.out" >&2; fail "the torchrun job failed"; }
  grep -q "task 3 of 4 (torchrun's RANK=3 of WORLD_SIZE=4)" "$dir/torchrun.out" || fail "torchrun: its rank was not taken"
  check torchrun
else
  missing "torchrun (no torch for /usr/bin/python3: scripts/setup.sh installs python3-torch)"
fi

for r in 0 1 2 3; do
  RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r LOCAL_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 10)) timeout 120 \
    "$bin/gradsync-launch" --cluster --servers=2 --mode=bsp --out="$dir/env" -- "${flags[@]}" > "$dir/env-$r.out" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { cat "$dir"/env-*.out >&2; fail "a task started with RANK/WORLD_SIZE failed"; }; done
pids=()
grep -q "scheduler 127.0.0.1:$((port + 11))" "$dir/env-0.out" || fail "the scheduler is not at MASTER_ADDR:MASTER_PORT+1"
check env

# Errors: one line, a non-zero exit, nothing started.
set +e
out=$(RANK=1 WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=4 "$bin/gradsync-launch" --cluster --out="$dir/x" 2>&1)
rc=$?
set -e
echo "== disagreeing launchers: exit $rc: $out"
[[ $rc == 2 && $out == *"the launchers disagree on this process's rank: torchrun's RANK=1 of WORLD_SIZE=4 but Open MPI's OMPI_COMM_WORLD_RANK=2"* ]] ||
  fail "disagreeing launchers were not refused as expected"
set +e
out=$(env -u RANK -u OMPI_COMM_WORLD_RANK -u PMI_RANK -u SLURM_PROCID "$bin/gradsync-launch" --cluster --out="$dir/x" 2>&1)
rc=$?
set -e
echo "== no launcher: exit $rc: $out"
[[ $rc == 1 && $out == *"no launcher gave this process a rank"* ]] || fail "a task without a launcher was not refused"
set +e
out=$(RANK=0 WORLD_SIZE=1 "$bin/gradsync-launch" --slurm --out="$dir/x" 2>&1)
rc=$?
set -e
echo "== --slurm under torchrun's variables: exit $rc: $out"
[[ $rc == 1 && $out == *"not Slurm's"* ]] || fail "--slurm took a rank that is not Slurm's"
echo "PASS: the same bsp job, bit for bit, from the local launcher, mpirun, torchrun and RANK/WORLD_SIZE"
