// RankFromLaunchers: the rank of the innermost launcher, the nested launches people use, and one
// clear error for junk or for two launchers that disagree on the same world.
#include "common/config/cluster.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace gradsync {
namespace {

using Vars = std::map<std::string, std::string>;

Result<std::optional<LauncherRank>> Rank(const Vars& vars) {
  return RankFromLaunchers([&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// "launcher rank/size local", or the error's message.
std::string Said(const Vars& vars) {
  auto r = Rank(vars);
  if (!r.ok()) return "error: " + r.status().message();
  if (!*r) return "none";
  const LauncherRank& l = **r;
  return l.launcher + " " + std::to_string(l.rank) + "/" + std::to_string(l.size) + " local " + std::to_string(l.local_rank) +
         "/" + std::to_string(l.local_size);
}

TEST(LauncherRankTest, EachLauncherAlone) {
  EXPECT_EQ(Said({}), "none");
  EXPECT_EQ(Said({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}}),
            "torchrun 2/4 local 0/2");
  EXPECT_EQ(Said({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
            "Open MPI 3/4 local 1/2");
  EXPECT_EQ(Said({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}}),
            "MPI (PMI) 1/2 local 1/2");
  EXPECT_EQ(Said({{"SLURM_PROCID", "5"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "6"}, {"SLURM_NTASKS", "9"},
                  {"SLURM_LOCALID", "1"}}),
            "Slurm 5/6 local 1/-1");  // the step's task count, not the job's
  EXPECT_EQ(Said({{"SLURM_PROCID", "5"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "9"}}), "Slurm 5/9 local -1/-1");
  EXPECT_EQ(Said({{"RANK", "1"}}), "torchrun 1/-1 local -1/-1");  // a rank alone, set by hand
}

TEST(LauncherRankTest, NestedLaunchersTakeTheInnermost) {
  // torchrun --nproc-per-node=4 started by srun, one task per node on 2 nodes.
  EXPECT_EQ(Said({{"RANK", "6"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "0"},
                  {"SLURM_STEP_NUM_TASKS", "2"}}),
            "torchrun 6/8 local 2/-1");
  // mpirun inside an sbatch script: the batch shell's SLURM_PROCID=0 (no step) is not a rank.
  EXPECT_EQ(Said({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "2"}}),
            "Open MPI 1/2 local -1/-1");
  // mpirun started by srun -n1: a step of one task around a world of four.
  EXPECT_EQ(Said({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"SLURM_PROCID", "0"},
                  {"SLURM_STEP_ID", "1"}, {"SLURM_STEP_NUM_TASKS", "1"}}),
            "Open MPI 3/4 local -1/-1");
  // srun --mpi=pmi2 direct launch: PMI and Slurm name the same rank.
  EXPECT_EQ(Said({{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"SLURM_PROCID", "2"}, {"SLURM_STEP_ID", "0"},
                  {"SLURM_STEP_NUM_TASKS", "4"}}),
            "MPI (PMI) 2/4 local -1/-1");
}

TEST(LauncherRankTest, TwoLaunchersOfOneWorldThatDisagreeAreAnError) {
  const std::string e = Said({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(e, "error: the launchers disagree on this process's rank: torchrun's RANK=1 of WORLD_SIZE=4 but Open MPI's "
               "OMPI_COMM_WORLD_RANK=2 of OMPI_COMM_WORLD_SIZE=4; unset the variables of the launcher that did not start "
               "this process");
  // A rank of unknown world size is compared too.
  EXPECT_NE(Said({{"RANK", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "4"}}).find("disagree"),
            std::string::npos);
}

TEST(LauncherRankTest, JunkIsOneClearError) {
  EXPECT_EQ(Said({{"RANK", "x"}}), "error: RANK='x' is not a rank or a count");
  EXPECT_EQ(Said({{"RANK", ""}}), "error: RANK='' is not a rank or a count");
  EXPECT_EQ(Said({{"RANK", "-1"}}), "error: RANK='-1' is not a rank or a count");
  EXPECT_EQ(Said({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4x"}}),
            "error: OMPI_COMM_WORLD_SIZE='4x' is not a rank or a count");
  EXPECT_EQ(Said({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
            "error: torchrun's RANK=4 of WORLD_SIZE=4: a rank must be below its world size");
  EXPECT_EQ(Said({{"PMI_RANK", "0"}, {"PMI_SIZE", "0"}}), "error: MPI (PMI)'s PMI_RANK=0 of PMI_SIZE=0: a rank must be below its world size");
}

}  // namespace
}  // namespace gradsync
