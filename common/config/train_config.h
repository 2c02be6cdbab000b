// The run configuration (common/proto/train_config.proto): the mode names, the syntax of the
// settings that are small languages (codecs, stragglers), one Validate() for every
// contradiction, and the job fingerprint.
//
//   config::TrainConfig c;                      // from flags (train_flags.h) or a spec
//   for (const ConfigError& e : Validate(c)) ...   // every contradiction, none when valid
//   const std::string fp = JobFingerprint(c);   // what the workers of one job must agree on
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/base/wait_policy.h"
#include "common/config/codec_spec.h"
#include "common/config/train_names.h"
#include "train_config.pb.h"

namespace gradsync {

// ---- Modes: one name table (lower case, as flags and the wire spell them). ----
const std::string& ModeName(config::Mode mode);  // "" for MODE_UNSPECIFIED
// A TrainConfig field's flag: "error_feedback" -> "--error-feedback".
std::string FlagName(std::string_view field);
Result<config::Mode> ParseMode(std::string_view name);
bool IsPsMode(config::Mode mode);                 // bsp | ssp | asp
bool JoinsJob(config::Mode mode);                 // every mode but local

// The dataset a config trains on: `dataset`, else sparse-logistic for sparse_logreg and
// fashion-mnist for the dense models.
std::string EffectiveDataset(const config::TrainConfig& c);

// Rounds of local steps (sync_every > 0): "local SGD" (outer SGD at rate 1, no momentum: the
// models averaged), else "DiLoCo lr=R momentum=M[ nesterov]".
std::string OuterName(const config::TrainConfig& c);

// Whether communication overlaps computation: --overlap as set, else on unless `oversubscribed`
// (a host of the job runs more workers than it has cores: the communication thread would take
// the cores the workers compute on, and nothing is hidden; measured in bench/README.md,
// "overlap_compare.sh" and "pytorch/compare.py").
bool OverlapOf(const config::TrainConfig& c, bool oversubscribed);

// How the worker's waits wait (common/base/wait_policy.h): --busy-poll-ms. The one place a wait
// setting becomes a WaitPolicy: the PS client's waits and the shared-memory barriers take it.
WaitPolicy WaitPolicyOf(const config::TrainConfig& c);

// ---- Codec specs: common/config/codec_spec.h (CodecSpec, ParseCodecSpec). ----

// ---- Stragglers: none | ms:D | x:F | exp:MEAN_MS | uniform:LO:HI (common/config/straggler.h). ----
struct StragglerSpec {
  enum class Kind { kNone, kFixed, kMultiple, kExponential, kUniform };
  Kind kind = Kind::kNone;
  double a = 0;  // ms (fixed, exp mean, uniform low) or the factor (multiple)
  double b = 0;  // uniform high
};
Result<StragglerSpec> ParseStraggler(const std::string& spec);

// ---- Validation. ----
// How messages name a setting: as gradsync-worker's flag ("--error-feedback", "--mode=ssp") or
// as a spec's field ("error_feedback", "mode SSP").
enum class Naming { kFlags, kSpec };

struct ConfigError {
  std::string field;    // the TrainConfig (or WorkerProcess) field at fault, e.g. "dataset"
  std::string message;  // one line, in the Naming asked for
};

// Every contradiction in `c`, in a fixed order (empty: valid). Checks what the settings say
// about each other and their ranges; not what this build or machine can do (CUDA, NCCL).
std::vector<ConfigError> Validate(const config::TrainConfig& c, Naming naming = Naming::kFlags);
// The same plus the process's settings (a scheduler to join, heartbeats, allreduce's bind...).
std::vector<ConfigError> Validate(const config::TrainConfig& c, const config::WorkerProcess& p,
                                  Naming naming = Naming::kFlags);
// "a; b; c": the messages on one line.
std::string JoinErrors(const std::vector<ConfigError>& errors);

// ---- The job fingerprint. ----
// The deterministic serialization of the settings every worker of a job must agree on: `c`
// with every field at its effective value, less the per-process ones (mode and staleness,
// which the scheduler checks itself; threads, data_dir, log/eval cadence, stragglers,
// timeouts, checkpoint location; device, gpu and the PS overlap knobs outside allreduce);
// adam's unused momentum counts as 0, sgd's unused betas and eps not at all.
std::string JobFingerprint(const config::TrainConfig& c);
// The settings in which two fingerprints differ, each side as flags ("--lr=0.05 --batch=32"),
// or the whole fingerprints' lengths when one is not a TrainConfig.
struct FingerprintDifference {
  std::string mine;
  std::string theirs;
};
FingerprintDifference DescribeFingerprintDifference(const std::string& mine, const std::string& theirs);

// A field's value as flags and specs write it: numbers in their shortest exact form (0.02, not
// 0.0199999996), enums by ModeName, bools true|false.
std::string FieldValueText(const google::protobuf::Message& m, const google::protobuf::FieldDescriptor* f);
// The shortest decimal text that reads back as exactly `v`.
std::string ShortestText(double v);
std::string ShortestText(float v);

}  // namespace gradsync
