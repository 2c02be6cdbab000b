#include "common/obs/process_summary.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <google/protobuf/util/json_util.h>

#include "common/base/atomic_file.h"

namespace gradsync {

std::string ProcessSummaryPath(const std::string& dir, const std::string& role, int rank) {
  return dir + "/" + role + "-" + std::to_string(rank) + ".json";
}

double PeakRssMib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;  // kB
  }
  return NAN;
}

Status WriteProcessSummary(const std::string& dir, const summary::ProcessSummary& s) {
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;  // a zero count reads as 0, not as a missing field
  std::string json;
  if (auto st = google::protobuf::util::MessageToJsonString(s, &json, o); !st.ok()) {
    return InternalError("process summary: " + st.ToString());
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // the first process to finish makes --out=DIR
  return WriteFileAtomically(ProcessSummaryPath(dir, s.role(), s.rank()), json);
}

Result<summary::ProcessSummary> ReadProcessSummary(const std::string& path) {
  ASSIGN_OR_RETURN(std::string json, ReadWholeFile(path));
  summary::ProcessSummary s;
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = true;
  if (auto st = google::protobuf::util::JsonStringToMessage(json, &s, o); !st.ok()) {
    return DataLossError(path + ": not a process summary: " + std::string(st.message()));
  }
  return s;
}

void SetHistogram(const Histogram& h, google::protobuf::RepeatedPtrField<summary::Bucket>* out) {
  out->Clear();
  for (const auto& [value, count] : h) {
    summary::Bucket* b = out->Add();
    b->set_value(value);
    b->set_count(count);
  }
}

void AddHistogram(const google::protobuf::RepeatedPtrField<summary::Bucket>& buckets, Histogram* h) {
  for (const auto& b : buckets) (*h)[b.value()] += b.count();
}

void SetRowReads(const MetricsRow::RowReads& reads, summary::ProcessSummary* s) {
  if (reads.pulled + reads.cached == 0) return;
  s->set_rows_pulled(reads.pulled);
  s->set_cache_hits(reads.cached);
  s->set_cache_saved_bytes(static_cast<int64_t>(reads.saved_bytes));
  s->set_max_read_staleness(reads.max_staleness);
}

}  // namespace gradsync
