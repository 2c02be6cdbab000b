#include "common/config/cluster.h"

#include <array>
#include <cerrno>
#include <cstdlib>
#include <string_view>

#include "common/config/train_config.h"

namespace gradsync {

EnvLookup ProcessEnv() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

std::string LauncherRank::Describe() const {
  return launcher + "'s " + rank_var + "=" + std::to_string(rank) + (size >= 0 ? " of " + size_var + "=" + std::to_string(size) : "");
}

Result<long> EnvNumber(const EnvLookup& env, const char* name, long max) {
  const char* v = env(name);
  if (!v) return -1;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (!*v || *end != '\0' || errno == ERANGE || x < 0 || x > max) {
    return InvalidArgumentError(std::string(name) + "='" + v + "' is not a number from 0 to " + std::to_string(max));
  }
  return x;
}

namespace {

// A launcher's variables, innermost launcher first.
struct LauncherVars {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* size_fallback;  // nullptr: none
  const char* local_rank;
  const char* local_size;
  const char* only_with;      // set only when this variable is set too (nullptr: always)
};
constexpr std::array<LauncherVars, 4> kLaunchers = {{
    {"torchrun", "RANK", "WORLD_SIZE", nullptr, "LOCAL_RANK", "LOCAL_WORLD_SIZE", nullptr},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", nullptr, "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr},
    {"MPI (PMI)", "PMI_RANK", "PMI_SIZE", nullptr, "MPI_LOCALRANKID", "MPI_LOCALNRANKS", nullptr},
    {"Slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "SLURM_STEP_ID"},
}};

// A rank or count from a launcher.
Result<int> EnvCount(const EnvLookup& env, const char* name) {
  if (!name) return -1;
  auto x = EnvNumber(env, name, (1 << 20) - 1);
  if (!x.ok()) return InvalidArgumentError(std::string(name) + "='" + env(name) + "' is not a rank or a count");
  return static_cast<int>(*x);
}

Result<std::optional<LauncherRank>> ReadLauncher(const EnvLookup& env, const LauncherVars& l) {
  if (!env(l.rank) || (l.only_with && !env(l.only_with))) return std::optional<LauncherRank>();
  LauncherRank r;
  r.launcher = l.launcher;
  r.rank_var = l.rank;
  r.size_var = l.size;
  ASSIGN_OR_RETURN(r.rank, EnvCount(env, l.rank));
  ASSIGN_OR_RETURN(r.size, EnvCount(env, l.size));
  if (r.size < 0 && l.size_fallback) {
    r.size_var = l.size_fallback;
    ASSIGN_OR_RETURN(r.size, EnvCount(env, l.size_fallback));
  }
  ASSIGN_OR_RETURN(r.local_rank, EnvCount(env, l.local_rank));
  ASSIGN_OR_RETURN(r.local_size, EnvCount(env, l.local_size));
  if (r.size == 0 || (r.size > 0 && r.rank >= r.size)) {
    return InvalidArgumentError(r.Describe() + ": a rank must be below its world size");
  }
  return std::optional<LauncherRank>(r);
}

}  // namespace

Result<std::optional<LauncherRank>> RankFromLaunchers(const EnvLookup& env) {
  std::optional<LauncherRank> chosen;
  for (const auto& l : kLaunchers) {
    ASSIGN_OR_RETURN(std::optional<LauncherRank> r, ReadLauncher(env, l));
    if (!r) continue;
    if (!chosen) {
      chosen = r;
    } else if (r->rank != chosen->rank && (r->size == chosen->size || r->size < 0 || chosen->size < 0)) {
      return InvalidArgumentError("the launchers disagree on this process's rank: " + chosen->Describe() + " but " +
                                  r->Describe() + "; unset the variables of the launcher that did not start this process");
    }
  }
  return chosen;
}

Status TakeLauncherRank(const config::TrainConfig& train, config::WorkerProcess* process, const EnvLookup& env) {
  if (!JoinsJob(train.mode())) return OkStatus();
  auto r = RankFromLaunchers(env);
  if (!r.ok() && !process->has_rank()) return InvalidArgumentError(r.status().message() + ", or give --rank");
  if (!r.ok() || !*r) return OkStatus();  // a given rank needs no launcher
  if (!process->has_rank()) process->set_rank((*r)->rank);
  if (!process->has_local_rank() && (*r)->local_rank >= 0) process->set_local_rank((*r)->local_rank);
  return OkStatus();
}

}  // namespace gradsync
