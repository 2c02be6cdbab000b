#include "common/cluster.h"

#include <cstdlib>

#include "common/train_config.h"

namespace gradsync {

std::string RoleName(wire::Role role) {
  switch (role) {
    case wire::SCHEDULER: return "scheduler";
    case wire::SERVER: return "server";
    case wire::WORKER: return "worker";
    default: return "node";
  }
}

std::string NodeName(const wire::NodeInfo& node) {
  std::string s = RoleName(node.role());
  if (node.role() == wire::SCHEDULER) return s;
  if (node.rank() >= 0) s += " " + std::to_string(node.rank());
  if (node.standby()) s += " (standby)";
  if (!node.host().empty()) {
    s += " (" + node.host();
    if (node.port()) s += ":" + std::to_string(node.port());
    s += ")";
  }
  return s;
}

namespace {
int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return (*end == '\0' && x >= 0 && x < (1 << 20)) ? static_cast<int>(x) : -1;
}
}  // namespace

int SlurmRank() { return EnvInt("SLURM_PROCID"); }

void TakeLauncherRank(const config::TrainConfig& train, config::WorkerProcess* process) {
  if (!JoinsJob(train.mode()) || process->has_rank()) return;
  const int rank = SlurmRank() >= 0 ? SlurmRank() : EnvInt("RANK");
  if (rank >= 0) process->set_rank(rank);
}
int SlurmTasks() { return EnvInt("SLURM_NTASKS"); }

}  // namespace gradsync
