#include "common/obs/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace gradsync {

std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    out.push_back(line.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}
namespace {
void PutNumber(std::string* s, double v, const char* fmt) {
  s->push_back(',');
  if (std::isnan(v)) return;
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  s->append(buf);
}
}  // namespace

int64_t HistogramQuantile(const std::map<int64_t, int64_t>& hist, double q) {
  int64_t total = 0;
  for (const auto& [k, v] : hist) total += v;
  if (total == 0) return 0;
  int64_t seen = 0;
  for (const auto& [k, v] : hist) {
    seen += v;
    if (static_cast<double>(seen) >= q * static_cast<double>(total)) return k;
  }
  return hist.rbegin()->first;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t n = v.size();
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n / 2), v.end());
  const double upper = v[n / 2];
  if (n % 2) return upper;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n / 2)) + upper) / 2;
}

Result<MetricsWriter> MetricsWriter::Open(const std::string& path, std::string run, int worker) {
  std::error_code ec;
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return InvalidArgumentError(parent.string() + ": cannot create directory: " + ec.message());
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return InvalidArgumentError(path + ": cannot write: " + std::strerror(errno));
  MetricsWriter w(f, path, std::move(run), worker);
  std::fprintf(f, "%s\n", kHeader);
  return w;
}

MetricsWriter::MetricsWriter(MetricsWriter&& o) noexcept
    : file_(o.file_), path_(std::move(o.path_)), run_(std::move(o.run_)), worker_(o.worker_) {
  o.file_ = nullptr;
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

Status MetricsWriter::Write(const MetricsRow& r) {
  std::string s = run_;
  s += ',' + std::to_string(worker_) + ',' + std::to_string(r.step);
  PutNumber(&s, r.epoch, "%.4f");
  PutNumber(&s, r.wall_s, "%.4f");
  PutNumber(&s, r.loss, "%.6g");
  PutNumber(&s, r.staleness.version_lag, "%.6g");
  PutNumber(&s, r.staleness.clock_staleness, "%.6g");
  s += ',' + std::to_string(r.traffic.bytes_sent) + ',' + std::to_string(r.traffic.bytes_received);
  PutNumber(&s, r.times.compute_ms, "%.4f");
  PutNumber(&s, r.times.comm_ms, "%.4f");
  PutNumber(&s, r.times.wait_ms, "%.4f");
  PutNumber(&s, r.test.loss, "%.6g");
  PutNumber(&s, r.test.accuracy, "%.6f");
  PutNumber(&s, r.test.auc, "%.6f");
  PutNumber(&s, r.times.delay_ms, "%.4f");
  PutNumber(&s, r.times.hidden_ms, "%.4f");
  PutNumber(&s, r.loss_scale, "%.6g");
  s += ',' + std::to_string(r.skipped_steps);
  s += ',' + std::to_string(r.traffic.shm_bytes_sent) + ',' + std::to_string(r.traffic.shm_bytes_received);
  s += ',' + std::to_string(r.table_rows);
  const MetricsRow::RowReads& reads = r.row_reads;
  s += ',' + std::to_string(reads.pulled) + ',' + std::to_string(reads.cached);
  s += reads.max_staleness >= 0 ? ',' + std::to_string(reads.max_staleness) : std::string(",");
  s += ',' + std::to_string(reads.saved_bytes);  // last: a row never ends in an empty field
  s += '\n';
  if (std::fwrite(s.data(), 1, s.size(), file_) != s.size()) {
    return UnavailableError(path_ + ": write failed: " + std::strerror(errno));
  }
  // Whole rows reach the file as they are written: a launcher follows the run's progress.
  return Flush();
}

Status MetricsWriter::Flush() {
  if (std::fflush(file_) != 0) return UnavailableError(path_ + ": flush failed: " + std::strerror(errno));
  return OkStatus();
}

}  // namespace gradsync
