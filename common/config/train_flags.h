// gradsync-worker's flags: one table from flag to TrainConfig / WorkerProcess field
// (common/proto/train_config.proto). The flag is the field's name with '-' for '_'; its type and
// default come from the field, its help from the table. gradsync-worker parses through it and
// gradsync-run writes a spec run's worker command line through it (ConfigToFlags).
//
//   FlagParser flags("gradsync-worker", "...");
//   AddWorkerFlags(flags.options());
//   auto vm = flags.ParseOrExit(argc, argv);
//   config::TrainConfig train;
//   config::WorkerProcess process;
//   if (Status s = FlagsToConfig(vm, &train, &process); !s.ok()) flags.Fail(s.message());
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/config/flags.h"
#include "train_config.pb.h"

namespace gradsync {

struct WorkerFlag {
  const char* flag;    // the flag without "--"; its field is the same with '_' for '-'
  bool process;        // a WorkerProcess field (else a TrainConfig one)
  bool is_switch;      // a bool flag given without a value ("--nesterov")
  const char* help;
};

// The table, in --help order.
const std::vector<WorkerFlag>& WorkerFlags();

// Declares every flag of the table on `options`, each with its field's type and default (shown
// by --help in its shortest exact form: --lr arg (=0.02)).
void AddWorkerFlags(po::options_description& options);

// Sets the fields whose flags were given (on the command line or as GRADSYNC_*; defaults are left
// unset, so has_<field>() means "given"). A value no field can hold (--mode=sync) is an error that
// names the flag.
Status FlagsToConfig(const po::variables_map& vm, config::TrainConfig* train, config::WorkerProcess* process);

// The flags that give `train` its set fields, in the table's order: "--lr=0.05", "--nesterov" (a
// switch set to false is left out). `leave_out`: fields not to write.
std::vector<std::string> ConfigToFlags(const config::TrainConfig& train, std::initializer_list<std::string_view> leave_out = {});

}  // namespace gradsync
