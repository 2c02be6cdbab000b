// Per-process summaries (common/proto/summary.proto): each shard and worker writes one as
// protobuf JSON when it ends, and the launcher and the experiment report read them through
// ReadProcessSummary, the one reader. Histograms travel as value/count buckets.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/base/status.h"
#include "common/obs/metrics.h"
#include "summary.pb.h"

namespace gradsync {

using Histogram = std::map<int64_t, int64_t>;  // value -> count

// DIR/<role>-<rank>.json
std::string ProcessSummaryPath(const std::string& dir, const std::string& role, int rank);

// Writes `s` to ProcessSummaryPath(dir, s.role(), s.rank()) atomically (never half a file).
Status WriteProcessSummary(const std::string& dir, const summary::ProcessSummary& s);
// This process's peak resident set so far (/proc/self/status VmHWM), in MiB; NaN where /proc has none.
double PeakRssMib();

// Reads and parses one summary; kNotFound when the file does not exist, kDataLoss (naming the
// file) when it does not parse. Unknown fields are ignored, so that an older reader reads a
// newer file.
Result<summary::ProcessSummary> ReadProcessSummary(const std::string& path);

// A worker's reads of table rows over its run (nothing when it read none).
void SetRowReads(const MetricsRow::RowReads& reads, summary::ProcessSummary* s);

void SetHistogram(const Histogram& h, google::protobuf::RepeatedPtrField<summary::Bucket>* out);
// Adds the buckets into `h` (summing over processes).
void AddHistogram(const google::protobuf::RepeatedPtrField<summary::Bucket>& buckets, Histogram* h);

}  // namespace gradsync
