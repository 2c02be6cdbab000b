// Cluster identity helpers shared by the binaries: roles, names of nodes, Slurm's variables.
// (The rendezvous itself is SchedulerClient; the scheduler lives in server/.)
#pragma once

#include <string>

#include "gradsync.pb.h"
#include "train_config.pb.h"

namespace gradsync {

// "server 1 (127.0.0.1:40211)", "worker 3", "scheduler".
std::string NodeName(const wire::NodeInfo& node);
std::string RoleName(wire::Role role);

// The rank Slurm gives this task (SLURM_PROCID), or -1 when not under Slurm. Binaries call this
// when --rank / GRADSYNC_RANK is not given; libraries never read the environment.
int SlurmRank();
// SLURM_NTASKS, or -1.
int SlurmTasks();

// A worker that joins a job (not local mode) without --rank / GRADSYNC_RANK takes the rank a
// cluster launcher gave its process: SLURM_PROCID (Slurm), else RANK (torchrun and PyTorch's
// launchers); neither: the scheduler assigns one. Called where the flags are parsed
// (gradsync-worker, the Python frontend), after Validate().
void TakeLauncherRank(const config::TrainConfig& train, config::WorkerProcess* process);

}  // namespace gradsync
