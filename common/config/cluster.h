// The rank a cluster launcher (Slurm, mpirun / mpiexec, torchrun) gave this process, and the
// environment it is read from. (Node names are common/net/control/node.h's.)
// (The rendezvous itself is SchedulerClient; the scheduler lives in server/.)
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "common/base/status.h"
#include "train_config.pb.h"

namespace gradsync {

// Reads one environment variable (nullptr: unset). std::getenv in the binaries; tests pass a map.
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup ProcessEnv();

// The number in variable `name`: -1 when unset; an error naming it when set but not a number from
// 0 to max.
Result<long> EnvNumber(const EnvLookup& env, const char* name, long max);

// One launcher's word on where this process sits in the job.
struct LauncherRank {
  std::string launcher;   // "torchrun", "Open MPI", "MPI (PMI)", "Slurm"
  std::string rank_var;   // the variables it was read from, for messages
  std::string size_var;
  int rank = -1;
  int size = -1;          // -1: the launcher did not say
  int local_rank = -1;    // rank among this host's processes, -1: not said
  int local_size = -1;    // processes on this host, -1: not said
  std::string Describe() const;  // "torchrun's RANK=1 of WORLD_SIZE=4"
};

// The rank of the innermost launcher that gave one, by this precedence (a launcher started
// inside another sets its own variables and inherits the outer one's):
//   1. torchrun and PyTorch's launchers: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   2. Open MPI's mpirun / mpiexec:      OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   3. MPICH / Intel MPI (Hydra), PMI:   PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
//   4. Slurm, inside a job step (srun):   SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS),
//                                         SLURM_LOCALID; a batch script's SLURM_PROCID (no
//                                         SLURM_STEP_ID) is not a task's rank and is ignored.
// nullopt when none is set. An error (naming the variables) when a set rank or size is not a
// number, a rank is not below its size, or two launchers disagree: both give a rank for worlds of
// the same size (or one of unknown size) and the ranks differ. Nested launchers (torchrun under
// srun, mpirun inside an sbatch script) describe worlds of different sizes and do not disagree.
Result<std::optional<LauncherRank>> RankFromLaunchers(const EnvLookup& env);

// A worker that joins a job (not local mode) without --rank / GRADSYNC_RANK takes its launcher's
// rank (RankFromLaunchers); none: the scheduler assigns one. Without --local-rank it takes the
// launcher's rank on the host too (it picks the GPU), also when --rank was given. Called where
// the flags are parsed (gradsync-worker, the Python frontend), after Validate(). Fails when the
// launchers disagree and no --rank was given.
Status TakeLauncherRank(const config::TrainConfig& train, config::WorkerProcess* process,
                        const EnvLookup& env = ProcessEnv());

}  // namespace gradsync
