// Experiment specs: loading, checking and turning each run into process flags.
//
//   ASSIGN_OR_RETURN(Experiment e, LoadExperiment("experiments/specs/quick.textproto"));
//   for (const RunPlan& r : e.runs) ... r.worker_args, r.worker_extra[w] ...
//
// The format is protobuf text format over common/proto/experiment.proto; a run's training
// settings are a TrainConfig (`train { ... }`), checked by the same Validate() as
// gradsync-worker's flags and written into worker flags through the same table
// (common/config/train_flags.h). Every error names the file, line and column of the field at fault:
// "quick.textproto:12:3: run 'ssp': staleness applies to mode SSP only".
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/config/train_config.h"
#include "experiment.pb.h"

namespace gradsync {

// One run, resolved: the defaults merged in, checked, and the flags its processes get.
struct RunPlan {
  spec::Run run;                 // merged (defaults, then the run's own fields)
  std::string name;
  config::Mode mode = config::MODE_UNSPECIFIED;  // BSP | SSP | ASP | ALLREDUCE
  int staleness = 0;             // ssp
  int workers = 1;
  int servers = 0;               // 0 for allreduce
  int epochs = 10;
  int64_t batch = 64;            // per worker
  int64_t max_steps = 0;
  std::string compression;       // "none" or the codec spec, with "+ef", "+pull", "+dgc"
  std::string precision = "fp32";  // --precision
  std::string link;              // "" (loopback) or "100mbit" (+ " +Nms")
  std::string straggler;         // "" or "w1 x3" ...
  double timeout_s = 3600;
  bool trace = false;            // every process traced; merged into <run>/trace.json
  std::vector<std::string> worker_args;             // every worker: --run and run.train()'s flags
  std::map<int, std::vector<std::string>> worker_extra;  // per worker rank (stragglers)
  struct Straggle {
    std::string spec;  // --straggle (common/config/straggler.h's syntax)
    uint64_t seed = 0; // --straggle-seed
  };
  std::map<int, Straggle> stragglers;  // per worker rank: what worker_extra gives it
  std::vector<std::string> command;  // the workers' command, run.command() split on white space
                                     // (empty: gradsync-worker); it gets the flags as variables
};

struct Experiment {
  std::string name;
  std::string description;
  std::string path;
  double target_accuracy = 0.85;
  std::vector<RunPlan> runs;
};

// Parses and checks a spec file.
Result<Experiment> LoadExperiment(const std::string& path);
// The same from text (path is only used in messages).
Result<Experiment> ParseExperiment(const std::string& text, const std::string& path);

}  // namespace gradsync
