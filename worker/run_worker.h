// Builds a worker from its configuration and runs it: the data, the model (CPU or CUDA), the
// job it joins (the scheduler, the ring, the PS client) and the trainer of its mode.
//
//   if (auto errors = Validate(train, process); !errors.empty()) flags.Fail(JoinErrors(errors));
//   return RunWorker(train, process, flags);
#pragma once

#include "common/config/flags.h"
#include "common/config/train_config.h"

namespace gradsync {

// `train` and `process` must have passed Validate(). Returns the exit code: 0 trained, 1 failed
// (one error line, the scheduler told), 2 a setting this build or machine cannot run (through
// flags.Fail) or the scheduler's refusal (e.g. settings that differ from the job's).
int RunWorker(const config::TrainConfig& train, const config::WorkerProcess& process, const FlagParser& flags);

}  // namespace gradsync
