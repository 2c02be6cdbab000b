// gradsync-worker: trains a model. --mode=local trains in this one process; the parameter
// server (bsp|ssp|asp) and all-reduce modes join a job through --scheduler.
//
// A thin shell: the flags (common/config/train_flags.h's table) become a TrainConfig and a
// WorkerProcess, Validate() reports every contradiction on one line (exit 2), and RunWorker
// (worker/run_worker.h) builds the pieces and trains.
#include "common/config/cluster.h"
#include "common/config/flags.h"
#include "common/config/train_config.h"
#include "common/config/train_flags.h"
#include "common/net/transport.h"
#include "gradsync/config.h"
#include "worker/run_worker.h"

namespace gradsync {
namespace {

int Main(int argc, char** argv) {
  FlagParser flags("gradsync-worker",
                   "Trains a model on one process (--mode=local). Prints per-epoch loss, test "
                   "accuracy and samples/s;\n--out=DIR writes DIR/worker-0.csv.");
  AddWorkerFlags(flags.options());
  auto vm = flags.ParseOrExit(argc, argv);
  config::TrainConfig train;
  config::WorkerProcess process;
  if (Status s = FlagsToConfig(vm, &train, &process); !s.ok()) flags.Fail(s.message());
  if (auto errors = Validate(train, process); !errors.empty()) flags.Fail(JoinErrors(errors));
  if (Status s = TakeLauncherRank(train, &process); !s.ok()) flags.Fail(s.message());
  // What this build can run (Validate checks what the settings say, not the build).
  if (train.device() == "cuda") {
    if (!GRADSYNC_HAVE_CUDA) flags.Fail("--device=cuda: this gradsync-worker was built without CUDA (GRADSYNC_CUDA=OFF or no nvcc)");
    if (train.mode() == config::ALLREDUCE && !GRADSYNC_HAVE_NCCL) {
      flags.Fail("--device=cuda --mode=allreduce needs NCCL, which this build did not find");
    }
  }
  TuneAllocatorForLargeMessages();
  return RunWorker(train, process, flags);
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
