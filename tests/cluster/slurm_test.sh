#!/usr/bin/env bash
# Under a real single-host Slurm (with_slurm.sh): submits the shipped sbatch scripts (a 2-server
# 2-worker bsp job, a 4-rank all-reduce job), mpirun inside an sbatch script (Open MPI's ranks,
# not the batch shell's SLURM_PROCID), a PyTorch script as the workers through srun, and
# `gradsync-run --slurm`, and checks what each wrote.
#   tests/cluster/slurm_test.sh BIN_DIR        exit 77 (skipped) without root or the packages
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[[ -n ${WITH_SLURM:-} ]] || exec "$here/with_slurm.sh" "$here/slurm_test.sh" "$@"
bin=$(cd "${1:?usage: slurm_test.sh BIN_DIR}" && pwd)
root=$(cd "$here/../.." && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=hosts.sh
source "$here/hosts.sh"
dir=$(mktemp -d /tmp/gradsync-slurm-test.XXXXXX)
trap 'rm -rf "$dir"' EXIT

# Runs a batch job to the end (at most 180 s) and prints its output.
submit() {  # name script [args...]
  local name=$1; shift
  timeout 180 sbatch --wait --quiet --output="$dir/$name.out" --export=ALL,GRADSYNC_BIN_DIR="$bin" "$@" ||
    { cat "$dir/$name.out" >&2 || true; fail "sbatch $name failed"; }
  echo "== sbatch $name: $dir/$name.out"
  cat "$dir/$name.out"
}

submit ps "$root/examples/slurm/ps_job.sbatch" "$dir/ps"
final_accuracy_at_least "$dir/ps.out" 80
grep -q 'server 1 at .*; scheduler' "$dir/ps.out" || fail "ps: no task ran server 1"
for f in worker-0.csv worker-1.csv worker-0.json worker-1.json server-0.json server-1.json; do
  [[ -s $dir/ps/$f ]] || fail "ps: $f missing"
done

submit allreduce "$root/examples/slurm/allreduce_job.sbatch" "$dir/allreduce"
final_accuracy_at_least "$dir/allreduce.out" 80
[[ $(grep -c 'received over the ring' "$dir/allreduce.out") == 4 ]] || fail "allreduce: not 4 ring members"

if command -v mpirun >/dev/null; then
  cat > "$dir/mpi.sbatch" <<JOB
#!/bin/bash
#SBATCH --ntasks=3
# Open MPI's session directories: this job's own, not the shared /tmp.
export TMPDIR=\$(mktemp -d "$dir/ompi-tmp.XXXXXX")
mpirun --allow-run-as-root --oversubscribe -n 3 "$bin/gradsync-launch" --cluster --servers=1 --mode=ssp --staleness=2 \\
  --out="$dir/mpi" -- --model=softmax --dataset=fashion-mnist --epochs=1 --batch=32
JOB
  submit mpi "$dir/mpi.sbatch"
  final_accuracy_at_least "$dir/mpi.out" 75
  grep -q "task 2 of 3 (Open MPI's OMPI_COMM_WORLD_RANK=2 of" "$dir/mpi.out" || fail "mpi: Open MPI's rank was not taken"
else
  missing "mpirun inside sbatch (no mpirun: scripts/setup.sh installs openmpi-bin)"
fi

# A PyTorch script as the workers (gradsync.torch), srun straight from here: 1 server, 2 workers.
if /usr/bin/python3 -c 'import torch' 2>/dev/null && [[ -d $bin/../python/gradsync ]]; then
  cat > "$dir/tiny.py" <<'PY'
import torch
import gradsync.torch as gs

gs.init()
torch.manual_seed(0)
model = torch.nn.Linear(20, 2)
opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5), named_parameters=model.named_parameters())
g = torch.Generator().manual_seed(100 + gs.rank())
x = torch.randn(256, 20, generator=g)
y = (x[:, 0] > 0).long()
for step in range(60):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
print("torch worker %d of %d (%s): loss %.4f" % (gs.rank(), gs.size(), gs.mode(), loss.item()), flush=True)
gs.shutdown()
PY
  echo "== srun -n 3 gradsync-launch --slurm --servers=1 --mode=bsp -- python3 tiny.py"
  timeout 180 srun -n 3 --kill-on-bad-exit=1 --label "$bin/gradsync-launch" --slurm --servers=1 --mode=bsp --out="$dir/torch" \
    -- python3 "$dir/tiny.py" > "$dir/torch.out" 2>&1 || { cat "$dir/torch.out" >&2; fail "the PyTorch job failed"; }
  grep -E 'gradsync-launch:|torch worker' "$dir/torch.out"
  for r in 0 1; do
    loss=$(grep -o "torch worker $r of 2 (bsp): loss [0-9.]*" "$dir/torch.out" | grep -o '[0-9.]*$')
    [[ -n $loss ]] && awk -v l="$loss" 'BEGIN { exit !(l < 0.3) }' || fail "torch worker $r: loss '$loss' not below 0.3"
  done
else
  missing "PyTorch workers (no torch for /usr/bin/python3 or no gradsync Python package in the build)"
fi

cat > "$dir/spec.textproto" <<SPEC
name: "slurmtest"
target_accuracy: 0.75
defaults { workers: 2 servers: 1 train { model: "mlp" dataset: "fashion-mnist" epochs: 1 batch: 16 max_steps: 200 eval_every: 100 } }
run { name: "ssp2" train { mode: SSP staleness: 2 } straggler { worker: 1 multiple: 2 } }
run { name: "allreduce" train { mode: ALLREDUCE } }
SPEC
echo "== gradsync-run --slurm"
timeout 300 "$bin/gradsync-run" "$dir/spec.textproto" --slurm --out="$dir/results" || fail "gradsync-run --slurm failed"
summary=$dir/results/slurmtest/summary.md
cat "$summary"
for run in ssp2 allreduce; do
  grep -q "^| $run |" "$summary" || fail "summary.md has no row for $run"
  [[ -s $dir/results/slurmtest/$run/worker-1.csv && -s $dir/results/slurmtest/$run/logs/worker-1.log ]] ||
    fail "$run: worker 1's files did not come back"
done
[[ -s $dir/results/slurmtest/ssp2/server-0.json ]] || fail "ssp2: the server's summary did not come back"
grep -q 'FAILED\|failed' "$summary" && fail "a run failed"
ls /tmp | grep -q "^gradsync-slurm-slurmtest-" && fail "the tasks' staging folders were left behind"
echo "PASS: Slurm jobs (bsp, all-reduce, mpirun in sbatch, PyTorch workers) and gradsync-run --slurm"
